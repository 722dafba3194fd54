"""Suite benchmark: where the test suite's time goes, one process against a worker per core.

Runs the suite (or the part `-m MARKER` selects) twice in this checkout, each in a fresh
pytest: once in one process (`-p no:xdist`) and once as the README runs it (`-n auto --dist
worksteal`: a worker per core, each worker's torch on its share of the cores). For each it
records the wall time and the CPU-seconds of pytest and every process it started, and from
pytest's JUnit XML the seconds of each test file. Prints the files that take longest, each
mode's wall and CPU time, and their ratios:

    python benchmarks/bench_suite.py [-m "not slow"] [--top 15] [--json]

The whole suite takes about 20 minutes in all on two cores (about 12 in one process, 8 with
the workers); `-m "not slow"` about 5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "one process": ["-p", "no:xdist"],
    "-n auto": ["-n", "auto", "--dist", "worksteal"],
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_suite(flags: list[str], marker: str | None, report: Path) -> dict:
    """One pytest in a child: its wall time, CPU-seconds (it and everything it started and
    waited for), exit status and seconds by test file."""
    argv = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", *flags]
    argv += ["--junitxml", str(report)] + (["-m", marker] if marker else [])
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    by_file: Counter[str] = Counter()
    tests = 0
    for case in ET.parse(report).iter("testcase"):
        by_file[case.get("classname", "?").replace(".", "/") + ".py"] += float(case.get("time", 0))
        tests += 1
    return {"code": done.returncode, "wall_s": wall, "cpu_s": cpu, "tests": tests, "files": by_file}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", dest="marker", help='a marker expression, e.g. "not slow"')
    parser.add_argument("--top", type=int, default=15, help="files to list (default 15)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env_cores = len(os.sched_getaffinity(0))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in MODES.items():
            results[name] = run_suite(flags, args.marker, Path(tmp) / f"{len(results)}.xml")
    one, pool = results["one process"], results["-n auto"]
    summary = {
        "marker": args.marker,
        "cores": env_cores,
        "modes": {
            name: {k: r[k] for k in ("code", "wall_s", "cpu_s", "tests")}
            for name, r in results.items()
        },
        "wall_ratio": one["wall_s"] / pool["wall_s"],
        "cpu_ratio": one["cpu_s"] / pool["cpu_s"],
        "files": [
            {"file": f, "one_process_s": s, "workers_s": pool["files"].get(f, 0.0)}
            for f, s in one["files"].most_common(args.top)
        ],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"suite{f' -m {args.marker!r}' if args.marker else ''} on {env_cores} cores")
        print(f"{'file':<44} {'one process':>12} {'-n auto':>10}  (seconds in tests)")
        for row in summary["files"]:
            print(f"{row['file']:<44} {row['one_process_s']:>12.1f} {row['workers_s']:>10.1f}")
        for name, r in summary["modes"].items():
            print(
                f"{name:<12} wall {r['wall_s']:7.1f} s  CPU {r['cpu_s']:7.1f} s  "
                f"{r['tests']} tests, exit {r['code']}"
            )
        print(f"one process / -n auto: wall {summary['wall_ratio']:.2f}x, ", end="")
        print(f"CPU {summary['cpu_ratio']:.2f}x")
    return 0 if all(r["code"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
