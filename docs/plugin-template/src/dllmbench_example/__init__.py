"""A resampling search strategy and a best-score selector for dllmbench."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import softmax

from dllmbench.hookspecs import Register, hookimpl
from dllmbench.interfaces import SearchStrategy, Selector
from dllmbench.ops import Ops
from dllmbench.types import Candidate, Pool, Problem


@dataclass(frozen=True)
class ResampleConfig:
    k: int = 4  # particles
    every: int = 32  # steps between checkpoints
    scorer: str = "prm"  # the process scorer read at each checkpoint
    temperature: float = 1.0  # particles are drawn with probability softmax(score / temperature)

    def __post_init__(self) -> None:
        if self.k < 1 or self.every < 1:
            raise ValueError("k and every must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


class Resample:
    """K particles; at each checkpoint but the last, K are drawn again by score."""

    Config = ResampleConfig
    # checked by the contract kit: the defaults, and a short segment length
    contract_configs: ClassVar[list[dict]] = [{}, {"k": 3, "every": 4}]
    prefix_field: ClassVar[str | None] = None  # pools of different sizes do not nest

    def __init__(self, **config):
        self.config = ResampleConfig(**config)
        self.scorers = (self.config.scorer,)

    def cost(self, total_steps: int) -> dict[str, int]:
        """denoise: k·T; score: k·⌈T/every⌉"""
        c = self.config
        return {
            "denoise": c.k * total_steps,
            f"score:{c.scorer}": c.k * math.ceil(total_steps / c.every),
        }

    def pool_size(self) -> int:
        return self.config.k

    def pool_scores(self) -> frozenset[str]:
        return frozenset({self.config.scorer})  # the last checkpoint scores the final particles

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        c = self.config
        particles = ops.start(problem, copies=c.k)
        segments = ops.segments(c.every)
        for i, steps in enumerate(segments):
            particles = await ops.denoise(particles, steps)
            scores = np.asarray(await ops.score(particles, c.scorer), np.float64)
            if i == len(segments) - 1:
                return ops.pool(particles, scores={c.scorer: scores})
            p = softmax(scores / c.temperature)
            drawn = ops.rng(f"resample-{i}").choice(c.k, size=c.k, p=p)  # keyed randomness only
            particles = particles.take(drawn).fork()  # a particle drawn twice gets fresh keys
        raise AssertionError("unreachable: T >= 1 gives at least one segment")


@dataclass(frozen=True)
class BestConfig:
    scorer: str = "orm"  # the scorer whose highest value wins


class Best:
    """The valid candidate the scorer rates highest (ties: the earliest); None if none is valid."""

    Config = BestConfig
    ceiling = False  # never reads labels

    def __init__(self, **config):
        self.config = BestConfig(**config)
        self.needs = (self.config.scorer,)

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        rng: np.random.Generator,
        labels: Sequence[bool] | None = None,
    ) -> int | None:
        valid = [c for c in candidates if c.answer_key is not None]
        if not valid:
            return None
        return max(valid, key=lambda c: (c.scores[self.config.scorer], -c.index)).index


@hookimpl
def dllmbench_register_strategies(register: Register[SearchStrategy]) -> None:
    register("example_resample", Resample)


@hookimpl
def dllmbench_register_selectors(register: Register[Selector]) -> None:
    register("example_best", Best)
