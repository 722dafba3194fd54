"""Temporal Self-Consistency Voting: a vote over the answers a sample predicts along its steps.

Wang et al., "Time Is a Feature: Exploiting Temporal Dynamics in Diffusion Language Models",
arXiv 2508.09138. At every denoising step the sampler's forward already predicts a token at
every masked position (x0, before it chooses which to commit); decoded with the committed
tokens, that is a whole answer. The method tallies the answer of each step's prediction with
a weight w(s) and returns the answer with the largest tally:

    rows ← ops.start(problem, copies=n, predictions=True)
    for s in 0 … T − 1:
        rows ← denoise(rows, one step)
        pool += ops.predictions(rows), each with weight w(s)
    return ops.pool(pool, weights)        # weighted_majority:by=weight is the vote

with w(s) = 1 (`fixed`), (s + 1)/T (`linear`) or exp(α·s/T) (`exp`). The predictions come
from the forwards the samples run anyway: no extra forward, but the head at every masked
position (not only where a step may commit), which each step is charged. With the `oracle`
selector the same pool gives the paper's ever-pass rate. The last step's prediction is the
sample itself, so the final answer is always among those tallied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem, Rows

Weighting = Literal["fixed", "linear", "exp"]
WEIGHTINGS: tuple[str, ...] = ("fixed", "linear", "exp")


@dataclass(frozen=True)
class TemporalConfig:
    n: int = 1  # samples (the paper: one); their predictions are pooled into one vote
    weighting: Weighting = "exp"  # w(s): fixed 1, linear (s + 1)/T, exp exp(alpha·s/T)
    alpha: float = 5.0  # the exponential weighting's rate

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be fixed, linear or exp, got {self.weighting!r}")
        alpha = self.alpha
        number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
        if not (number and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number (e.g. 5), got {alpha!r}")


def step_weight(weighting: str, alpha: float, step: int, total_steps: int) -> float:
    """w(s) of the prediction made at step s (0-based) of T."""
    if weighting == "fixed":
        return 1.0
    if weighting == "linear":
        return (step + 1) / total_steps
    return math.exp(alpha * step / total_steps)


class Temporal:
    """n samples; every step's prediction of each is a candidate weighted by its step."""

    Config: ClassVar[type] = TemporalConfig
    cost_formula: ClassVar[str] = "denoise: n·T (the head at every masked position)"
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1},
        {"n": 3, "weighting": "linear"},
        {"n": 2, "weighting": "fixed"},
    ]
    prefix_field: ClassVar[str | None] = None  # n·T candidates: pools of n do not nest by n
    reads_predictions: ClassVar[bool] = True
    scorers: tuple[str, ...] = ()

    def __init__(self, **config):
        self.config = self.Config(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        """denoise: n·T"""
        return {"denoise": self.config.n * total_steps}

    def evidence(self) -> Evidence:
        # candidates are predictions, not samples: nothing the pooled curves may read as
        # independent draws
        return Evidence()

    def pool_size(self) -> int:
        """The rows denoised at once (the pool holds a prediction of each per step)."""
        return self.config.n

    def pool_size_at(self, total_steps: int) -> int:
        return self.config.n * total_steps

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    def weight(self, step: int, total_steps: int) -> float:
        return step_weight(self.config.weighting, self.config.alpha, step, total_steps)

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        rows = ops.start(problem, copies=self.config.n, predictions=True)
        made: list[Rows] = []
        weights: list[float] = []
        while not all(rows.finished):
            before = rows.steps
            rows = await ops.denoise(rows, 1)
            # each row that stepped predicted its canvas at the step it stood at
            moved = [i for i, s in enumerate(before) if rows.predicted[i] == s]
            if moved:
                made.append(ops.predictions(rows.take(moved)))
                weights += [self.weight(before[i], rows.totals[i]) for i in moved]
        return ops.pool(Rows.concat(*made), weights=np.array(weights, dtype=np.float64))


@hookimpl
def dllmbench_register_strategies(register):
    register("temporal", Temporal)
