"""`ops`: what a strategy may do to the rows of its problem. Every call is charged here.

`denoise` and `score` are awaitables: they post a request to the engine, which serves the
requests of many problems and methods together in large batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dllmbench.core.errors import PluginError
from dllmbench.core.keys import numpy_rng
from dllmbench.core.ledger import Ledger
from dllmbench.core.types import Owners, Pool, Problem, Rows


@dataclass
class DenoiseRequest:
    rows: Rows
    steps: int


@dataclass
class ScoreRequest:
    rows: Rows
    scorer: str


class _Post:
    """An awaitable that hands a request to the engine and returns the engine's answer."""

    def __init__(self, request: DenoiseRequest | ScoreRequest):
        self.request = request

    def __await__(self):
        return (yield self.request)


def segments(total_steps: int, every: int) -> list[int]:
    """Segment lengths of `every` steps covering T; the last is shorter when every ∤ T."""
    if every < 1:
        raise ValueError(f"segment length must be >= 1, got {every}")
    full, rest = divmod(total_steps, every)
    return [every] * full + ([rest] if rest else [])


class Ops:
    """The operations available to one strategy run on one problem."""

    def __init__(
        self,
        *,
        problem: Problem,
        seed: int,
        total_steps: int,
        canvas: torch.Tensor,
        prompt_len: int,
        ledger: Ledger,
        scorers: dict[str, bool],
        owners: Callable[[int], list[Owners]],
        passes_per_step: int = 1,
    ):
        self.problem = problem
        self.seed = seed
        self.T = total_steps
        self._canvas = canvas
        self._prompt_len = prompt_len
        self._ledger = ledger
        self._scorers = dict(scorers)  # name → reads partial states
        self._owners = owners
        self._passes_per_step = passes_per_step

    def start(self, problem: Problem, copies: int = 1, stream: str = "sample") -> Rows:
        """`copies` fully masked canvases of the problem; copy i has lineage (i,)."""
        if problem.id != self.problem.id:
            raise ValueError("ops.start was given another problem than the one it serves")
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        return Rows(
            problem=problem,
            seed=self.seed,
            stream=stream,
            prompt_len=self._prompt_len,
            tokens=self._canvas.unsqueeze(0).repeat(copies, 1),
            steps=(0,) * copies,
            lineage=tuple((i,) for i in range(copies)),
            owners=tuple(self._owners(copies)),
        )

    def segments(self, every: int) -> list[int]:
        return segments(self.T, every)

    async def denoise(self, rows: Rows, steps: int) -> Rows:
        """Advance every row by `steps` denoising steps (one pass per row per step)."""
        if steps < 1:
            raise ValueError(f"denoise needs steps >= 1, got {steps}")
        if any(s + steps > self.T for s in rows.steps):
            raise ValueError(f"denoise past T={self.T}: rows at steps {sorted(set(rows.steps))}")
        self._ledger.charge(self.problem.id, rows.owners, "denoise", steps * self._passes_per_step)
        return await _Post(DenoiseRequest(rows, steps))

    async def score(self, rows: Rows, scorer: str) -> np.ndarray:
        """One float per row from the named scorer (one pass per row)."""
        if scorer not in self._scorers:
            known = ", ".join(sorted(self._scorers)) or "none"
            raise PluginError(
                f"a strategy asked for scorer {scorer!r}, which this run lacks "
                f"(scorers: {known}); add it with --scorer {scorer}=PLUGIN"
            )
        if not self._scorers[scorer] and any(s != self.T for s in rows.steps):
            raise PluginError(
                f"scorer {scorer!r} reads final states only, but was asked to score a partial one"
            )
        self._ledger.charge(self.problem.id, rows.owners, f"score:{scorer}", 1)
        return await _Post(ScoreRequest(rows, scorer))

    def pool(
        self,
        rows: Rows,
        scores: dict[str, np.ndarray] | None = None,
        weights: np.ndarray | None = None,
        info: dict[str, Any] | None = None,
    ) -> Pool:
        """The final candidates, with any scores already computed on exactly these states."""
        if any(s != self.T for s in rows.steps):
            raise ValueError("a pool holds final states only; some rows are not at step T")
        return Pool(rows, dict(scores or {}), weights, dict(info or {}))

    def mask_ratio(self, rows: Rows) -> np.ndarray:
        """The fraction of each row's generated positions still masked (free: no pass)."""
        mask_id = int(self._canvas[self._prompt_len])  # a canvas's generated positions are masks
        masked = rows.tokens[:, rows.prompt_len :] == mask_id
        return masked.double().mean(dim=1).cpu().numpy()

    def rng(self, label: str) -> np.random.Generator:
        """A generator keyed by (seed, problem, label): resampling, tie-breaking, ..."""
        return numpy_rng(self.seed, self.problem.id, label)
