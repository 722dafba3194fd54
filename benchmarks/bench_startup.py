"""Start-up benchmark: how long the command line takes to answer when it runs no model.

Times `dllmbench --help`, `--version`, `run --help`, a bad flag, `status RUN_DIR` and
`merge RUN_DIR` (on a small finished run of the test doubles, made first), each in a fresh
process, the median of `--repeats` runs. For scale, in the same run: each command again with
torch imported first (what every one of them paid while the command line imported torch
eagerly), `python -c 'import torch'` alone, and the interpreter's own start (`python -c
pass`). Prints seconds and ratios:

    python benchmarks/bench_startup.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# a small finished run on the doubles: every file `status` and `merge` read, in seconds
TOY_RUN = [
    "run",
    "--task",
    "toy_sum:size=4",
    "--backbone",
    "toy",
    "--scorer",
    "orm=toy:partial=false",
    "--steps",
    "8",
    "--gen-length",
    "5",
    "--methods",
    "vanilla,majority,orm_rerank,oracle",
    "--budget",
    "72",
    "--resamples",
    "200",
]
# `main(argv)` in a fresh interpreter, optionally after importing torch (the old start-up)
CALL = "import sys{torch}; from dllmbench.cli import main; sys.exit(main(sys.argv[1:]))"


def commands(run_dir: Path) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "--version": ["--version"],
        "run --help": ["run", "--help"],
        "a bad flag": ["run", "--no-such-flag"],
        "status RUN_DIR": ["status", str(run_dir)],
        "merge RUN_DIR": ["merge", str(run_dir)],
    }


def seconds(argv: list[str], repeats: int, env: dict[str, str]) -> float:
    """The median wall time of `argv` in a fresh process, output discarded."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def toy_run(folder: Path, env: dict[str, str]) -> Path:
    out = folder / "run"
    code = (
        f"from dllmbench.cli import main; raise SystemExit(main({[*TOY_RUN, '--out', str(out)]!r}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
    return out


def measure(repeats: int) -> dict[str, object]:
    env = {**os.environ, "DLLMBENCH_PLUGIN_MODULES": "dllmbench.testing.doubles", "COLUMNS": "80"}
    python = [sys.executable, "-c"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = toy_run(Path(tmp), env)
        floor = seconds([*python, "pass"], repeats, env)
        torch = seconds([*python, "import torch"], repeats, env)
        rows = []
        for name, argv in commands(run_dir).items():
            now = seconds([*python, CALL.format(torch=""), *argv], repeats, env)
            before = seconds([*python, CALL.format(torch=", torch"), *argv], repeats, env)
            rows.append({"command": name, "seconds": now, "with_torch_first": before})
    return {
        "repeats": repeats,
        "python_pass": floor,
        "import_torch": torch,
        "commands": rows,
    }


def show(found: dict) -> None:
    torch = found["import_torch"]
    print(
        f"median of {found['repeats']} runs each; python -c pass {found['python_pass']:.3f} s, "
        f"python -c 'import torch' {torch:.3f} s"
    )
    head = ("command", "seconds", "÷ import torch", "with torch first", "speed-up")
    print(f"{head[0]:<16} {head[1]:>8} {head[2]:>15} {head[3]:>17} {head[4]:>9}")
    for row in found["commands"]:
        now, before = row["seconds"], row["with_torch_first"]
        print(
            f"{row['command']:<16} {now:>8.3f} {now / torch:>15.2f} {before:>17.3f} "
            f"{before / now:>8.1f}×"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (median)")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = parser.parse_args()
    found = measure(max(1, args.repeats))
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        show(found)


if __name__ == "__main__":
    main()
