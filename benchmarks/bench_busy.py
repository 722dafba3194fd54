"""The demo's CPU cost on busy cores against idle ones, for each OpenMP spin count.

Runs `dllmbench run --limit N --budget 208` (the shipped demo on its first N problems, every
family) in a child process for each GOMP_SPINCOUNT: OpenMP's own (300000, about 3 ms of
spinning before a waiting thread sleeps), what `dllmbench` sets (30000, about 0.3 ms), its
earlier 3000 (about 30 µs) and none (0, OMP_WAIT_POLICY=PASSIVE), each on idle cores and
beside one process per core that spins for the whole run. Prints each run's wall time,
CPU-seconds (user + system, from wait4) and the denoising forward's rows per second and, per
spin count, busy over idle: the cost of a run should not depend on what else the machine does.

    python benchmarks/bench_busy.py [--limit 4] [--spins 300000,30000,3000,0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPIN = "while True: pass"


def demo(limit: int, spin: str, busy: bool, out: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU-seconds and forward rows per second of one demo run in a child."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1) if busy
    ]
    try:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["GOMP_SPINCOUNT"] = spin
        argv = [sys.executable, "-m", "dllmbench", "run", "--limit", str(limit)]
        argv += ["--budget", "208", "--out", str(out)]
        start = time.perf_counter()
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the demo failed at GOMP_SPINCOUNT={spin} (busy={busy})")
        denoise = json.loads((out / "compute.json").read_text())["total"]["physical"]["denoise"]
        return wall, usage.ru_utime + usage.ru_stime, denoise["rows"] / denoise["seconds"]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--spins", default="300000,30000,3000,0")
    args = parser.parse_args()
    print(f"the demo on {args.limit} problems at 208, {os.cpu_count()} cores")
    print(f"{'spin':>7} {'cores':<5} {'wall s':>7} {'CPU s':>7} {'rows/s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for spin in args.spins.split(","):
            cost = {}
            for busy in (False, True):
                out = Path(tmp) / f"{spin}-{busy}"
                wall, cpu, rate = demo(args.limit, spin, busy, out)
                cost[busy] = cpu
                cores = "busy" if busy else "idle"
                print(f"{spin:>7} {cores:<5} {wall:7.1f} {cpu:7.1f} {rate:7.0f}")
            print(f"{spin:>7} CPU-seconds busy / idle: {cost[True] / cost[False]:.2f}")


if __name__ == "__main__":
    main()
