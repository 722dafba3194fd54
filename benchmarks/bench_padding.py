"""Padding and throughput of the demo on this machine: batches filled to the row cap in length
order (before) against batches cut where they compute the fewest tokens (after,
`Capacity.batches`), both with as many forwards.

Builds the shipped demo (`dllmbench run` without --task/--backbone, its settings from the
command line's defaults), then runs the same problems and methods through the engine twice in
this process, once per way of cutting batches, and prints for each:

- the padding ratio per kind: tokens computed (rows × the widest row of their batch) over the
  rows' own tokens, as compute.json reports it (1.0 is no padding);
- throughput: row-passes (rows of every physical forward, denoising and scoring) per second
  of wall time, end to end;
- forwards per kind.

Both runs do the same rows; the ratios are measured within one run of this script.

    python benchmarks/bench_padding.py [--limit 12] [--budget 208] [--max-problems 32]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from dllmbench.cli import build_parser
from dllmbench.cli.run import run_config
from dllmbench.execution.engine import Capacity, Engine
from dllmbench.running.runner import prepare


class FillRows(Capacity):
    """The cut before: sorted by length, every batch filled to the row cap."""

    def batches(self, lengths: Sequence[int]) -> list[list[int]]:
        return self._filled(sorted(range(len(lengths)), key=lambda i: lengths[i]), lengths)


def measure(prepared, cfg, capacity: Capacity) -> dict:
    task, problems, backbone = prepared.task, prepared.problems, prepared.backbone
    scorers, chosen = prepared.scorers, prepared.plan
    engine = Engine(
        backbone=backbone,
        scorers=scorers,
        task=task,
        methods=[p.method for p in chosen.methods],
        sampling=cfg.sampling,
        capacity=capacity,
    )
    start = time.perf_counter()
    records = engine.run(problems)
    wall = time.perf_counter() - start
    physical = engine.ledger.physical()
    rows = sum(v["rows"] for v in physical.values())
    return {"wall": wall, "rows": rows, "physical": physical, "records": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--budget", type=int, default=208)
    parser.add_argument("--max-problems", type=int, default=32)
    parser.add_argument("--batch-rows", type=int, default=64)
    args = parser.parse_args()
    argv = ["run", "--limit", str(args.limit), "--budget", str(args.budget)]
    cfg = run_config(build_parser().parse_args(argv))
    prepared = prepare(cfg)
    caps = dict(batch_rows=args.batch_rows, problems=args.max_problems)
    before = measure(prepared, cfg, FillRows(**caps))
    after = measure(prepared, cfg, Capacity(**caps))
    assert before["rows"] == after["rows"], "cutting batches must not change the work done"
    decided = [(r["problem"], r["method"], r["selected"], r["answer"]) for r in before["records"]]
    same = decided == [
        (r["problem"], r["method"], r["selected"], r["answer"]) for r in after["records"]
    ]
    print(
        f"demo: {args.limit} problems, {len(prepared.plan.methods)} methods at budget "
        f"{args.budget}, batch rows {args.batch_rows}, {args.max_problems} problems in flight"
    )
    for kind in sorted(after["physical"]):
        b, a = before["physical"][kind], after["physical"][kind]
        print(
            f"{kind:>10}: padding {b['padding']:.4f} -> {a['padding']:.4f}; "
            f"forwards {b['forwards']} -> {a['forwards']}"
        )
    rate_b, rate_a = before["rows"] / before["wall"], after["rows"] / after["wall"]
    print(
        f"throughput: {rate_b:.1f} -> {rate_a:.1f} row-passes/s ({rate_a / rate_b:.2f}x), "
        f"{before['rows']} row-passes each"
    )
    print(f"same selections and answers: {same}")


if __name__ == "__main__":
    main()
