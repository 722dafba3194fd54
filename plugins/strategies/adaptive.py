"""Adaptive-Consistency: majority voting that stops sampling once the vote is settled (Aggarwal,
Madaan, Yang, Mausam, "Let's Sample Step by Step: Adaptive-Consistency for Efficient Reasoning
and Coding with LLMs", arXiv 2305.11860; code Pranjal2041/AdaptiveConsistency,
`adaptive_consistency/stopping_criterias.py` at 899ab565). docs/methods.md details the rule.

    for each round of `round` samples, until n:
        sample the round; vote over every valid answer so far
        stop if P(the leading answer is the majority | votes) >= confidence
    return every sample drawn (a majority vote picks)

The rows are Majority@n's rows (`ops.start(problem, copies=n)`: row i has lineage (i,) and
its key), drawn in order, so where Adaptive-Consistency stops at m rows its pool is the first
m candidates of Majority@n's. Its cost n·T is a cap: rows never drawn are never charged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from scipy.special import betainc

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem, Rows

Criterion = Literal["beta", "dirichlet"]

# the reference's DirichletStoppingCriteria: the five most voted answers (`top_k_elements`),
# and 50,000 Monte Carlo draws (its N for up to five answers)
DIRICHLET_ANSWERS = 5
DIRICHLET_DRAWS = 50_000


@dataclass(frozen=True)
class AdaptiveConfig:
    n: int = 8  # the cap: at most n samples
    # samples per round, the stopping rule checked after each; 4 is the fewest votes that can
    # stop at the default confidence (4 to 0: 31/32), and a round's rows share each forward
    round: int = 4
    confidence: float = 0.95  # stop once P(the leader is the majority) reaches it
    # "beta": the two most voted answers (the reference's default); "dirichlet": the five
    # most voted, and beta below three answers
    criterion: Criterion = "beta"

    def __post_init__(self) -> None:
        if self.n < 1 or self.round < 1:
            raise ValueError(f"n and round must be >= 1, got n={self.n}, round={self.round}")
        if not 0 < self.confidence <= 1:
            raise ValueError(f"confidence must be in (0, 1], got {self.confidence}")


def vote_counts(keys: Sequence[Hashable | None]) -> list[int]:
    """Each valid answer's votes, most first (ties in order of first appearance, as the vote
    breaks them); invalid answers (None) never vote."""
    counts = Counter(key for key in keys if key is not None)
    return sorted(counts.values(), reverse=True)  # sorted() is stable; Counter keeps order


def beta_probability(leader: int, runner_up: int) -> float:
    """P(p > 1/2) for p ~ Beta(leader + 1, runner_up + 1): under a uniform prior, the chance
    that the leading answer beats the second. The reference integrates x^a (1 − x)^b over
    [1/2, 1] and [0, 1] numerically; this is that ratio exactly, I_{1/2}(b + 1, a + 1)."""
    return float(betainc(runner_up + 1, leader + 1, 0.5))


def dirichlet_probability(counts: Sequence[int], rng: np.random.Generator) -> float:
    """P(p_1 > max_{j>1} p_j) for p ~ Dirichlet(counts + 1), counts most first: under a
    uniform prior, the chance that the leading answer is the most likely one. Monte Carlo over
    DIRICHLET_DRAWS draws from `rng`, as the reference estimates it by Monte Carlo too."""
    p = rng.dirichlet(np.asarray(counts, np.float64) + 1.0, size=DIRICHLET_DRAWS)
    return float(np.mean(p[:, 0] > p[:, 1:].max(axis=1)))


def stop_probability(
    counts: Sequence[int], criterion: Criterion, rng: np.random.Generator | None = None
) -> float:
    """The probability the stopping rule compares with `confidence`, from vote counts (most
    first): 0 without a valid answer; beta on the top two; dirichlet on the top five, or beta
    when fewer than three answers got votes (`rng` draws its Monte Carlo)."""
    if not counts:
        return 0.0
    if criterion == "beta" or len(counts) < 3:
        return beta_probability(counts[0], counts[1] if len(counts) > 1 else 0)
    if rng is None:
        raise ValueError("the dirichlet criterion needs a generator for its Monte Carlo")
    return dirichlet_probability(counts[:DIRICHLET_ANSWERS], rng)


class Adaptive:
    """Majority voting over samples drawn in rounds, until the vote is settled or n are
    drawn (Adaptive-Consistency)."""

    Config: ClassVar[type] = AdaptiveConfig
    capped: ClassVar[bool] = True  # cost(T) is a cap: it stops when the vote is settled
    cost_formula: ClassVar[str] = "denoise: ≤ n·T"
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1},
        {"n": 6, "round": 2, "confidence": 0.7},
        {"n": 6, "round": 1, "criterion": "dirichlet", "confidence": 0.8},
    ]
    prefix_field: ClassVar[str | None] = None  # pool sizes depend on the votes: none nest
    scorers: tuple[str, ...] = ()

    def __init__(self, **config: Any):
        self.config = self.Config(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.config.n * total_steps}

    def evidence(self) -> Evidence:
        # Candidate i is row i of the plain samples, but pools neither nest nor keep one size:
        # nothing the report reads by declaration applies, so nothing is declared (a kit
        # looking for plain samples of a fixed size must not pick this strategy)
        return Evidence()

    def pool_size(self) -> int:
        return self.config.n

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        c = self.config
        rows = ops.start(problem, copies=c.n)  # Majority@n's rows; none is charged until drawn
        rng = ops.rng("adaptive")  # the dirichlet criterion's Monte Carlo
        drawn: list[Rows] = []
        keys: list[Hashable | None] = []
        info: dict[str, Any] = {"drawn": [], "stop_probability": [], "settled": False}
        for first in range(0, c.n, c.round):
            part = await ops.denoise(rows.take(range(first, min(first + c.round, c.n))))
            drawn.append(part)
            keys += ops.answers(part)
            probability = stop_probability(vote_counts(keys), c.criterion, rng)
            info["drawn"].append(len(keys))
            info["stop_probability"].append(round(probability, 6))
            if probability >= c.confidence:
                info["settled"] = True
                break
        return ops.pool(Rows.concat(*drawn), info=info)


@hookimpl
def dllmbench_register_strategies(register):
    register("adaptive", Adaptive)
