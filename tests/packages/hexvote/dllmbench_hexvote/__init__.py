"""A third-party package written against dllmbench's public API only (docs/plugin-authors.md):

- `hexvote`: HEX, n samples spread over block lengths, each row with its own sampler setting;
- `cutsearch`: a PRM-pruned search that declares its cuts, so the report gives it removal risk
  and ROC-AUC without any change to dllmbench.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dllmbench.hookspecs import hookimpl
from dllmbench.interfaces import Evidence


@dataclass(frozen=True)
class HexVoteConfig:
    n: int = 4
    blocks: str = "1/5"  # block lengths, "/"-separated


class HexVote:
    """n samples, sample i committed in blocks of blocks[i mod len(blocks)]."""

    Config = HexVoteConfig
    cost_formula = "denoise: n·T"
    prefix_field = "n"
    scorers = ()

    def __init__(self, **config):
        self.config = HexVoteConfig(**config)

    def cost(self, total_steps):
        return {"denoise": self.config.n * total_steps}

    def pool_size(self):
        return self.config.n

    def pool_scores(self):
        return frozenset()

    def evidence(self):
        return Evidence(nested="n")

    async def search(self, problem, ops):
        blocks = [int(b) for b in self.config.blocks.split("/")]
        settings = [{"block_length": blocks[i % len(blocks)]} for i in range(self.config.n)]
        rows = ops.start(problem, copies=self.config.n, settings=settings)
        rows = await ops.denoise(rows)
        return ops.pool(rows)


@dataclass(frozen=True)
class CutSearchConfig:
    k: int = 4
    every: int = 4
    scorer: str = "prm"


class CutSearch:
    """k children per segment, the PRM's best one kept; the last segment keeps all k."""

    Config = CutSearchConfig
    cost_formula = "denoise: k·T; score:<scorer>: k·ceil(T / every)"
    prefix_field = None

    def __init__(self, **config):
        self.config = CutSearchConfig(**config)
        self.scorers = (self.config.scorer,)

    def cost(self, total_steps):
        c = self.config
        return {
            "denoise": c.k * total_steps,
            f"score:{c.scorer}": c.k * math.ceil(total_steps / c.every),
        }

    def pool_size(self):
        return self.config.k

    def pool_scores(self):
        return frozenset(self.scorers)

    def evidence(self):
        return Evidence(cuts=self.config.scorer)

    async def search(self, problem, ops):
        c = self.config
        info = {"step": [], "mask": [], "scores": [], "parent": [], "kept": []}
        rows = ops.start(problem, copies=c.k)
        parents = [-1] * c.k
        segments = ops.segments(c.every)
        for s, steps in enumerate(segments):
            rows = await ops.denoise(rows, steps)
            scores = await ops.score(rows, c.scorer)
            last = s == len(segments) - 1
            kept = list(range(c.k)) if last else [int(np.argmax(scores))]
            info["step"].append(int(rows.steps[0]))
            info["mask"].append([round(float(m), 6) for m in ops.mask_ratio(rows)])
            info["scores"].append([round(float(v), 6) for v in scores])
            info["parent"].append(parents)
            info["kept"].append(kept)
            if last:
                return ops.pool(rows, scores={c.scorer: np.asarray(scores)}, info=info)
            rows = rows.take(kept).repeat(c.k)
            parents = [kept[0]] * c.k
        raise AssertionError("unreachable")


@hookimpl
def dllmbench_register_strategies(register):
    register("hexvote", HexVote)
    register("cutsearch", CutSearch)
