"""Core value types: problems, rows of canvases, pools and candidates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dllmbench.core.keys import row_key

if TYPE_CHECKING:  # torch loads when rows are made, not with the types (`dllmbench --help`)
    import numpy as np
    import torch


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
Settings = tuple[tuple[str, Any], ...]  # a row's sampler settings, sorted (name, value) pairs
Edit = tuple[int, tuple[int, ...]]  # a canvas edit: (the row's step, generated positions re-masked)


def settings_of(mapping: Mapping[str, Any] | None) -> Settings:
    """A row's sampler settings in their stored form: sorted, hashable (name, value) pairs,
    numpy's own scalars (a temperature from `np.linspace`) as the Python numbers they hold."""
    return tuple(sorted((str(k), _python(v)) for k, v in (mapping or {}).items()))


def _python(value: Any) -> Any:
    """A numpy scalar of numpy's own type as its Python value; anything else as it is (the
    engine refuses a value of any other type with code of its own)."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return value.item()
    return value


@dataclass(frozen=True, eq=False)
class Rows:
    """A batch of canvases of one problem, each with its own step, key, lineage and owners,
    and its own sampler settings, number of steps T and history of canvas edits.

    A canvas is the prompt followed by `gen_length` generated positions. The key of a row is
    derived from (seed, problem id, stream, lineage), so two rows with the same lineage in the
    same stream draw the same noise in every method of the run. `settings` holds, per row, the
    sampler settings it overrides (empty: the backbone's own); `totals` each row's T.
    `confidence` (when the backbone reports it) holds, per generated position, the
    confidence with which its token was committed (NaN while masked). `prediction` (rows
    started with `ops.start(..., predictions=True)`) holds each row's prediction of the whole
    canvas made by its latest step (`predicted`: that step, -1 before any): the token the
    step drew at every position whose logits it computed, the committed and prompt tokens
    kept, the mask elsewhere.
    """

    problem: Problem
    seed: int
    stream: str
    prompt_len: int
    tokens: torch.Tensor  # [n, canvas_len], long
    steps: tuple[int, ...]
    lineage: tuple[Lineage, ...]
    owners: tuple[Owners, ...]
    totals: tuple[int, ...] = ()  # each row's T; () only for rows built outside `ops`
    settings: tuple[Settings, ...] = ()  # () means every row at the backbone's settings
    edits: tuple[tuple[Edit, ...], ...] = ()  # () means no row was edited
    confidence: torch.Tensor | None = None  # [n, canvas_len] float32, NaN where unknown
    prediction: torch.Tensor | None = None  # [n, canvas_len] long: the latest step's x0
    predicted: tuple[int, ...] = ()  # the step each row's prediction was made at (-1: none)

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if not (len(self.steps) == len(self.lineage) == len(self.owners) == n):
            raise ValueError("Rows: tokens, steps, lineage and owners differ in length")
        for name in ("settings", "edits"):
            if not getattr(self, name):
                object.__setattr__(self, name, ((),) * n)
            elif len(getattr(self, name)) != n:
                raise ValueError(f"Rows: {name} has {len(getattr(self, name))} rows, not {n}")
        if self.totals and len(self.totals) != n:
            raise ValueError(f"Rows: totals has {len(self.totals)} rows, not {n}")
        if self.confidence is not None and self.confidence.shape != self.tokens.shape:
            raise ValueError("Rows: confidence and tokens differ in shape")
        if self.prediction is not None:
            if self.prediction.shape != self.tokens.shape:
                raise ValueError("Rows: prediction and tokens differ in shape")
            if not self.predicted:
                object.__setattr__(self, "predicted", (-1,) * n)
            elif len(self.predicted) != n:
                raise ValueError(f"Rows: predicted has {len(self.predicted)} rows, not {n}")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def rng_keys(self) -> tuple[int, ...]:
        """Each row's noise key, from (seed, problem id, stream, lineage)."""
        return tuple(
            row_key(self.seed, self.problem.id, self.stream, path) for path in self.lineage
        )

    def setting(self, i: int) -> dict[str, Any]:
        """Row i's sampler settings (empty: the backbone's own)."""
        return dict(self.settings[i])

    @property
    def finished(self) -> tuple[bool, ...]:
        """Whether each row has taken all of its T steps."""
        if not self.totals:
            raise ValueError("Rows built outside ops have no T per row")
        return tuple(s == t for s, t in zip(self.steps, self.totals, strict=True))

    def take(self, index: int | Sequence[int] | np.ndarray) -> Rows:
        """The rows at `index` (an int or a sequence), lineage unchanged."""
        import numpy as np

        idx = [int(index)] if np.isscalar(index) else [int(i) for i in index]
        return self._rows(idx, lineage=tuple(self.lineage[i] for i in idx))

    def repeat(self, k: int) -> Rows:
        """Each row becomes k children; child j extends its parent's lineage with j."""
        if k < 1:
            raise ValueError(f"repeat needs k >= 1, got {k}")
        n = len(self)
        parents = [i for i in range(n) for _ in range(k)]
        lineage = tuple(self.lineage[i] + (j,) for i in range(n) for j in range(k))
        return self._rows(parents, lineage=lineage)

    def _rows(self, idx: list[int], lineage: tuple[Lineage, ...]) -> Rows:
        import torch

        pick = torch.tensor(idx, dtype=torch.long, device=self.tokens.device)
        return replace(
            self,
            tokens=self.tokens.index_select(0, pick),
            steps=tuple(self.steps[i] for i in idx),
            lineage=lineage,
            owners=tuple(self.owners[i] for i in idx),
            totals=tuple(self.totals[i] for i in idx) if self.totals else (),
            settings=tuple(self.settings[i] for i in idx),
            edits=tuple(self.edits[i] for i in idx),
            confidence=None if self.confidence is None else self.confidence.index_select(0, pick),
            prediction=None if self.prediction is None else self.prediction.index_select(0, pick),
            predicted=tuple(self.predicted[i] for i in idx) if self.predicted else (),
        )

    def fork(self) -> Rows:
        """Give every row a fresh key: row i extends its lineage with i."""
        return replace(self, lineage=tuple((*path, i) for i, path in enumerate(self.lineage)))

    @classmethod
    def concat(cls, *parts: Rows) -> Rows:
        """The rows of several batches of one problem and stream, in order. Lineages must stay
        distinct (two rows with one lineage would draw the same noise)."""
        if not parts:
            raise ValueError("Rows.concat needs at least one batch")
        first = parts[0]
        for part in parts[1:]:
            same = (part.problem.id, part.seed, part.stream, part.prompt_len)
            if same != (first.problem.id, first.seed, first.stream, first.prompt_len):
                raise ValueError(
                    "Rows.concat joins rows of one problem, seed, stream and prompt only"
                )
            if part.tokens.shape[1] != first.tokens.shape[1]:
                raise ValueError("Rows.concat joins canvases of one length only")
        lineage = tuple(path for part in parts for path in part.lineage)
        if len(set(lineage)) != len(lineage):
            raise ValueError(
                "Rows.concat would hold two rows with one lineage (the same noise); "
                "fork() or repeat() one batch first"
            )
        if any(bool(p.totals) != bool(first.totals) for p in parts):
            raise ValueError("Rows.concat joins rows started by ops only")
        import torch

        confidence = None
        if all(p.confidence is not None for p in parts):
            confidence = torch.cat([p.confidence for p in parts])  # type: ignore[misc]
        prediction, predicted = None, ()
        if all(p.prediction is not None for p in parts):
            prediction = torch.cat([p.prediction for p in parts])  # type: ignore[misc]
            predicted = tuple(s for p in parts for s in p.predicted)
        return replace(
            first,
            tokens=torch.cat([p.tokens for p in parts]),
            steps=tuple(s for p in parts for s in p.steps),
            lineage=lineage,
            owners=tuple(o for p in parts for o in p.owners),
            totals=tuple(t for p in parts for t in p.totals),
            settings=tuple(s for p in parts for s in p.settings),
            edits=tuple(e for p in parts for e in p.edits),
            confidence=confidence,
            prediction=prediction,
            predicted=predicted,
        )

    def advanced(
        self,
        tokens: torch.Tensor,
        steps: Sequence[int],
        confidence: torch.Tensor | None = None,
        prediction: torch.Tensor | None = None,
        predicted: Sequence[int] = (),
    ) -> Rows:
        """The same rows after denoising (the engine's answer to `ops.denoise`)."""
        return replace(
            self,
            tokens=tokens,
            steps=tuple(int(s) for s in steps),
            confidence=confidence,
            prediction=prediction,
            predicted=tuple(int(s) for s in predicted) if prediction is not None else (),
        )

    def edited(self, tokens: torch.Tensor, edits: Sequence[Edit | None]) -> Rows:
        """The same rows after a canvas edit (`ops.remask`); an edit is added to each row's
        history, None for a row left as it was."""
        history = tuple(
            past if new is None else (*past, new)
            for past, new in zip(self.edits, edits, strict=True)
        )
        confidence = self.confidence
        if confidence is not None:
            confidence = confidence.masked_fill(tokens != self.tokens, float("nan"))
        return replace(self, tokens=tokens, edits=history, confidence=confidence)


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


class ReadOnlyScores(dict):
    """A candidate's scores: a dict that refuses every change (TypeError), yet copies,
    pickles, serialises to JSON and converts with `dataclasses.asdict` like a dict."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a candidate's scores are read-only; copy them with dict(...)")

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyScores, (dict(self),))


@dataclass(frozen=True)
class Candidate:
    """What a selector sees of one candidate: never its label. Read-only: its `scores` are a
    read-only dict (`ReadOnlyScores`), and a selector receives the candidates as a tuple."""

    index: int
    text: str
    answer: str | None
    answer_key: Any  # hashable; equal keys mean equal answers; None when invalid
    lineage: Lineage
    scores: Mapping[str, float]
    weight: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scores", ReadOnlyScores(self.scores))
        object.__setattr__(self, "lineage", tuple(self.lineage))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied (`copy.deepcopy` included) anew through `__post_init__`, so the
        copy's scores are read-only again."""
        fields = (self.index, self.text, self.answer, self.answer_key, self.lineage)
        return (type(self), (*fields, dict(self.scores), self.weight))
