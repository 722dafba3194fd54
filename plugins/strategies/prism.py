"""Prism-style hierarchical trajectory search with self-verification (viiika/Prism:
"Prism: Efficient Test-Time Scaling via Hierarchical Search and Self-Verification for
Discrete Diffusion Language Models", arXiv 2602.01842).

Start n trajectories. In the search window (steps ⌊start·T⌋ … ⌊end·T⌋ − 1, at least one) the
width decays geometrically: before step k the target is max(final, ⌈n · decay^−(k − k_start)⌉),
and `final` before the window's last step. While the
width exceeds the target, every row is scored by `scorer` (the backbone's own yes/no
judgement of its partial answer with the `self` scorer, one pass per row), the best `survivors`
distinct canvases are kept, and each is branched to its share of the target: the survivor
itself, plus copies with `window` of its committed tokens re-masked, drawn among its
3·`window` least confident (a canvas edit, free; the re-decoding is charged). The widths
do not depend on the scores, so the cost is fixed: Σ_k width_k denoising passes plus the
width at each cut in scoring passes. The `final` rows left at T are the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem, Rows


@dataclass(frozen=True)
class PrismConfig:
    n: int = 8  # initial width
    final: int = 2  # width at the end of the search window: the pool
    survivors: int = 2  # distinct canvases kept at a cut
    start: float = 0.1  # the search window, as fractions of T
    end: float = 0.6
    decay: float = 1.5  # the width shrinks by this factor per step of the window
    window: int = 2  # tokens re-masked per branched copy
    scorer: str = "self"

    def __post_init__(self) -> None:
        if min(self.n, self.final, self.survivors, self.window) < 1:
            raise ValueError("n, final, survivors and window must be >= 1")
        if self.final > self.n:
            raise ValueError(f"final={self.final} must not exceed n={self.n}")
        if not 0 <= self.start <= self.end <= 1 or self.decay <= 1:
            raise ValueError("need 0 <= start <= end <= 1 and decay > 1")


def widths(c: PrismConfig, total: int) -> tuple[list[int], list[int]]:
    """(the width denoised at each step k, the width scored at each cut, by step) of a run
    at T = total; a cut happens before step k when the width exceeds the target."""
    first = min(int(total * c.start), total - 1)
    last = max(first + 1, min(int(total * c.end), total))
    width, denoised, cuts = c.n, [], [0] * total
    for k in range(total):
        if first <= k < last:
            target = max(c.final, math.ceil(c.n * c.decay ** -(k - first)))
            if k == last - 1:
                target = c.final  # the window ends at the final width
            if width > target:
                cuts[k] = width
                width = target
        denoised.append(width)
    return denoised, cuts


def shares(target: int, survivors: int) -> list[int]:
    """How many rows each survivor becomes: target split evenly, the first taking the rest."""
    base, rest = divmod(target, survivors)
    return [base + (i < rest) for i in range(survivors)]


class Prism:
    """Hierarchical search: prune by self-verification, branch survivors by partial remasking."""

    Config = PrismConfig
    cost_formula: ClassVar[str] = (
        "denoise: Σ_k width_k; score:<scorer>: the width at each cut (widths fixed by n, "
        "final, start, end, decay)"
    )
    contract_configs: ClassVar[list[dict]] = [
        {"n": 4, "final": 1, "survivors": 1, "window": 1, "scorer": "prm"},
        {"n": 6, "final": 2, "survivors": 2, "start": 0.0, "end": 1.0, "scorer": "prm"},
    ]
    prefix_field: ClassVar[str | None] = None

    def __init__(self, **config):
        self.config = PrismConfig(**config)
        self.scorers = (self.config.scorer,)

    def cost(self, total_steps: int) -> dict[str, int]:
        denoised, cuts = widths(self.config, total_steps)
        return {"denoise": sum(denoised), f"score:{self.config.scorer}": sum(cuts)}

    def pool_size(self) -> int:
        return self.config.final

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    def evidence(self) -> Evidence:
        return Evidence()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        c = self.config
        denoised, cuts = widths(c, ops.T)
        rows = ops.start(problem, copies=c.n, confidence=True)  # branching reads them
        info: dict[str, list] = {"step": [], "scores": [], "kept": []}
        for k in range(ops.T):
            if cuts[k]:
                scores = await ops.score(rows, c.scorer)
                kept = distinct_best(rows, scores, c.survivors)
                info["step"].append(k)
                info["scores"].append([round(float(v), 6) for v in scores])
                info["kept"].append([int(i) for i in kept])
                rows = self.branch(ops, rows.take(kept), denoised[k])
            rows = await ops.denoise(rows, steps=1)
        return ops.pool(rows, info=info)

    def branch(self, ops: Ops, survivors: Rows, target: int) -> Rows:
        """Each survivor becomes its share of `target` rows: itself, then copies with
        `window` of its tokens re-masked among its 3·window least confident."""
        parts = []
        for i, count in enumerate(shares(target, len(survivors))):
            if not count:
                continue
            family = survivors.take(i).repeat(count)
            if count > 1:
                copies = ops.remask(
                    family.take(range(1, count)),
                    least_confident=self.config.window,
                    among=3 * self.config.window,
                    label="prism",
                )
                family = Rows.concat(family.take(0), copies)
            parts.append(family)
        return Rows.concat(*parts)


def distinct_best(rows: Rows, scores: np.ndarray, k: int) -> list[int]:
    """The k best-scored rows, preferring distinct canvases (ties: the lower index)."""
    order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), i))
    seen, kept = set(), []
    for i in order:
        canvas = rows.tokens[i].numpy().tobytes()
        if canvas not in seen:
            seen.add(canvas)
            kept.append(i)
    kept += [i for i in order if i not in kept]
    return kept[: min(k, len(rows))]


@hookimpl
def dllmbench_register_strategies(register):
    register("prism", Prism)
