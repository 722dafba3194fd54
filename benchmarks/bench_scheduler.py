"""Scheduler benchmark: how full the batches are, and what batching buys.

Runs every method family on the toy task with a small batched transformer-like backbone
(one matrix product per forward over the whole batch, per-row keyed noise), once with
batches of one row and once with batches of 64, and prints ratios measured in this run:

- rows per forward (occupancy of a 64-row batch),
- wall-time speed-up of batching,
- share of wall time spent outside the backbone and scorers (scheduler overhead),
- sharing: the denoising passes every method is charged (as if it ran alone) over the rows
  actually computed (nested pools, shared runs, identical rows computed once).

    python benchmarks/bench_scheduler.py [--problems 8] [--steps 16]
"""

from __future__ import annotations

import argparse
import time

import torch

from dllmbench.api.interfaces import StepBatch
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.planner import default_budget, plan
from dllmbench.loading.registry import registry
from dllmbench.testing.doubles import MASK, ToyBackbone, ToyScorer, ToySum


class MatmulBackbone(ToyBackbone):
    """The toy sampler, but each forward costs one batched [rows·L, d] × [d, d] product."""

    def __init__(self, width: int = 512):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.randn(MASK + 1, width, generator=gen)
        self.weight = torch.randn(width, width, generator=gen) / width**0.5

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        length = max(len(t) for t in batch.tokens)
        padded = torch.full((len(batch.tokens), length), MASK, dtype=torch.long)
        for i, t in enumerate(batch.tokens):
            padded[i, : len(t)] = t
        hidden = self.embed[padded]
        for _ in range(4):  # a few layers' worth of work, batched over rows
            hidden = torch.tanh(hidden @ self.weight)
        return super().denoise_step(batch)


def measure(batch_rows: int, problems: int, steps: int) -> dict[str, float]:
    reg = registry()
    methods = [p.method for p in plan(reg, default_budget(steps), steps).methods]
    task = ToySum(size=problems)
    engine = Engine(
        backbone=MatmulBackbone(),
        scorers={"prm": ToyScorer(), "orm": ToyScorer(partial=False)},
        task=task,
        methods=methods,
        sampling=Sampling(steps, 8, "fewshot", 0),
        capacity=Capacity(batch_rows=batch_rows, problems=problems),
    )
    start = time.perf_counter()
    records = engine.run(task.problems("test"))
    wall = time.perf_counter() - start
    phys = engine.ledger.physical()
    inside = sum(v["seconds"] for v in phys.values())
    return {
        "wall": wall,
        "forwards": phys["denoise"]["forwards"],
        "rows": phys["denoise"]["rows"],
        "charged": sum(r["ledger"]["passes"].get("denoise", 0) for r in records),
        "overhead": (wall - inside) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    single = measure(1, args.problems, args.steps)
    batched = measure(64, args.problems, args.steps)
    assert single["rows"] == batched["rows"], "batching must not change the work done"
    print(
        f"row-steps: {batched['rows']}  forwards: batch=1 {single['forwards']}, "
        f"batch=64 {batched['forwards']}"
    )
    print(f"rows per forward at batch 64: {batched['rows'] / batched['forwards']:.1f} of 64")
    print(f"speed-up of batch 64 over batch 1: {single['wall'] / batched['wall']:.2f}x")
    print(
        f"scheduler overhead share: batch=1 {single['overhead']:.1%}, "
        f"batch=64 {batched['overhead']:.1%}"
    )
    print(
        f"sharing: {batched['charged']} denoising passes charged, {batched['rows']} computed "
        f"({batched['charged'] / batched['rows']:.2f}x)"
    )


if __name__ == "__main__":
    main()
