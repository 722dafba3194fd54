"""PRM-guided search (the paper's Algorithm 1), top-M retention and PRM Hybrid.

Segments of `every` steps (the last shorter when every does not divide T). The first segment
starts K independent samples (the same rows as independent sampling's first `every` steps);
in each later one the kept states spawn K children in all. All K are denoised with independent
noise and scored by the PRM, and the best `keep` survive. The final segment either prunes to the
argmax (`final="prune"`) or keeps all K for a selector (`final="keep"`, PRM Hybrid).
Each segment's step, mask ratios, scores, parents and kept children go to the pool's `info`.
Cost: K·T denoising passes plus K scoring passes per segment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem, Rows
from dllmbench.plugins.strategies.ranking import top


@dataclass(frozen=True)
class PRMGuidedConfig:
    k: int = 8  # children denoised per segment
    every: int = 64  # segment length b in steps
    keep: int = 1  # survivors per segment (M); 1 is the paper's top-1
    final: Literal["prune", "keep"] = (
        "prune"  # "prune": return the argmax; "keep": return all K (PRM Hybrid)
    )
    scorer: str = "prm"

    def __post_init__(self) -> None:
        if self.k < 1 or self.every < 1 or self.keep < 1:
            raise ValueError("k, every and keep must be >= 1")
        if self.keep > self.k or self.k % self.keep:
            raise ValueError(f"keep={self.keep} must divide k={self.k}")
        if self.final not in ("prune", "keep"):
            raise ValueError(f"final must be 'prune' or 'keep', got {self.final!r}")


INFO_KEYS = ("step", "mask", "scores", "parent", "kept")


@dataclass
class SegmentLog:
    """What each segment leaves for diagnostics, in `Pool.info`: the step reached, each
    child's mask ratio and score, its parent and the children kept."""

    ops: Ops
    info: dict[str, list] = field(default_factory=lambda: {key: [] for key in INFO_KEYS})

    def segment(
        self, children: Rows, scores: np.ndarray, parents: np.ndarray, kept: np.ndarray
    ) -> None:
        self.info["step"].append(int(children.steps[0]))
        self.info["mask"].append(_rounded(self.ops.mask_ratio(children)))
        self.info["scores"].append(_rounded(scores))
        self.info["parent"].append([int(i) for i in parents])
        self.info["kept"].append([int(i) for i in kept])


def _rounded(values) -> list[float]:
    return [round(float(v), 6) for v in values]


class PRMGuided:
    """K children per segment of `every` steps, scored by the PRM; the best `keep` survive."""

    Config = PRMGuidedConfig
    cost_formula: ClassVar[str] = "denoise: k·T; score:<scorer>: k·ceil(T / every)"
    contract_configs: ClassVar[list[dict]] = [
        {"k": 4, "every": 5},
        {"k": 4, "every": 5, "keep": 2},
        {"k": 4, "every": 5, "final": "keep"},
        {"k": 3, "every": 64},
    ]
    prefix_field: ClassVar[str | None] = None

    def __init__(self, **config):
        self.config = PRMGuidedConfig(**config)
        self.scorers = (self.config.scorer,)

    def cost(self, total_steps: int) -> dict[str, int]:
        c = self.config
        return {
            "denoise": c.k * total_steps,
            f"score:{c.scorer}": c.k * math.ceil(total_steps / c.every),
        }

    def evidence(self) -> Evidence:
        return Evidence(cuts=self.config.scorer)

    def pool_size(self) -> int:
        return self.config.k if self.config.final == "keep" else 1

    def pool_scores(self) -> frozenset[str]:
        return frozenset(self.scorers)

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        c = self.config
        segments = ops.segments(c.every)
        log = SegmentLog(ops)
        children = ops.start(problem, copies=c.k)  # the first segment: K independent samples
        parents = np.full(c.k, -1)  # each child's parent in the previous segment (-1: none)
        for i, steps in enumerate(segments):
            children = await ops.denoise(children, steps)
            scores = await ops.score(children, c.scorer)
            if i == len(segments) - 1:
                kept = np.arange(c.k) if c.final == "keep" else top(scores, 1)
                log.segment(children, scores, parents, kept)
                return ops.pool(children.take(kept), scores={c.scorer: scores[kept]}, info=log.info)
            kept = top(scores, c.keep)
            log.segment(children, scores, parents, kept)
            children = children.take(kept).repeat(c.k // c.keep)
            parents = np.repeat(kept, c.k // c.keep)
        raise AssertionError("unreachable: T >= 1 gives at least one segment")


@hookimpl
def dllmbench_register_strategies(register):
    register("prm_guided", PRMGuided)
