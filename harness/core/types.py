"""Core value types: problems, rows of canvases, pools and candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dllmbench.core.keys import row_key


@dataclass(frozen=True)
class Problem:
    """One task item. `gold` is only ever read by the task's grader and by ceilings."""

    id: str
    question: str
    gold: Any
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Prompt:
    """What a task asks the model: chat messages, or raw text for a plain prompt."""

    messages: tuple[dict[str, str], ...] = ()
    text: str | None = None

    @property
    def is_chat(self) -> bool:
        return self.text is None


Lineage = tuple[int, ...]
Owners = tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Rows:
    """A batch of canvases of one problem, each with its own step, key, lineage and owners.

    A canvas is the prompt followed by `gen_length` generated positions. The key of a row is
    derived from (seed, problem id, stream, lineage), so two rows with the same lineage in the
    same stream draw the same noise in every method of the run.
    """

    problem: Problem
    seed: int
    stream: str
    prompt_len: int
    tokens: torch.Tensor  # [n, canvas_len], long
    steps: tuple[int, ...]
    lineage: tuple[Lineage, ...]
    owners: tuple[Owners, ...]

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if not (len(self.steps) == len(self.lineage) == len(self.owners) == n):
            raise ValueError("Rows: tokens, steps, lineage and owners differ in length")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def rng_keys(self) -> tuple[int, ...]:
        """Each row's noise key, from (seed, problem id, stream, lineage)."""
        return tuple(
            row_key(self.seed, self.problem.id, self.stream, path) for path in self.lineage
        )

    def take(self, index: int | Sequence[int] | np.ndarray) -> Rows:
        """The rows at `index` (an int or a sequence), lineage unchanged."""
        idx = [int(index)] if np.isscalar(index) else [int(i) for i in index]
        return replace(
            self,
            tokens=self.tokens[idx].clone(),
            steps=tuple(self.steps[i] for i in idx),
            lineage=tuple(self.lineage[i] for i in idx),
            owners=tuple(self.owners[i] for i in idx),
        )

    def repeat(self, k: int) -> Rows:
        """Each row becomes k children; child j extends its parent's lineage with j."""
        if k < 1:
            raise ValueError(f"repeat needs k >= 1, got {k}")
        n = len(self)
        parents = [i for i in range(n) for _ in range(k)]
        return replace(
            self,
            tokens=self.tokens.repeat_interleave(k, dim=0),
            steps=tuple(self.steps[i] for i in parents),
            lineage=tuple(self.lineage[i] + (j,) for i in range(n) for j in range(k)),
            owners=tuple(self.owners[i] for i in parents),
        )

    def fork(self) -> Rows:
        """Give every row a fresh key: row i extends its lineage with i."""
        return replace(self, lineage=tuple((*path, i) for i, path in enumerate(self.lineage)))

    def owned_by(self, owners: Sequence[Owners]) -> Rows:
        """The same rows charged to other owners."""
        return replace(self, owners=tuple(tuple(o) for o in owners))

    def advanced(self, tokens: torch.Tensor, steps: Sequence[int]) -> Rows:
        return replace(self, tokens=tokens, steps=tuple(int(s) for s in steps))


@dataclass
class Pool:
    """Final candidates of one strategy run, with any scores already computed on them."""

    rows: Rows
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    weights: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def prefix(self, n: int) -> Pool:
        """The first n candidates (pools of prefix-shareable strategies nest)."""
        w = None if self.weights is None else self.weights[:n]
        return Pool(
            self.rows.take(range(n)), {k: v[:n] for k, v in self.scores.items()}, w, dict(self.info)
        )


@dataclass(frozen=True)
class Candidate:
    """What a selector sees of one candidate: never its label."""

    index: int
    text: str
    answer: str | None
    answer_key: Any  # hashable; equal keys mean equal answers; None when invalid
    lineage: Lineage
    scores: dict[str, float]
    weight: float | None = None
