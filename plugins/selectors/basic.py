"""Selectors that pick by position, by a scorer, or at random."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.types import Candidate


class First:
    """The first candidate (Vanilla, and strategies whose pool holds one candidate)."""

    needs: tuple[str, ...] = ()
    ceiling = False
    config = None

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        return 0 if candidates else None


@dataclass(frozen=True)
class ArgmaxConfig:
    scorer: str = "orm"  # the scorer whose highest value wins (ties: the earliest)


class Argmax:
    """Rerank: the candidate the named scorer rates highest."""

    Config = ArgmaxConfig
    contract_configs: ClassVar[list[dict]] = [{"scorer": "orm"}, {"scorer": "prm"}]
    ceiling = False

    def __init__(self, **config):
        self.config = ArgmaxConfig(**config)
        self.needs = (self.config.scorer,)

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        if not candidates:
            return None
        values = np.array([c.scores[self.config.scorer] for c in candidates], np.float64)
        if np.isnan(values).any():
            raise ValueError(f"scorer {self.config.scorer!r} returned NaN")
        return int(np.argmax(values))


class Random:
    """A uniform pick, keyed by (seed, problem, method): a comparator for rerankers."""

    needs: tuple[str, ...] = ()
    ceiling = False
    config = None

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        return int(rng.integers(len(candidates))) if candidates else None


@hookimpl
def dllmbench_register_selectors(register):
    register("first", First)
    register("argmax", Argmax)
    register("random", Random)
