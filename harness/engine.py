"""The engine: runs the coroutines of many problems and methods at once, in full batches.

Each strategy is a coroutine per problem. An `await ops.denoise(...)` or `ops.score(...)`
posts a request; when every live coroutine waits, the engine serves the requests together:
scoring batched per scorer, and one forward per denoising step over every waiting row
(sorted by canvas length and capped by rows and tokens). Coroutines resume as soon as their
request is served, so new rows join the next forward.

Methods whose strategy nests its pools (independent sampling) share one pool per problem,
generated once at the largest size; each row is charged to every method whose prefix holds it.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dllmbench.errors import PluginError
from dllmbench.interfaces import Backbone, ScoreBatch, Scorer, SearchStrategy, StepBatch, Task
from dllmbench.keys import numpy_rng
from dllmbench.ledger import Ledger
from dllmbench.method import Method
from dllmbench.ops import DenoiseRequest, Ops, ScoreRequest
from dllmbench.registry import describe
from dllmbench.types import Candidate, Owners, Pool, Problem, Rows


@dataclass(frozen=True)
class Sampling:
    """The sampling protocol shared by every method of a run."""

    total_steps: int = 128
    gen_length: int = 512  # the paper's canvas
    prompt_style: str = "chat"
    seed: int = 0


@dataclass(frozen=True)
class Limits:
    """How much work one forward and the engine may hold at once."""

    batch_rows: int = 64  # rows per physical forward
    batch_tokens: int | None = None  # rows × canvas length per forward
    problems: int = 32  # problems in flight

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.problems < 1:
            raise ValueError("batch_rows and problems must be >= 1")


@dataclass
class Unit:
    """One strategy run on one problem, serving every method that shares its pool.

    Methods with the same strategy and configuration share one run. Methods whose strategy
    nests its pools (`prefix_field`) share one run at the largest size: copy i belongs to
    the methods whose pool is larger than i. Every row is charged to each method it belongs
    to, as if that method had run alone.
    """

    problem: Problem
    strategy: SearchStrategy
    members: list[tuple[Method, int]]  # (method, the size of its pool)
    nested: bool = False

    def owners(self, copies: int) -> list[Owners]:
        if not self.nested:
            return [tuple(m.id for m, _ in self.members)] * copies
        return [tuple(m.id for m, size in self.members if i < size) for i in range(copies)]


@dataclass
class _Task:
    unit: Unit
    coro: Any


@dataclass
class _Denoising:
    task: _Task
    rows: Rows
    tokens: torch.Tensor
    steps: list[int]
    keys: tuple[int, ...]
    remaining: int


@dataclass
class _InFlight:
    units: int
    prompt_len: int
    canvas: torch.Tensor


def plan_units(problem: Problem, methods: Iterable[Method]) -> list[Unit]:
    """Group methods into strategy runs: same strategy and configuration, or nested pools."""
    groups: dict[str, list[tuple[Method, int]]] = {}
    nested: dict[str, bool] = {}
    for method in methods:
        config = describe(method.strategy)
        field_name = getattr(method.strategy, "prefix_field", None)
        size = int(config.pop(field_name)) if field_name else method.strategy.pool_size()
        key = json.dumps([method.spec.strategy, field_name, config], sort_keys=True, default=str)
        groups.setdefault(key, []).append((method, size))
        nested[key] = field_name is not None
    units = []
    for key, members in groups.items():
        largest = max(members, key=lambda ms: ms[1])[0]
        units.append(Unit(problem, largest.strategy, members, nested[key]))
    return units


class Engine:
    def __init__(
        self,
        *,
        backbone: Backbone,
        scorers: dict[str, Scorer],
        task: Task,
        methods: list[Method],
        sampling: Sampling,
        limits: Limits | None = None,
        ledger: Ledger | None = None,
    ):
        self.backbone = backbone
        self.scorers = scorers
        self.task = task
        self.methods = methods
        self.sampling = sampling
        self.limits = limits or Limits()
        self.ledger = ledger or Ledger()
        self.passes_per_step = int(getattr(backbone, "passes_per_step", 1))
        self._costs = {m.id: m.cost(sampling.total_steps, self.passes_per_step) for m in methods}
        if len(self._costs) != len(methods):
            raise ValueError("two methods of a run share one id; give each a distinct label")

    # -- running -------------------------------------------------------------------------
    def run(
        self,
        problems: Iterable[Problem],
        *,
        skip: set[tuple[str, str]] | frozenset = frozenset(),
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Run every method on every problem; return (and pass on) one record per pair."""
        records: list[dict[str, Any]] = []

        def emit(record: dict[str, Any]) -> None:
            records.append(record)
            if on_record is not None:
                on_record(record)

        pending = iter(problems)
        inflight: dict[str, _InFlight] = {}
        ready: deque[tuple[_Task, Any]] = deque()
        denoising: list[_Denoising] = []
        scoring: list[tuple[_Task, ScoreRequest]] = []

        def admit() -> None:
            while len(inflight) < self.limits.problems:
                problem = next(pending, None)
                if problem is None:
                    return
                todo = [m for m in self.methods if (problem.id, m.id) not in skip]
                if not todo:
                    continue
                if problem.id in inflight:
                    raise ValueError(f"problem id {problem.id!r} appears twice")
                prompt_ids = self.backbone.encode(
                    self.task.prompt(problem, self.sampling.prompt_style)
                )
                canvas = self.backbone.canvas(prompt_ids, self.sampling.gen_length)
                units = plan_units(problem, todo)
                inflight[problem.id] = _InFlight(len(units), len(prompt_ids), canvas)
                for unit in units:
                    ops = Ops(
                        problem=problem,
                        seed=self.sampling.seed,
                        total_steps=self.sampling.total_steps,
                        canvas=canvas,
                        prompt_len=len(prompt_ids),
                        ledger=self.ledger,
                        scorers={n: bool(s.reads_partial) for n, s in self.scorers.items()},
                        passes_per_step=self.passes_per_step,
                        owners=unit.owners,
                    )
                    ready.append((_Task(unit, self._unit(unit, ops)), None))

        admit()
        while ready or denoising or scoring:
            while ready:
                task, value = ready.popleft()
                try:
                    request = task.coro.send(value)
                except StopIteration as stop:
                    for record in self._finish(task.unit, stop.value):
                        emit(record)
                    state = inflight[task.unit.problem.id]
                    state.units -= 1
                    if state.units == 0:
                        del inflight[task.unit.problem.id]
                        admit()
                    continue
                if isinstance(request, DenoiseRequest):
                    rows = request.rows
                    denoising.append(
                        _Denoising(
                            task,
                            rows,
                            rows.tokens.clone(),
                            list(rows.steps),
                            rows.keys,
                            request.steps,
                        )
                    )
                elif isinstance(request, ScoreRequest):
                    scoring.append((task, request))
                else:
                    raise TypeError(
                        f"a strategy awaited {request!r}; await ops.denoise or ops.score only"
                    )
            if scoring:
                self._serve_scores(scoring, ready)
                scoring = []
            elif denoising:
                denoising = self._tick(denoising, ready)
        return records

    async def _unit(self, unit: Unit, ops: Ops) -> Pool:
        pool = await unit.strategy.search(unit.problem, ops)
        if not isinstance(pool, Pool):
            raise TypeError(
                f"strategy of {unit.members[0][0].id!r} returned {type(pool).__name__}, not a Pool"
            )
        if len(pool) < max(size for _, size in unit.members):
            raise ValueError(
                f"strategy of {unit.members[0][0].id!r} returned {len(pool)} "
                "candidates, fewer than it declared"
            )
        needed = sorted({s for m, _ in unit.members for s in m.selector_scoring()})
        for scorer in needed:
            needy = [(m, size) for m, size in unit.members if scorer in m.selector_scoring()]
            upto = max(size for _, size in needy)
            owners = [tuple(m.id for m, size in needy if i < size) for i in range(upto)]
            values = await ops.score(pool.rows.take(range(upto)).owned_by(owners), scorer)
            full = np.full(len(pool), np.nan)
            full[:upto] = values
            pool.scores[scorer] = full
        return pool

    # -- serving requests ----------------------------------------------------------------
    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices sorted by canvas length, cut into batches within the row and token caps."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            widest = max([lengths[j] for j in current] + [lengths[i]])
            too_many = len(current) >= self.limits.batch_rows
            too_wide = (
                self.limits.batch_tokens is not None
                and (len(current) + 1) * widest > self.limits.batch_tokens
            )
            if current and (too_many or too_wide):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _tick(self, denoising: list[_Denoising], ready: deque) -> list[_Denoising]:
        """One denoising step for every waiting row; identical rows are computed once."""
        flat = [(state, i) for state in denoising for i in range(len(state.steps))]
        copies = _identical(
            (state.keys[i], state.steps[i], state.rows.prompt_len, state.tokens[i])
            for state, i in flat
        )
        owners = [(state.rows.problem.id, state.rows.owners[i]) for state, i in flat]
        lengths = [flat[rows[0]][0].tokens.shape[1] for rows in copies]
        for batch in self._batches(lengths):
            items = [flat[copies[j][0]] for j in batch]
            step = StepBatch(
                tokens=[state.tokens[i] for state, i in items],
                prompt_lens=[state.rows.prompt_len for state, _ in items],
                steps=[state.steps[i] for state, i in items],
                keys=[state.keys[i] for state, i in items],
                total_steps=self.sampling.total_steps,
            )
            start = time.perf_counter()
            out = self.backbone.denoise_step(step)
            seconds = time.perf_counter() - start
            if len(out) != len(items):
                raise ValueError(f"backbone returned {len(out)} rows for a batch of {len(items)}")
            for j, tokens in zip(batch, out, strict=True):
                for state, i in (flat[n] for n in copies[j]):
                    state.tokens[i] = tokens
                    state.steps[i] += 1
            self.ledger.record_forward(
                "denoise", [_charged(owners, copies[j]) for j in batch], seconds
            )
        still: list[_Denoising] = []
        for state in denoising:
            state.remaining -= 1
            if state.remaining:
                still.append(state)
            else:
                ready.append((state.task, state.rows.advanced(state.tokens, state.steps)))
        return still

    def _serve_scores(self, scoring: list[tuple[_Task, ScoreRequest]], ready: deque) -> None:
        """Every pending scoring request, batched per scorer; identical rows scored once."""
        results = [np.empty(len(req.rows)) for _, req in scoring]
        for name in sorted({req.scorer for _, req in scoring}):
            flat = [
                (req.rows, i, n)
                for n, (_, req) in enumerate(scoring)
                if req.scorer == name
                for i in range(len(req.rows))
            ]
            copies = _identical(
                (r.problem.id, r.steps[i], r.prompt_len, r.tokens[i]) for r, i, _ in flat
            )
            owners = [(r.problem.id, r.owners[i]) for r, i, _ in flat]
            lengths = [flat[rows[0]][0].tokens.shape[1] for rows in copies]
            for batch in self._batches(lengths):
                items = [flat[copies[j][0]] for j in batch]
                request = ScoreBatch(
                    tokens=[r.tokens[i] for r, i, _ in items],
                    prompt_lens=[r.prompt_len for r, _, _ in items],
                    steps=[r.steps[i] for r, i, _ in items],
                    total_steps=self.sampling.total_steps,
                )
                start = time.perf_counter()
                values = np.asarray(self.scorers[name].score(request), dtype=np.float64)
                seconds = time.perf_counter() - start
                if values.shape != (len(items),):
                    raise ValueError(
                        f"scorer {name!r} returned shape {values.shape} for {len(items)} rows"
                    )
                for j, value in zip(batch, values, strict=True):
                    for _, i, n in (flat[m] for m in copies[j]):
                        results[n][i] = value
                self.ledger.record_forward(
                    f"score:{name}", [_charged(owners, copies[j]) for j in batch], seconds
                )
        for (task, _), values in zip(scoring, results, strict=True):
            ready.append((task, values))

    # -- finishing -----------------------------------------------------------------------
    def _grade(self, items: list[tuple[Problem, str | None, str]]) -> list[bool]:
        """A pool's grades: all at once through the task's optional `grade_many` (MBPP's
        sandboxes and MATH-500's workers grade in parallel), else one `grade` at a time."""
        grade_many = getattr(self.task, "grade_many", None)
        if grade_many is None:
            return [bool(self.task.grade(*item)) for item in items]
        labels = [bool(x) for x in grade_many(items)]
        if len(labels) != len(items):
            raise PluginError(
                f"task grade_many returned {len(labels)} grades for {len(items)} candidates"
            )
        return labels

    def _finish(self, unit: Unit, pool: Pool) -> list[dict[str, Any]]:
        """Decode, extract and grade the pool once; let each member method select."""
        problem, rows = unit.problem, pool.rows
        texts = [self.backbone.decode(rows.tokens[i], rows.prompt_len) for i in range(len(pool))]
        answers = [self.task.extract(text) for text in texts]
        keys = [None if a is None else self.task.answer_key(a) for a in answers]
        labels = self._grade([(problem, a, t) for a, t in zip(answers, texts, strict=True)])
        records = []
        for method, size in unit.members:
            # a method sees only the scores it paid for, whatever else shares its pool
            paid = set(method.selector.needs) | method.strategy.pool_scores()
            candidates = [
                Candidate(
                    index=i,
                    text=texts[i],
                    answer=answers[i],
                    answer_key=keys[i],
                    lineage=rows.lineage[i],
                    scores={s: float(v[i]) for s, v in pool.scores.items() if s in paid},
                    weight=None if pool.weights is None else float(pool.weights[i]),
                )
                for i in range(size)
            ]
            rng = numpy_rng(self.sampling.seed, problem.id, "select", method.id)
            chosen = method.selector.select(
                candidates, rng=rng, labels=labels[:size] if method.ceiling else None
            )
            if chosen is not None and not 0 <= chosen < size:
                raise ValueError(f"selector of {method.id!r} chose {chosen} of {size} candidates")
            self.ledger.check(problem.id, method.id, self._costs[method.id])
            records.append(
                {
                    "problem": problem.id,
                    "method": method.id,
                    "selected": chosen,
                    "answer": None if chosen is None else answers[chosen],
                    "correct": False if chosen is None else labels[chosen],
                    "ceiling": method.ceiling,
                    "candidates": [
                        {
                            "text": c.text,
                            "answer": c.answer,
                            "valid": c.answer_key is not None,
                            "key": None if c.answer_key is None else str(c.answer_key),
                            "correct": labels[c.index],
                            "scores": c.scores,
                            "weight": c.weight,
                            "lineage": list(c.lineage),
                        }
                        for c in candidates
                    ],
                    "ledger": self.ledger.entry(problem.id, method.id),
                    "info": pool.info,
                }
            )
            self.ledger.release(problem.id, method.id)
        return records


def _identical(rows: Iterable[tuple[Any, ...]]) -> list[list[int]]:
    """Group rows whose forward is the same computation: equal key or step fields and equal
    tokens (the last field). Groups are in order of first appearance."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n, (*fields, tokens) in enumerate(rows):
        groups.setdefault((*fields, tokens.numpy().tobytes()), []).append(n)
    return list(groups.values())


def _charged(owners: list[tuple[str, Owners]], copies: list[int]) -> tuple[str, Owners]:
    """(problem id, owners) of one computed row: every owner of every copy it stands for."""
    return owners[copies[0]][0], tuple(o for n in copies for o in owners[n][1])
