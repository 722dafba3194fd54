"""MBPP grading throughput: programs graded per second, one at a time and in parallel.

Grades the reference solutions of the first N MBPP test problems (each in its own sandbox),
once with `grade` one after another, as the engine did before it graded whole pools, and once
with `grade_many` at 1 worker and at W workers (default: the task's, two per CPU core).
Prints programs per second and the ratio of W workers to 1, measured in this run. Every
reference must pass; a failure is printed.

    python benchmarks/bench_grading.py [--problems 64] [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import time

from dllmbench.loading.registry import registry


def graded(task, items, grade_many: bool) -> tuple[float, int]:
    start = time.perf_counter()
    verdicts = task.grade_many(items) if grade_many else [task.grade(*item) for item in items]
    return time.perf_counter() - start, sum(map(bool, verdicts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1))
    args = parser.parse_args()

    runs = [("grade, one at a time", 1, False), ("grade_many, 1 worker", 1, True)]
    runs.append((f"grade_many, {args.workers} workers", args.workers, True))
    rates = {}
    for label, workers, many in runs:
        task = registry().task("mbpp", workers=workers)  # a fresh task: no cached outcomes
        problems = task.problems("test")[: args.problems]
        items = [(p, p.gold.reference, "") for p in problems]
        seconds, passed = graded(task, items, many)
        rates[label] = len(items) / seconds
        print(
            f"{label:28} {len(items)} programs in {seconds:6.2f} s: "
            f"{rates[label]:6.1f} programs/s ({passed} passed)"
        )
    one, many = rates["grade_many, 1 worker"], rates[runs[-1][0]]
    print(f"{args.workers} workers over 1: {many / one:.2f}x (on {os.cpu_count()} CPU cores)")


if __name__ == "__main__":
    main()
