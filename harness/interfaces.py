"""Typed interfaces of the five plugin kinds.

A plugin implements one of these Protocols; its factory takes keyword configuration (a
dataclass per plugin) and returns the object. The core only talks to these interfaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from dllmbench.types import Candidate, Pool, Problem, Prompt

if TYPE_CHECKING:
    from dllmbench.ops import Ops


@dataclass(frozen=True)
class StepBatch:
    """Rows to advance by one denoising step. Canvases may differ in length."""

    tokens: Sequence[torch.Tensor]  # one 1-D long tensor per row
    prompt_lens: Sequence[int]
    steps: Sequence[int]  # each row's current step t (0-based) of T
    keys: Sequence[int]
    total_steps: int


@dataclass(frozen=True)
class ScoreBatch:
    """Rows to score: partial or final canvases."""

    tokens: Sequence[torch.Tensor]
    prompt_lens: Sequence[int]
    steps: Sequence[int]
    total_steps: int


@runtime_checkable
class Backbone(Protocol):
    """A diffusion LM and its sampler."""

    mask_id: int

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt token ids, formatted the model's way (chat template or raw)."""

    def canvas(self, prompt_ids: Sequence[int], gen_length: int) -> torch.Tensor:
        """The prompt followed by gen_length masks, as a 1-D long tensor."""

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        """One forward over the batch; each row commits tokens by the backbone's rule.

        The noise of a row comes from its key and step only.
        """

    def decode(self, tokens: torch.Tensor, prompt_len: int) -> str:
        """Generated text: up to the first end-of-sequence token, masks removed."""


@runtime_checkable
class Scorer(Protocol):
    """Maps rows to one float each (a logit), higher meaning more likely correct."""

    reads_partial: bool  # True for a process scorer (PRM), False for an outcome scorer (ORM)

    def score(self, batch: ScoreBatch) -> np.ndarray: ...


@runtime_checkable
class SearchStrategy(Protocol):
    """Per-problem search written as a coroutine over `ops`."""

    scorers: tuple[str, ...]  # scorer names it calls
    prefix_field: ClassVar[str | None]  # a size field whose smaller pools are prefixes

    def cost(self, total_steps: int) -> dict[str, int]:
        """Passes per problem by kind (`denoise`, `score:<name>`), declared before running."""

    def pool_size(self) -> int: ...

    def pool_scores(self) -> frozenset[str]:
        """Scorers whose values on the final candidates the returned pool carries."""

    async def search(self, problem: Problem, ops: Ops) -> Pool: ...


@runtime_checkable
class Selector(Protocol):
    """Picks one candidate of a pool; a ceiling reads labels and is never a contender."""

    needs: tuple[str, ...]  # scorers it reads on every candidate
    ceiling: bool

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        rng: np.random.Generator,
        labels: Sequence[bool] | None = None,
    ) -> int | None:
        """Index of the chosen candidate, or None when there is nothing valid to choose."""


@runtime_checkable
class Task(Protocol):
    """Loads problems, formats questions, extracts and grades answers."""

    def splits(self) -> dict[str, int]:
        """Split name → number of problems."""

    def problems(self, split: str) -> list[Problem]: ...

    def prompt(self, problem: Problem, style: str) -> Prompt: ...

    def extract(self, text: str) -> str | None: ...

    def answer_key(self, answer: str) -> Any:
        """A hashable normal form: two answers vote together when their keys are equal."""

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool: ...

    def data_files(self) -> dict[str, str]:
        """Data files read, path → sha256, for the manifest."""


Config = dict[str, Any]
