"""`ops`: what a strategy may do to the rows of its problem.

`denoise` and `score` are awaitables: they post a request to the engine, which serves the
requests of many problems and methods together in large batches and charges every forward to
the ledger as it computes it (passes and FLOPs), so a row that ends early (a confidence
threshold) is charged only the steps it took. `start` may give rows their own sampler
settings and T; `remask` edits canvases (free: the passes that decode the re-masked positions
again are charged as denoising); `answers` reads the rows' extracted answers (free);
`predictions` gives each row's prediction of its canvas at its latest step, as final rows a
pool may hold (free: the forward that made them was charged, with the head it computed).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dllmbench.core.errors import PluginError, UserError
from dllmbench.core.keys import numpy_rng
from dllmbench.core.types import Edit, Owners, Pool, Problem, Rows, settings_of

STEPS = "steps"  # the setting that gives a row its own T


@dataclass
class DenoiseRequest:
    rows: Rows
    steps: tuple[int, ...]  # steps each row takes


@dataclass
class ScoreRequest:
    rows: Rows
    scorer: str


class Posted:
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


def _states(rows: Rows) -> list[bytes]:
    """A digest of each row's state: its tokens, its step, its T and the copy of `ops.start`
    it descends from (its lineage's root, which says whom it is charged to); for a row that
    records its predictions (`ops.start(predictions=True)`), also its prediction and the step
    that made it, which `ops.predictions` hands out as candidates."""
    tokens = rows.tokens.detach().to("cpu").numpy()
    predicted = None
    if rows.prediction is not None:
        predicted = rows.prediction.detach().to("cpu").numpy()
    states = []
    for i in range(len(rows)):
        text = (
            tokens[i].tobytes() + f"{rows.steps[i]}/{rows.totals[i]}/{rows.lineage[i][:1]}".encode()
        )
        if predicted is not None:
            text += b"|" + predicted[i].tobytes() + f"@{rows.predicted[i]}".encode()
        states.append(hashlib.blake2b(text, digest_size=16).digest())
    return states


def _sampler(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A row's settings for the backbone's sampler: all but its T."""
    return {k: v for k, v in settings.items() if k != STEPS}


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
        scorers: dict[str, bool],
        owners: Callable[[int], list[Owners]],
        row_settings: frozenset[str] = frozenset(),
        commit_orders: Mapping[str, tuple[str, ...]] | None = None,
        reopenable: Callable[[torch.Tensor, int, Mapping[str, Any]], torch.Tensor] | None = None,
        check_settings: Callable[[Mapping[str, Any], int], None] | None = None,
        confidences: bool = False,
        answers: Callable[[Rows], list[Hashable | None]] | None = None,
        predictions: bool = False,
    ):
        self.problem = problem
        self.seed = seed
        self.T = total_steps
        self._canvas = canvas
        self._prompt_len = prompt_len
        self._scorers = dict(scorers)  # name → reads partial states
        self._owners = owners
        self.row_settings = frozenset(row_settings) | {STEPS}
        # the commit orders rows may mix, by the setting that picks them (`MixesOrders`)
        self.commit_orders = dict(commit_orders or {})
        self._reopenable = reopenable  # which committed positions the sampler decodes again
        self._check_settings = check_settings
        self._confidences = confidences
        self._predictions = predictions
        self._answers = answers
        self._issued: set[bytes] = set()  # every row state ops gave out (`_states`)
        self._scored: dict[tuple[bytes, str], float] = {}  # what ops.score gave each state

    # -- rows --------------------------------------------------------------------------------
    def start(
        self,
        problem: Problem,
        copies: int = 1,
        stream: str = "sample",
        settings: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        confidence: bool = False,
        predictions: bool = False,
    ) -> Rows:
        """`copies` fully masked canvases of the problem; copy i has lineage (i,).

        `settings` gives the rows sampler settings of their own: one mapping for every copy,
        or one per copy. Only names the backbone can vary per row (`ops.row_settings`) are
        accepted; `steps` gives a row its own T. A row's noise depends only on its key, its
        settings and its step. With `confidence`, the rows record the confidence with which
        each token was committed (`ops.remask(least_confident=...)` reads it); the backbone
        must report it. With `predictions`, each step also keeps the row's prediction of its
        whole canvas (`ops.predictions` reads it; the backbone must report them, and each
        step is charged the head it computes for them)."""
        if problem.id != self.problem.id:
            raise ValueError(
                f"ops.start was given problem {problem.id!r}, but this search serves "
                f"problem {self.problem.id!r}"
            )
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"ops.start needs copies >= 1, got {copies!r}")
        per_row = self._per_row(settings, copies)
        totals = tuple(int(s.get(STEPS, self.T)) for s in per_row)
        rows = Rows(
            problem=problem,
            seed=self.seed,
            stream=stream,
            prompt_len=self._prompt_len,
            tokens=self._canvas.unsqueeze(0).repeat(copies, 1),
            steps=(0,) * copies,
            lineage=tuple((i,) for i in range(copies)),
            owners=tuple(self._owners(copies)),
            totals=totals,
            settings=tuple(settings_of(_sampler(s)) for s in per_row),
            confidence=self._fresh_confidence(copies) if confidence else None,
            prediction=self._fresh_prediction(copies) if predictions else None,
        )
        return self._issue(rows)

    def _fresh_prediction(self, copies: int) -> torch.Tensor:
        if not self._predictions:
            raise UserError(
                "a strategy asked rows to record each step's predictions, which this run's "
                "backbone does not report; use dream, llada or tiny (without cache=prefix|dual)"
            )
        return self._canvas.unsqueeze(0).repeat(copies, 1)

    def _fresh_confidence(self, copies: int) -> torch.Tensor:
        if not self._confidences:
            raise UserError(
                "a strategy asked rows to record commit confidences, which this run's backbone "
                "does not report; use dream, llada or tiny"
            )
        return torch.full((copies, self._canvas.shape[0]), float("nan"), dtype=torch.float32)

    def _per_row(
        self, settings: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, copies: int
    ) -> list[Mapping[str, Any]]:
        """One checked mapping of settings per copy."""
        if settings is None:
            return [{}] * copies
        if isinstance(settings, Mapping):
            per_row = [settings] * copies
        else:
            per_row = list(settings)
            if len(per_row) != copies or not all(isinstance(s, Mapping) for s in per_row):
                raise ValueError(
                    f"ops.start settings: give one mapping, or one mapping per copy ({copies})"
                )
        checked: dict[Any, None] = {}
        for s in per_row:
            key = settings_of(s)
            if key in checked:
                continue
            unknown = sorted(set(s) - self.row_settings)
            if unknown:
                raise UserError(
                    f"a strategy set sampler setting {unknown[0]!r} per row, which this run's "
                    f"backbone cannot vary (it can: {', '.join(sorted(self.row_settings))}); "
                    "run it on a backbone that can, and have the strategy name the settings "
                    "its rows set in sets_per_row(), so that a run leaves it out before it starts"
                )
            total = s.get(STEPS, self.T)
            if isinstance(total, bool) or not isinstance(total, int) or total < 1:
                raise ValueError(f"a row's steps must be an int >= 1, got {total!r}")
            if self._check_settings is not None:
                self._check_settings(_sampler(s), int(total))
            checked[key] = None
        return per_row

    def segments(self, every: int) -> list[int]:
        return segments(self.T, every)

    # -- passes ------------------------------------------------------------------------------
    async def denoise(self, rows: Rows, steps: int | None = None) -> Rows:
        """Advance every row by `steps` denoising steps, or each row to its own T when `steps`
        is None (one pass per row per step, charged as the engine computes it). A row whose
        sampler ended it early (nothing left masked) stands at its T and takes no more steps:
        asking it for `steps` more advances only the others. Rows all at their T (as rows
        that end early may be, on some problems) come back as they are, uncharged."""
        self._own(rows, "ops.denoise")
        if steps is None:
            asked = tuple(t - s for s, t in zip(rows.steps, rows.totals, strict=True))
            if not any(asked):
                return rows
        else:
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise ValueError(f"ops.denoise needs steps >= 1, got {steps!r}")
            ended = self._ended(rows)
            if any(
                s + steps > t and not done
                for s, t, done in zip(rows.steps, rows.totals, ended, strict=True)
            ):
                raise ValueError(
                    f"ops.denoise past T: rows at steps {sorted(set(rows.steps))} of "
                    f"{sorted(set(rows.totals))} asked for {steps} more"
                )
            asked = tuple(0 if done else steps for done in ended)
        return self._issue(await Posted(DenoiseRequest(rows, asked)))

    def _ended(self, rows: Rows) -> list[bool]:
        """Rows at their T with no generated position masked (ended early or on time)."""
        masked = (rows.tokens[:, rows.prompt_len :] == self.mask_id).any(dim=1).tolist()
        return [s >= t and not m for s, t, m in zip(rows.steps, rows.totals, masked, strict=True)]

    async def score(self, rows: Rows, scorer: str) -> np.ndarray:
        """One float per row from the named scorer (one pass per row)."""
        states = self._own(rows, "ops.score")
        if scorer not in self._scorers:  # the strategy's fault (exit status 3)
            known = ", ".join(sorted(self._scorers)) or "none"
            raise ValueError(
                f"ops.score(rows, {scorer!r}) asks for a scorer it may not call here (it may "
                f"call: {known}); declare every scorer search calls in its `scorers`"
            )
        if not self._scorers[scorer] and not all(rows.finished):
            raise PluginError(
                f"scorer {scorer!r} reads final states only, but was asked to score a partial one"
            )
        values = await Posted(ScoreRequest(rows, scorer))
        for state, value in zip(states, np.asarray(values).tolist(), strict=True):
            self._scored[state, scorer] = value
        return values

    def answers(self, rows: Rows) -> list[Hashable | None]:
        """Each final row's answer as the task keys it for voting (`task.answer_key` of the
        extracted answer; None when none was extracted): free, no forward, and never the
        grade. Adaptive sampling reads it to decide when to stop."""
        self._own(rows, "ops.answers")
        if not all(rows.finished):
            raise ValueError("ops.answers reads final states only; some rows are not at their T")
        if self._answers is None:
            raise ValueError("ops.answers is not available outside the engine")
        return self._answers(rows)

    def predictions(self, rows: Rows) -> Rows:
        """Each row's prediction of its whole canvas at its latest step (rows started with
        `ops.start(..., predictions=True)` that have taken a step), as final rows a pool may
        hold: the tokens the step drew at every masked position whose logits it computed,
        the committed and prompt tokens kept. Row i's prediction made at step s (0-based) has
        lineage (*row i's lineage, s) and the row's owners, so predictions of one row at
        different steps join one pool (`Rows.concat`). Free: the forward that made them was
        charged, with the head it computed for them."""
        self._own(rows, "ops.predictions")
        if rows.prediction is None:
            raise ValueError(
                "ops.predictions reads rows started with ops.start(..., predictions=True)"
            )
        early = [i for i, s in enumerate(rows.predicted) if s < 0]
        if early:
            raise ValueError(
                f"ops.predictions: row {early[0]} has taken no step yet, so holds no prediction"
            )
        made = Rows(
            problem=rows.problem,
            seed=rows.seed,
            stream=rows.stream,
            prompt_len=rows.prompt_len,
            tokens=rows.prediction.clone(),
            steps=tuple(rows.totals),
            lineage=tuple((*path, s) for path, s in zip(rows.lineage, rows.predicted, strict=True)),
            owners=rows.owners,
            totals=rows.totals,
            settings=rows.settings,
            edits=rows.edits,
        )
        return self._issue(made)

    # -- free operations ---------------------------------------------------------------------
    def remask(
        self,
        rows: Rows,
        *,
        positions: Sequence[int] | Sequence[Sequence[int]] | None = None,
        sigma: float | None = None,
        least_confident: int | None = None,
        among: int | None = None,
        label: str = "remask",
    ) -> Rows:
        """Re-mask committed generated positions of every row (a canvas edit, free of passes;
        the steps that decode them again are charged). Exactly one policy:

        - `positions`: these generated positions (0 is the first after the prompt), one list
          for every row or one per row;
        - `sigma`: each committed position independently with probability sigma;
        - `least_confident=k`: the k committed positions committed with the least confidence
          (with `among=m`: k of the m least confident, drawn at random).

        Random draws come from (seed, problem, label, row key, step): the same row edited at
        the same step draws the same positions in every method. Each edit joins the row's
        history `(step, positions)`. Only positions the sampler will decode again are picked:
        on a block backbone those of the current block (`ReopensPositions`). A row at its T
        is final: `sigma` and `least_confident` leave it as it is, and `positions` refuses it
        (no step would decode it)."""
        self._own(rows, "ops.remask")
        chosen = [positions is not None, sigma is not None, least_confident is not None]
        if sum(chosen) != 1:
            raise ValueError("ops.remask takes one of positions=, sigma= or least_confident=")
        finished = rows.finished
        wanted: list[Sequence[int]] | None = None  # positions, as one list per row
        if positions is not None:
            per_row = len(positions) > 0 and not np.isscalar(positions[0])
            if per_row and len(positions) != len(rows):
                raise ValueError(
                    f"ops.remask: positions has {len(positions)} lists for {len(rows)} rows; "
                    "give one list for every row, or one per row"
                )
            wanted = list(positions) if per_row else [positions] * len(rows)
            done = [
                i for i, (f, p) in enumerate(zip(finished, wanted, strict=True)) if f and len(p)
            ]
            if done:
                raise ValueError(
                    f"ops.remask: row {done[0]} is at its T and cannot be re-masked (nothing "
                    "decodes it); give it no positions (an empty list), or re-mask rows that "
                    "are not final"
                )
        mask_id = self.mask_id
        gen = rows.tokens[:, rows.prompt_len :]
        committed = gen != mask_id
        picks: list[list[int]] = []
        for i, key in enumerate(rows.rng_keys):
            open_ = committed[i] & ~torch.tensor(finished[i])
            if self._reopenable is not None:
                open_ &= self._reopenable(rows.tokens[i], rows.prompt_len, rows.setting(i))
            free = open_.nonzero().flatten().tolist()
            rng = numpy_rng(self.seed, self.problem.id, "remask", label, key, rows.steps[i])
            mine = None if wanted is None else wanted[i]
            picks.append(self._pick(rows, i, free, rng, mine, sigma, least_confident, among))
        tokens = rows.tokens.clone()
        edits: list[Edit | None] = []
        for i, pick in enumerate(picks):
            if pick:
                tokens[i, [rows.prompt_len + p for p in pick]] = mask_id
            edits.append((rows.steps[i], tuple(pick)) if pick else None)
        return self._issue(rows.edited(tokens, edits))

    def _pick(
        self,
        rows: Rows,
        i: int,
        free: list[int],
        rng: np.random.Generator,
        positions: Sequence[int] | None,
        sigma: float | None,
        least_confident: int | None,
        among: int | None,
    ) -> list[int]:
        """The generated positions of row i that one remask policy re-masks (`positions`:
        this row's), ascending."""
        if positions is not None:
            mine = sorted({int(p) for p in positions})
            width = rows.tokens.shape[1] - rows.prompt_len
            if any(not 0 <= p < width for p in mine):
                raise ValueError(f"ops.remask: positions must lie in 0..{width - 1}")
            committed = set(free)
            return [p for p in mine if p in committed]
        if sigma is not None:
            if not 0 <= sigma <= 1:
                raise ValueError(f"ops.remask: sigma must be in [0, 1], got {sigma}")
            draws = rng.random(len(free))
            return [p for p, u in zip(free, draws, strict=True) if u < sigma]
        k = int(least_confident or 0)
        if k < 0 or (among is not None and among < k):
            raise ValueError("ops.remask: need least_confident >= 0 and among >= least_confident")
        if rows.confidence is None:
            raise ValueError(
                "ops.remask(least_confident=...) needs rows started with "
                "ops.start(..., confidence=True)"
            )
        conf = rows.confidence[i, rows.prompt_len :].double().numpy()
        known = [p for p in free if not np.isnan(conf[p])]
        ranked = sorted(known, key=lambda p: (conf[p], p))[: among if among is not None else k]
        if among is not None and len(ranked) > k:
            ranked = [ranked[j] for j in rng.choice(len(ranked), size=k, replace=False)]
        return sorted(ranked[:k])

    def pool(
        self,
        rows: Rows,
        scores: dict[str, np.ndarray] | None = None,
        weights: np.ndarray | None = None,
        info: dict[str, Any] | None = None,
    ) -> Pool:
        """The final candidates, with any scores already computed on exactly these states."""
        self._own(rows, "ops.pool")
        if not all(rows.finished):
            raise ValueError("a pool holds final states only; some rows are not at their T")
        return Pool(rows, dict(scores or {}), weights, dict(info or {}))

    def returned(self, pool: Pool) -> str | None:
        """What is wrong with the pool a search returned, or None: held to what `ops.pool`
        checks (a Pool built by hand, or tokens changed after it), rows charged to the
        owners of the copy they descend from, and scores that are the values `ops.score` gave
        those very states (a pool's scores are read, never computed again)."""
        try:
            states = self._own(pool.rows, "the pool")
        except ValueError as exc:
            return str(exc)
        if not all(pool.rows.finished):
            return "its pool holds rows that are not at their T"
        rows = pool.rows
        for i, (lineage, owners) in enumerate(zip(rows.lineage, rows.owners, strict=True)):
            root = lineage[0] if lineage else -1
            if root < 0 or tuple(owners) != tuple(self._owners(root + 1)[root]):
                return (
                    f"its pool's candidate {i} is charged to {list(owners)}, not to the owners "
                    "of the copy it descends from: rows are charged as ops.start gave them"
                )
        if not isinstance(pool.scores, dict):
            return f"its pool's scores are a {type(pool.scores).__name__}, not a dict"
        for scorer, values in pool.scores.items():
            try:
                given = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                given = np.empty(0)
            if given.shape != (len(states),):
                return f"its pool's {scorer!r} scores are not one number per candidate"
            for i, state in enumerate(states):
                if self._scored.get((state, scorer)) != float(given[i]):
                    return (
                        f"its pool's {scorer!r} score of candidate {i} ({float(given[i]):g}) is "
                        f"not what ops.score gave that state: a pool carries the values "
                        "ops.score returned for its final states, unchanged"
                    )
        return None

    def _issue(self, rows: Rows) -> Rows:
        """Note the states of rows ops hands out: a pool may hold only those. A row that
        records its predictions is also noted without them: `Rows.concat` with rows that do
        not record them (the candidates `ops.predictions` makes) drops them, and what is left
        is a state ops gave out (a row without a prediction cannot be read by
        `ops.predictions`, and steps as a row that does not ask)."""
        self._issued.update(_states(rows))
        if rows.prediction is not None:
            self._issued.update(_states(dataclasses.replace(rows, prediction=None)))
        return rows

    def _own(self, rows: Any, call: str) -> list[bytes]:
        """The states (`_states`) of rows this search started, each one ops gave out; else a
        refusal: another problem's rows, rows built by hand, or a state ops never gave out
        (tokens, steps or the copy they descend from changed outside ops.denoise and
        ops.remask, uncharged)."""
        if not isinstance(rows, Rows):
            raise ValueError(f"{call} was given a {type(rows).__name__}, not Rows")
        if rows.problem.id != self.problem.id or rows.seed != self.seed:
            raise ValueError(
                f"{call} was given rows of problem {rows.problem.id!r}, but this search "
                f"serves problem {self.problem.id!r}; use rows from this search's ops.start"
            )
        if rows.prompt_len != self._prompt_len or rows.tokens.shape[1] != self._canvas.shape[0]:
            raise ValueError(f"{call} was given rows of another canvas than this problem's")
        if not rows.totals:
            raise ValueError(f"{call} was given rows built outside ops.start")
        prompt = self._canvas[: self._prompt_len].to(rows.tokens.device)
        if not bool((rows.tokens[:, : self._prompt_len] == prompt).all()):
            raise ValueError(f"{call} was given rows whose prompt is not this problem's")
        states = _states(rows)
        forged = [i for i, state in enumerate(states) if state not in self._issued]
        if forged:
            raise ValueError(
                f"{call} was given {len(forged)} row(s) whose tokens, steps or copy ops never "
                "produced (changed outside ops.denoise and ops.remask, uncharged)"
            )
        return states

    @property
    def gen_length(self) -> int:
        """Generated positions per canvas."""
        return int(self._canvas.shape[0]) - self._prompt_len

    @property
    def mask_id(self) -> int:
        return int(self._canvas[self._prompt_len])  # a canvas's generated positions are masks

    def mask_ratio(self, rows: Rows) -> np.ndarray:
        """The fraction of each row's generated positions still masked (free: no pass)."""
        masked = rows.tokens[:, rows.prompt_len :] == self.mask_id
        return masked.double().mean(dim=1).cpu().numpy()

    def rng(self, label: str) -> np.random.Generator:
        """A generator keyed by (seed, problem, label): resampling, tie-breaking, ..."""
        return numpy_rng(self.seed, self.problem.id, label)
