"""The engine: runs the coroutines of many problems and methods at once, in full batches.

Each strategy is a coroutine per problem. An `await ops.denoise(...)` or `ops.score(...)`
posts a request; when every live coroutine waits, the engine serves the requests together
(`scheduler.Scheduler` holds the queues): scoring batched per scorer, and one forward per
denoising step over every waiting row (sorted by canvas length and capped by rows and tokens).
Coroutines resume as soon as their request is served, so new rows join the next forward.

Methods whose strategy nests its pools (independent sampling) share one pool per problem,
generated once at the largest size; each row is charged to every method whose prefix holds it.

Every forward is charged where it is computed, row by row: its passes and the FLOPs of the
work it did (`dllmbench.core.flops`), to every method owning the row. A row whose sampler
fills its canvas before its T (`FinishesEarly`) takes no more steps and is charged none.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dllmbench.api.interfaces import (
    Backbone,
    CountsCacheMemory,
    CountsForwardMemory,
    CountsScoreWork,
    CountsStepWork,
    CountsTokens,
    GradesMany,
    KeepsState,
    NotesGrades,
    ReportsConfidence,
    ScoreBatch,
    Scorer,
    SearchStrategy,
    SharesCanvases,
    SizedBySteps,
    StepBatch,
    Task,
    TransformerBackbone,
    VariesPerRow,
    commit_orders,
    finishes_early,
    is_capped,
    model_shape,
    passes_per_step,
    pool_size_of,
    reopenable,
    reports_predictions,
    row_settings,
)
from dllmbench.api.ops import Ops, ScoreRequest
from dllmbench.core.errors import UserError
from dllmbench.core.flops import ModelShape, Work, flops
from dllmbench.core.keys import numpy_rng
from dllmbench.core.ledger import Ledger
from dllmbench.core.schema import CandidateRecord, Record
from dllmbench.core.types import Candidate, Owners, Pool, Problem, Rows
from dllmbench.execution.method import Method
from dllmbench.execution.rates import check_canvas, described
from dllmbench.execution.scheduler import (
    Capacity,
    DenoiseWait,
    FinishedRows,
    Scheduler,
    StrategyRun,
    Trusted,
    Wait,
)
from dllmbench.execution.watch import ComputeWatch, ModelRows, model_body
from dllmbench.loading.provenance import Origins, config_data

__all__ = ["Capacity", "Engine", "Sampling", "Unit", "plan_units", "sized_to_memory"]

MEMORY_SHARE = 0.6  # of the GPU memory free after loading, for one forward's activations
CACHE_SHARE = 0.5  # of the GPU memory free after loading, for a KV cache across steps


def sized_to_memory(capacity: Capacity, backbone: Backbone, cached_tokens: int = 0) -> Capacity:
    """`batch_tokens` from the free memory of the backbone's GPU when it is unset: about the
    activations of one layer of a no-grad forward per token (6 × hidden + 3 × MLP width
    values; a mixture of experts adds, for each of the token's experts, its hidden state in
    and out, the expert's 3 × width and its float32 output twice), twice over for safety,
    plus what the backbone says a forward needs beside them (`CountsForwardMemory`: a
    packing backbone's block mask, which grows with the square of the blocks), within
    `MEMORY_SHARE` of what is free: the most tokens whose sum fits.

    A backbone with a KV cache (`CountsCacheMemory`) first gets `CACHE_SHARE` of what is free
    for the cache, and the problems in flight are as many as fit there, each holding
    `cached_tokens` (its rows × canvas); when not even one fits, that is one line. Unchanged
    on a CPU, for a backbone that is not a transformer, or when `batch_tokens` is given."""
    if capacity.batch_tokens is not None or not isinstance(backbone, TransformerBackbone):
        return capacity
    device = torch.device(backbone.device)
    if device.type != "cuda":
        return capacity
    free, _ = torch.cuda.mem_get_info(device)
    if isinstance(backbone, CountsCacheMemory) and cached_tokens:
        share = int(free * CACHE_SHARE)
        per_problem = backbone.cache_bytes(cached_tokens)
        fits = share // max(1, per_problem)
        if fits < 1:
            raise UserError(
                f"one problem's KV cache ({per_problem / 2**30:.1f} GiB for {cached_tokens} "
                f"tokens) does not fit the {share / 2**30:.1f} GiB set aside for it; run fewer "
                "rows per problem, a shorter gen_length, or a GPU with more memory"
            )
        backbone.limit_cache(share)
        capacity = dataclasses.replace(capacity, problems=min(capacity.problems, int(fits)))
        free -= share
    config = backbone.transformer.config
    hidden = int(config.hidden_size)
    width = int(getattr(config, "intermediate_size", 4 * hidden))
    itemsize = next(backbone.transformer.parameters()).element_size()
    one_layer = (6 * hidden + 3 * width) * itemsize
    top_k = getattr(config, "num_experts_per_tok", None)
    if isinstance(top_k, int):  # a mixture of experts: per expert of the token, its copy in
        # and out, the expert's widths, and its weighted output in float32, reordered
        expert = int(getattr(config, "moe_intermediate_size", width))
        one_layer += top_k * ((2 * hidden + 3 * expert) * itemsize + 2 * hidden * 4)
    per_token = 2 * one_layer
    budget = int(free * MEMORY_SHARE)
    extra = backbone.forward_extra_bytes if isinstance(backbone, CountsForwardMemory) else None
    low, high = 1, max(1, budget // per_token)  # the extra bytes only lower the count
    while extra is not None and low < high:  # the most tokens within the budget
        mid = (low + high + 1) // 2
        low, high = (mid, high) if mid * per_token + extra(mid) <= budget else (low, mid - 1)
    return dataclasses.replace(capacity, batch_tokens=high)


@dataclass(frozen=True)
class Sampling:
    """The sampling protocol shared by every method of a run."""

    total_steps: int = 128
    gen_length: int = 512  # the paper's canvas
    prompt_style: str = "chat"
    seed: int = 0


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

    @property
    def strategy_name(self) -> str:
        return self.members[0][0].spec.strategy

    @property
    def pool_size(self) -> int:
        return max(size for _, size in self.members)

    def owners(self, rows: int) -> list[Owners]:
        """The owners of the first `rows` rows the strategy starts."""
        return [self.owner_of(i) for i in range(rows)]

    def owner_of(self, root: int) -> Owners:
        """Who is charged for a row descended from copy `root` of an `ops.start`: every
        member, or in nested pools those whose pool holds that copy."""
        return tuple(m.id for m, size in self.members if not self.nested or root < size)


def declared_size(strategy: object) -> str:
    """Which call declared a strategy's pool size, for a line that refuses a pool."""
    if isinstance(strategy, SizedBySteps):
        return "pool_size_at(T)"
    return "pool_size(); a pool whose size depends on T declares pool_size_at(T), SizedBySteps"


def plan_units(
    problem: Problem, methods: Iterable[Method], total_steps: int | None = None
) -> list[Unit]:
    """Group methods into strategy runs: same strategy and configuration, or nested pools.
    A strategy whose pool size depends on T (`SizedBySteps`) is sized at `total_steps`."""
    groups: dict[str, list[tuple[Method, int]]] = {}
    nested: dict[str, bool] = {}
    for method in methods:
        config = config_data(method.strategy)
        field_name = method.strategy.prefix_field
        if field_name:
            size = int(config.pop(field_name))
        elif total_steps is not None:
            size = pool_size_of(method.strategy, total_steps)
        else:
            size = method.strategy.pool_size()
        key = json.dumps([method.spec.strategy, field_name, config], sort_keys=True, default=str)
        groups.setdefault(key, []).append((method, size))
        nested[key] = field_name is not None
    units = []
    for key, members in groups.items():
        largest = max(members, key=lambda ms: ms[1])[0]
        units.append(Unit(problem, largest.strategy, members, nested[key]))
    return units


@dataclass(frozen=True)
class Judged:
    """A finished pool as the task sees it: decoded once, extracted, keyed and graded."""

    texts: list[str]
    answers: list[str | None]
    answer_keys: list[Any]  # task.answer_key per candidate; None when invalid
    labels: list[bool]
    notes: list[str | None]  # what the task said of each grade (`NotesGrades`), if anything


class Engine:
    def __init__(
        self,
        *,
        backbone: Backbone,
        scorers: dict[str, Scorer],
        task: Task,
        methods: list[Method],
        sampling: Sampling,
        capacity: Capacity | None = None,
        ledger: Ledger | None = None,
        origins: Origins | None = None,
    ):
        self.backbone = backbone
        self.scorers = scorers
        self.task = task
        self.methods = methods
        self.sampling = sampling
        self.capacity = capacity or Capacity()
        self.ledger = ledger or Ledger()
        self.origins = origins or Origins()
        self.passes_per_step = passes_per_step(backbone)
        self._finished = FinishedRows()
        self._costs = {m.id: m.cost(sampling.total_steps, self.passes_per_step) for m in methods}
        if len(self._costs) != len(methods):
            raise ValueError("two methods of a run share one id; give each a distinct label")
        # the FLOP ledger's shapes, by kind (None: unknown)
        self.shapes: dict[str, ModelShape | None] = {"denoise": model_shape(backbone)}
        for name, scorer in scorers.items():
            self.shapes[f"score:{name}"] = model_shape(scorer)
        # who counts its own work: runtime Protocol checks, asked once rather than per forward
        self._step_work = backbone if isinstance(backbone, CountsStepWork) else None
        self._packs = backbone if isinstance(backbone, CountsTokens) else None
        self._vocabulary = _vocabulary(backbone)  # ids a row may hold (None: not known)
        mask = backbone.mask_id
        if isinstance(mask, bool) or not isinstance(mask, numbers.Integral) or mask < 0:
            what = f"its mask_id is {mask!r}: a token id, an int >= 0"
            raise self.origins.violation("backbone", self.origins.backbone, what)
        if self._vocabulary is not None and mask >= self._vocabulary:
            what = f"its mask_id {mask} is outside the vocabulary (ids 0 to {self._vocabulary - 1})"
            raise self.origins.violation("backbone", self.origins.backbone, what)
        self._shares = backbone if isinstance(backbone, SharesCanvases) else None
        # reports each step's predictions to rows that ask (`ReportsPredictions`)
        self._predicts = backbone if reports_predictions(backbone) else None
        self._score_work = {
            name: scorer for name, scorer in scorers.items() if isinstance(scorer, CountsScoreWork)
        }
        # a method's cost is a cap when its strategy says so or rows may end early
        self.capped = {m.id for m in methods if capped(m, backbone, self.origins)}
        self._early: dict[Any, bool] = {}  # a row's settings → whether it may end early
        self._held: dict[str, list[int]] = {}  # problems in flight → prompts a backbone holds
        self._watch = ComputeWatch()  # forwards plugin code makes itself (`watch.py`)
        self._model_rows = ModelRows(model_body(backbone))  # rows a scorer runs the model over
        self._trusted = Trusted()  # the requests the engine posts itself
        for method in methods:
            if method.id in self.capped:
                self.ledger.cap(method.id, self._costs[method.id], method.spec.strategy)

    # -- running -------------------------------------------------------------------------
    def run(
        self,
        problems: Iterable[Problem],
        *,
        skip: Collection[tuple[str, str]] = frozenset(),
        on_record: Callable[[Record], None] | None = None,
        keep_rows: bool = False,
    ) -> list[Record]:
        """Run every method on every problem; return (and pass on) one record per pair.

        Denoised rows kept by the previous run (`keep_rows=True`) are taken instead of being
        computed again: a run in phases, smallest budget first, computes what a run of every
        budget at once would. This run keeps its own rows for the next when `keep_rows`."""
        records: list[Record] = []
        pending = iter(problems)
        self._finished.keeping = keep_rows
        self._watch = ComputeWatch()
        queue = Scheduler(
            self.capacity, self._finished, self._charge_reused, self._watch, self._trusted
        )
        # the scorers' row count hooks the model first: the hooks the run begins with
        with (
            self._model_rows.watching(),
            self._watch.watching((self.backbone, *self.scorers.values())),
        ):
            try:
                self._admit(queue, pending, skip)
                while queue.busy:
                    for run, pool in queue.resume():
                        for record in self._finish(run.unit, pool):
                            records.append(record)
                            if on_record is not None:
                                on_record(record)
                        if queue.finished(run):
                            self._release(run.unit.problem.id)
                            self._admit(queue, pending, skip)
                    groups = queue.round()
                    for group in groups:
                        self._serve(group)
                    queue.served(groups)
                    self._watch.check_threads()
            finally:
                queue.close()
                for problem_id in list(self._held):
                    self._release(problem_id)
        if not keep_rows:
            self._finished.clear()
        return records

    def _release(self, problem_id: str) -> None:
        """The problem left: what a stateful backbone keeps for its prompt may be freed."""
        prompt_ids = self._held.pop(problem_id, None)
        if prompt_ids is not None and isinstance(self.backbone, KeepsState):
            with self.origins.blame("backbone", self.origins.backbone):
                self.backbone.release(prompt_ids)

    def _admit(
        self, queue: Scheduler, pending: Iterator[Problem], skip: Collection[tuple[str, str]]
    ) -> None:
        """Admit problems while there is room: one strategy run per unit of each."""
        while queue.has_room:
            problem = next(pending, None)
            if problem is None:
                return
            todo = [m for m in self.methods if (problem.id, m.id) not in skip]
            if not todo:
                continue
            if queue.in_flight(problem.id):
                raise ValueError(f"problem id {problem.id!r} appears twice")
            queue.admit(self._start(problem, todo))

    def _start(self, problem: Problem, methods: list[Method]) -> list[StrategyRun]:
        """Format the prompt, build the canvas, and start one coroutine per unit."""
        with self.origins.blame("task", self.origins.task):
            prompt = self.task.prompt(problem, self.sampling.prompt_style)
        with self.origins.blame("backbone", self.origins.backbone):
            prompt_ids = self.backbone.encode(prompt)
            canvas = self.backbone.canvas(prompt_ids, self.sampling.gen_length)
        check_canvas(canvas, self.origins)
        if isinstance(self.backbone, KeepsState):
            with self.origins.blame("backbone", self.origins.backbone):
                self.backbone.hold(prompt_ids)
            self._held[problem.id] = list(prompt_ids)
        runs = []
        # what a strategy sees of the problem: never its answer (only the grader reads it)
        public = dataclasses.replace(problem, gold=None)
        for unit in plan_units(problem, methods, self.sampling.total_steps):
            ops = Ops(
                problem=public,
                seed=self.sampling.seed,
                total_steps=self.sampling.total_steps,
                canvas=canvas,
                prompt_len=len(prompt_ids),
                scorers={  # those it declares: a call of another is its fault
                    n: bool(s.reads_partial)
                    for n, s in self.scorers.items()
                    if n in unit.strategy.scorers
                },
                owners=unit.owners,
                row_settings=row_settings(self.backbone),
                commit_orders=commit_orders(self.backbone),
                reopenable=reopenable(self.backbone),
                check_settings=self._settings_check(),
                confidences=isinstance(self.backbone, ReportsConfidence),
                answers=lambda rows: self.read(rows)[2],
                predictions=self._predicts is not None,
            )
            name = unit.strategy_name
            dist = self.origins.distribution("strategy", name)
            runs.append(StrategyRun(unit, self._strategy_run(unit, ops), name, dist))
        return runs

    def _settings_check(self) -> Callable[[Any, int], None] | None:
        """How a row's own sampler settings are checked: by the backbone, at this canvas."""
        backbone = self.backbone
        if not isinstance(backbone, VariesPerRow):
            return None
        gen_length = self.sampling.gen_length

        def check(settings: Any, total: int) -> None:
            with self.origins.blame("backbone", self.origins.backbone):
                backbone.check_row_settings(settings, gen_length, total)

        return check

    async def _strategy_run(self, unit: Unit, ops: Ops) -> Pool:
        """The strategy's search, then the scores its pool lacks for the members' selectors."""
        pool = self._checked(unit, await unit.strategy.search(ops.problem, ops), ops)
        self._paid_for(unit, pool)
        await self._selector_scores(unit, pool, ops)
        return pool

    def _paid_for(self, unit: Unit, pool: Pool) -> None:
        """Each member's candidates are rows charged to it."""
        for method, size in unit.members:
            unpaid = [
                i for i in range(min(size, len(pool))) if method.id not in pool.rows.owners[i]
            ]
            if unpaid:
                what = (
                    f"its pool gives {method.id} candidates {unpaid[:4]} that were charged to "
                    "others (rows out of their start order in a nested pool)"
                )
                raise self.origins.violation("strategy", unit.strategy_name, what)

    def _checked(self, unit: Unit, pool: Any, ops: Ops) -> Pool:
        """The pool a strategy returned, once it is a Pool of the size it declared, of states
        its ops gave out, charged to their owners, with the scores ops gave them (`returned`),
        its tokens copied: what the strategy does to its tensors afterwards is not graded."""
        if not isinstance(pool, Pool):
            what = f"search() returned a {type(pool).__name__}, not a Pool"
            raise self.origins.violation("strategy", unit.strategy_name, what)
        wrong = ops.returned(pool)
        if wrong is not None:
            raise self.origins.violation("strategy", unit.strategy_name, wrong)
        pool = dataclasses.replace(
            pool, rows=dataclasses.replace(pool.rows, tokens=pool.rows.tokens.clone())
        )
        capped = all(m.id in self.capped for m, _ in unit.members)
        if len(pool) != unit.pool_size and not (capped and 1 <= len(pool) < unit.pool_size):
            what = f"search() returned {len(pool)} candidates but declared {unit.pool_size}"
            what += f" ({declared_size(unit.strategy)})"
            if capped:
                what += " (a capped strategy may return fewer, at least one)"
            raise self.origins.violation("strategy", unit.strategy_name, what)
        try:  # its record holds it
            if not isinstance(pool.info, dict):
                raise TypeError(f"a {type(pool.info).__name__}, not a dict")
            json.dumps(pool.info, allow_nan=False)
        except (TypeError, ValueError) as exc:
            what = (
                f"its pool's info is not JSON data ({exc}): a dict of strings, finite numbers, "
                "bools, None, lists and dicts, which the record holds"
            )
            raise self.origins.violation("strategy", unit.strategy_name, what) from None
        return pool

    # -- serving requests ----------------------------------------------------------------
    def _serve(self, waits: list[Wait]) -> None:
        """One round of requests of one kind: rows that are the same computation are computed
        once, the rest sorted by canvas length and cut into batches within the caps."""
        if not waits:
            return
        kind = "denoise" if isinstance(waits[0], DenoiseWait) else f"score:{waits[0].scorer}"
        flat = [(wait, i) for wait in waits for i in _computed(wait)]
        same = _identical(wait.same_computation(i) for wait, i in flat)
        owners = [(wait.rows.problem.id, wait.rows.owners[i]) for wait, i in flat]
        lengths = [flat[rows[0]][0].tokens.shape[1] for rows in same]
        # a row that records confidences may stand behind a row of another request that does
        # not: ask the backbone for them when any request of the round records them
        confident = any(isinstance(w, DenoiseWait) and w.confidence is not None for w in waits)
        shape = self.shapes.get(kind)
        passes = self.passes_per_step if kind == "denoise" else 1
        canvases = self._canvases(waits[0], [flat[rows[0]] for rows in same])
        for batch in self.capacity.batches(lengths, canvases):
            items = [flat[same[j][0]] for j in batch]
            call = self._batch(waits[0], items)
            works = self._works(call)
            start = time.perf_counter()
            outputs = self._forward(waits[0], call, confident)
            seconds = time.perf_counter() - start
            if kind == "denoise" and shape is not None:
                self._check_charged(call, works, outputs)
            widths = [lengths[j] for j in batch]
            row_flops = [None if shape is None else passes * flops(shape, w) for w in works]
            # what the model computed: a row that shares its canvas's forward still has the
            # head applied at its own positions
            computed = self._computed_rows(call)
            alone = set(computed)
            own = None
            if shape is not None:
                own = sum(
                    cost if k in alone else passes * flops(shape, Work(0, 0, w.head))
                    for k, (w, cost) in enumerate(zip(works, row_flops, strict=True))
                )
            for j, output, cost in zip(batch, outputs, row_flops, strict=True):
                for n in same[j]:
                    wait, i = flat[n]
                    wait.put(i, output)
                    if isinstance(wait, DenoiseWait):
                        wait.spent(i, passes, cost)
                        if self._ends_early(wait, i):
                            wait.end(i)
                    self.ledger.charge(owners[n][0], [owners[n][1]], kind, passes, cost)
            self.ledger.record_forward(
                kind,
                [_charged(owners, same[j]) for j in batch],
                seconds,
                tokens=(
                    self._computed_tokens(kind, [widths[k] for k in computed]),
                    sum(widths[k] for k in computed),
                ),
                flops=own,
            )

    def _ends_early(self, wait: DenoiseWait, i: int) -> bool:
        """Row i of the request may end before its T and has no generated position masked."""
        settings = wait.rows.settings[i] if wait.rows.settings else ()
        if settings not in self._early:  # asked once per distinct settings, not per row-step
            with self.origins.blame("backbone", self.origins.backbone):
                self._early[settings] = bool(finishes_early(self.backbone, wait.settings(i)))
        if not self._early[settings]:
            return False
        prompt_len = wait.rows.prompt_len
        return not bool((wait.tokens[i, prompt_len:] == self.backbone.mask_id).any())

    def _charge_reused(self, wait: DenoiseWait, i: int, passes: int, cost: int | None) -> None:
        """Charge the owners of a row that an earlier run computed what it cost there."""
        self.ledger.charge(wait.rows.problem.id, [wait.rows.owners[i]], "denoise", passes, cost)

    def _works(self, call: StepBatch | ScoreBatch) -> list[Work]:
        """What the forward computes for each row: the backbone's or scorer's own account
        (`CountsStepWork`, `CountsScoreWork`), else a bidirectional forward over the row with
        the head at every position (denoising) or once (scoring)."""
        if isinstance(call, StepBatch):
            if self._step_work is None:
                return [Work.full(len(t)) for t in call.tokens]
            with self.origins.blame("backbone", self.origins.backbone):
                works = list(self._step_work.step_work(call))
            return self._checked_works(works, len(call.tokens), "backbone", "step_work")
        if isinstance(call, _Scoring) and call.scorer in self._score_work:
            name = self.origins.scorer(call.scorer)
            with self.origins.blame("scorer", name):
                works = list(self._score_work[call.scorer].score_work(call.batch))
            return self._checked_works(works, len(call.tokens), "scorer", "score_work", name)
        return [Work.full(len(t), head=1) for t in call.tokens]

    def _checked_works(
        self, works: list[Any], size: int, kind: str, method: str, name: str | None = None
    ) -> list[Work]:
        """A plugin's account of a batch: one `Work` per row (each part an int >= 0, which
        `Work` holds itself to)."""
        plugin = name or self.origins.backbone
        if len(works) != size or not all(isinstance(w, Work) for w in works):
            got = f"{len(works)} items" if len(works) != size else "something that is not a Work"
            what = f"{method}() returned {got} for a batch of {size} rows: one Work per row"
            raise self.origins.violation(kind, plugin, what)
        return works

    def _computed_rows(self, call: StepBatch | _Scoring) -> list[int]:
        """The rows of a call whose forward is computed: the first of each canvas where the
        backbone shares one canvas's forward among its rows (`SharesCanvases`), else all."""
        if isinstance(call, StepBatch) and self._shares is not None:
            with self.origins.blame("backbone", self.origins.backbone):
                rows = list(self._shares.computed_rows(call))
            size = len(call.tokens)
            ok = all(
                isinstance(r, numbers.Integral) and not isinstance(r, bool) and 0 <= r < size
                for r in rows
            )
            if not ok or len(set(rows)) != len(rows) or not rows:
                what = (
                    f"computed_rows() returned {rows!r} for a batch of {size} rows: distinct "
                    f"row indices 0 to {size - 1}, at least one"
                )
                raise self.origins.violation("backbone", self.origins.backbone, what)
            return [int(r) for r in rows]
        return list(range(len(call.tokens)))

    def _canvases(self, like: Wait, items: list[tuple[Any, int]]) -> list[int] | None:
        """A canvas id for each row of a denoising round whose backbone computes each canvas
        of a batch once (`SharesCanvases`), for the batches to keep rows of one canvas
        together; None where no two rows would share a forward or one batch holds them all."""
        if not isinstance(like, DenoiseWait) or self._shares is None:
            return None
        if len(items) <= self.capacity.batch_rows and self.capacity.batch_tokens is None:
            return None  # one batch: no cut to place
        firsts: dict[bytes, int] = {}  # a canvas's tokens → its first row, the canvas's id
        canvases, repeat = [], None
        for n, (wait, i) in enumerate(items):
            first = firsts.setdefault(wait.tokens[i].numpy().tobytes(), n)
            canvases.append(first)
            if repeat is None and first != n:
                repeat = [items[first], items[n]]
        # whether the backbone shares a forward: asked of two rows of one canvas of the round
        if repeat is None or len(self._shares.computed_rows(self._batch(like, repeat))) == 2:
            return None
        return canvases

    def _computed_tokens(self, kind: str, widths: list[int]) -> int:
        """Tokens one forward over rows of these widths computed: the backbone's own count
        when it packs rows (`CountsTokens`), else rows × the widest row."""
        if kind == "denoise" and self._packs is not None:
            return self._packs.computed_tokens(widths)
        return len(widths) * max(widths)

    def _batch(self, like: Wait, items: list[tuple[Any, int]]) -> StepBatch | _Scoring:
        """The rows `items` (wait, row) as one physical call's batch."""
        tokens = [wait.tokens[i] for wait, i in items]
        prompt_lens = [wait.rows.prompt_len for wait, _ in items]
        steps = [wait.steps[i] for wait, i in items]
        totals = [
            wait.rows.totals[i] if wait.rows.totals else self.sampling.total_steps
            for wait, i in items
        ]
        total_steps = self.sampling.total_steps
        if isinstance(like, DenoiseWait):
            return StepBatch(
                tokens,
                prompt_lens,
                steps,
                [wait.rng_keys[i] for wait, i in items],
                total_steps,
                totals=totals,
                settings=[wait.settings(i) for wait, i in items],
                edited=[wait.edited(i) for wait, i in items],
                predict=[wait.predicts for wait, _ in items],
            )
        batch = ScoreBatch(tokens, prompt_lens, steps, total_steps, totals=totals)
        return _Scoring(like.scorer, batch)

    def _forward(
        self, like: Wait, batch: StepBatch | _Scoring, confident: bool = False
    ) -> Sequence[Any]:
        """One physical call: the backbone's denoising step or the scorer's scores, one
        output per row."""
        size = len(batch.tokens)
        if isinstance(batch, StepBatch):
            predicting = self._predicts is not None and any(batch.predict)
            with self.origins.blame("backbone", self.origins.backbone), self._watch.computing():
                if predicting:
                    out: Sequence[Any] = self._predicts.denoise_step_with_predictions(batch)
                elif confident and isinstance(self.backbone, ReportsConfidence):
                    out = self.backbone.denoise_step_with_confidence(batch)
                else:
                    out = self.backbone.denoise_step(batch)
            if len(out) != size:
                what = f"denoise_step() returned {len(out)} rows for a batch of {size}"
                raise self.origins.violation("backbone", self.origins.backbone, what)
            reported = predicting or (confident and isinstance(self.backbone, ReportsConfidence))
            call = "denoise_step_with_predictions" if predicting else "denoise_step_with_confidence"
            for i, row in enumerate(out):
                if predicting and not (isinstance(row, tuple) and len(row) == 3):
                    what = (
                        f"denoise_step_with_predictions() returned row {i} as {described(row)}: "
                        "a tuple (tokens, confidences or None, prediction or None)"
                    )
                    raise self.origins.violation("backbone", self.origins.backbone, what)
                tokens, given = (row[0] if reported else row), batch.tokens[i]
                same = isinstance(tokens, torch.Tensor) and tokens.shape == given.shape
                if not (same and tokens.dtype == given.dtype):
                    what = (
                        f"denoise_step() returned row {i} as {described(tokens)} for a row of "
                        f"{given.numel()} token ids; return each row as long as it came, in its "
                        "dtype"
                    )
                    raise self.origins.violation("backbone", self.origins.backbone, what)
                if reported:
                    confidence = row[1]
                    if not (
                        (predicting and not confident and confidence is None)
                        or (
                            isinstance(confidence, torch.Tensor)
                            and confidence.shape == given.shape
                            and confidence.is_floating_point()
                        )
                    ):
                        what = (
                            f"{call}() returned row {i}'s confidences as "
                            f"{described(confidence)}: floats, one per position of the row"
                        )
                        raise self.origins.violation("backbone", self.origins.backbone, what)
                if predicting:
                    self._check_prediction(i, row[2], tokens, batch.predicts(i))
            self._check_step(batch.tokens, [row[0] if reported else row for row in out])
            return out
        with (
            self.origins.blame("scorer", self.origins.scorer(batch.scorer)),
            self._model_rows.counting() as model,
            self._watch.computing(),
        ):
            values = np.asarray(self.scorers[batch.scorer].score(batch.batch), dtype=np.float64)
        if model.rows > size:
            what = (
                f"score() ran the backbone's model over {model.rows} rows for a batch of {size}: "
                "a scorer reads each row it scores once (one pass of score:<name> per row); "
                "a rollout is denoising, which a strategy asks of ops, where it is charged"
            )
            raise self.origins.violation("scorer", self.origins.scorer(batch.scorer), what)
        if values.shape != (size,):
            what = f"score() returned shape {values.shape} for a batch of {size} rows"
            raise self.origins.violation("scorer", self.origins.scorer(batch.scorer), what)
        if not np.isfinite(values).all():
            row = int(np.flatnonzero(~np.isfinite(values))[0])
            what = f"score() returned {values[row]} for row {row} of {size}: scores are finite"
            raise self.origins.violation("scorer", self.origins.scorer(batch.scorer), what)
        return values

    def _check_charged(self, call: Any, works: list[Work], outputs: Sequence[Any]) -> None:
        """A row whose step wrote tokens computed something: `step_work` charging it no
        query token would make the step free."""
        for i, (work, output) in enumerate(zip(works, outputs, strict=True)):
            tokens = output[0] if isinstance(output, tuple) else output
            if work.queries == 0 and not torch.equal(tokens.cpu(), call.tokens[i].cpu()):
                what = (
                    f"step_work() charged row {i} no query token for a step that wrote tokens "
                    "into it: a step is charged what its forward computed"
                )
                raise self.origins.violation("backbone", self.origins.backbone, what)

    def _check_prediction(self, i: int, prediction: Any, after: torch.Tensor, asked: bool) -> None:
        """Row i's prediction (`ReportsPredictions`): None for a row that did not ask; for one
        that did, token ids of the vocabulary, one per position, that keep every token the row
        holds after the step (its prompt, what it had committed and what the step committed,
        which is the step's own draw there)."""
        if not asked:
            if prediction is not None:
                what = (
                    f"denoise_step_with_predictions() returned a prediction for row {i}, which "
                    "did not ask for one (StepBatch.predict): a row that does not ask is "
                    "stepped, and charged, as through denoise_step"
                )
                raise self.origins.violation("backbone", self.origins.backbone, what)
            return
        ok = (
            isinstance(prediction, torch.Tensor)
            and prediction.shape == after.shape
            and prediction.dtype == after.dtype
        )
        if ok:
            pred, row = prediction.cpu(), after.cpu()
            low, high = int(pred.min()), int(pred.max())
            ok = low >= 0 and (self._vocabulary is None or high < self._vocabulary)
            kept = (row == self.backbone.mask_id) | (pred == row)
            if ok and not bool(kept.all()):
                p = int((~kept).nonzero()[0, 0])
                what = (
                    f"denoise_step_with_predictions() predicted token {int(pred[p])} at "
                    f"position {p} of row {i}, which holds {int(row[p])} after the step: a "
                    "prediction keeps the prompt and every committed token"
                )
                raise self.origins.violation("backbone", self.origins.backbone, what)
        if not ok:
            what = (
                f"denoise_step_with_predictions() returned row {i}'s prediction as "
                f"{described(prediction)}: token ids of the vocabulary, one per position of "
                "the row, in its dtype"
            )
            raise self.origins.violation("backbone", self.origins.backbone, what)

    def _check_step(self, given: Sequence[torch.Tensor], out: Sequence[torch.Tensor]) -> None:
        """A step only fills masked positions, with ids of the vocabulary: the prompt and
        committed tokens stay as they were (an edit re-masks through `ops.remask`). Checked
        over the batch's rows end to end, once per forward."""
        before = torch.cat([t.cpu() for t in given])
        after = torch.cat([t.cpu() for t in out])
        moved = (before != self.backbone.mask_id) & (after != before)
        low, high = int(after.min()), int(after.max())
        outside = low < 0 or (self._vocabulary is not None and high >= self._vocabulary)
        if not (outside or bool(moved.any())):
            return
        ends = np.cumsum([len(t) for t in given])
        if bool(moved.any()):
            at = int(moved.nonzero()[0, 0])
            i = int(np.searchsorted(ends, at, side="right"))
            p = at - (int(ends[i - 1]) if i else 0)
            what = (
                f"denoise_step() changed row {i}'s token at position {p} from {int(before[at])} "
                f"to {int(after[at])}: a step fills masked positions and leaves the prompt and "
                "committed tokens as they were"
            )
        else:
            bad = low if low < 0 else high
            i = int(np.searchsorted(ends, int((after == bad).nonzero()[0, 0]), side="right"))
            within = "" if self._vocabulary is None else f" to {self._vocabulary - 1}"
            what = (
                f"denoise_step() wrote token id {bad} in row {i}, outside the vocabulary "
                f"(ids 0{within})"
            )
        raise self.origins.violation("backbone", self.origins.backbone, what)

    async def _selector_scores(self, unit: Unit, pool: Pool, ops: Ops) -> None:
        """Score the pool for selectors that need a scorer it does not carry: each scorer once,
        on the first candidates of the largest member that needs it."""
        needed = sorted({s for m, _ in unit.members for s in m.selector_scoring()})
        for scorer in needed:
            needy = [(m, size) for m, size in unit.members if scorer in m.selector_scoring()]
            upto = min(len(pool), max(size for _, size in needy))
            owners = tuple(tuple(m.id for m, size in needy if i < size) for i in range(upto))
            rows = dataclasses.replace(pool.rows.take(range(upto)), owners=owners)
            values = await self._trusted.post(ScoreRequest(rows, scorer))
            full = np.full(len(pool), np.nan)
            full[:upto] = values
            pool.scores[scorer] = full

    # -- finishing -----------------------------------------------------------------------
    def read(self, rows: Rows) -> tuple[list[str], list[str | None], list[Any]]:
        """Every row decoded once, its answer extracted and keyed (None when invalid): what
        `judge` grades, and whose keys `ops.answers` gives a strategy (never the grades)."""
        with self.origins.blame("backbone", self.origins.backbone):
            texts = [
                self.backbone.decode(rows.tokens[i], rows.prompt_len) for i in range(len(rows))
            ]
        for text in texts:
            if not isinstance(text, str):
                what = f"decode() returned {described(text)}, not a string"
                raise self.origins.violation("backbone", self.origins.backbone, what)
        with self.origins.blame("task", self.origins.task):
            answers = [self.task.extract(text) for text in texts]
            answer_keys = [None if a is None else self.task.answer_key(a) for a in answers]
        for answer, key in zip(answers, answer_keys, strict=True):
            if answer is not None and not isinstance(answer, str):
                what = f"extract() returned {answer!r}, not a string or None"
                raise self.origins.violation("task", self.origins.task, what)
            try:
                hash(key)
            except TypeError:
                what = f"answer_key({answer!r}) returned {key!r}: not hashable (votes count keys)"
                raise self.origins.violation("task", self.origins.task, what) from None
        return texts, answers, answer_keys

    def judge(self, problem: Problem, rows: Rows) -> Judged:
        """Decode every row once, extract and key its answer, grade them all: a pool's
        candidates, and rows a strategy kept beside its pool (the collector's rollouts)."""
        texts, answers, answer_keys = self.read(rows)
        with self.origins.blame("task", self.origins.task):
            labels = self._grade([(problem, a, t) for a, t in zip(answers, texts, strict=True)])
            notes: list[str | None] = [None] * len(answers)
            if isinstance(self.task, NotesGrades):
                notes = [None if a is None else self.task.grade_note(problem, a) for a in answers]
        if any(label and a is None for a, label in zip(answers, labels, strict=True)):
            what = "grade() graded a candidate without an answer (extract gave None) correct"
            raise self.origins.violation("task", self.origins.task, what)
        return Judged(texts, answers, answer_keys, labels, notes)

    def _grade(self, items: list[tuple[Problem, str | None, str]]) -> list[bool]:
        """A pool's grades: all at once through the task's optional `grade_many` (MBPP's
        sandboxes and MATH-500's workers grade in parallel), else one `grade` at a time."""
        if not isinstance(self.task, GradesMany):
            return [bool(self.task.grade(*item)) for item in items]
        labels = [bool(x) for x in self.task.grade_many(items)]
        if len(labels) != len(items):
            what = f"grade_many() returned {len(labels)} grades for {len(items)} candidates"
            raise self.origins.violation("task", self.origins.task, what)
        return labels

    def _finish(self, unit: Unit, pool: Pool) -> list[Record]:
        """Judge the pool once; let each member method select and write its record."""
        problem = unit.problem
        judged = self.judge(problem, pool.rows)
        records = []
        for method, declared in unit.members:
            size = min(declared, len(pool))  # a capped strategy may return fewer
            # a method sees only the scores it paid for, whatever else shares its pool
            paid = set(method.selector.needs) | method.strategy.pool_scores()
            candidates = [
                Candidate(
                    index=i,
                    text=judged.texts[i],
                    answer=judged.answers[i],
                    answer_key=judged.answer_keys[i],
                    lineage=pool.rows.lineage[i],
                    scores={s: float(v[i]) for s, v in pool.scores.items() if s in paid},
                    weight=None if pool.weights is None else float(pool.weights[i]),
                )
                for i in range(size)
            ]
            chosen = self._select(problem, method, tuple(candidates), judged.labels[:size])
            self.ledger.check(problem.id, method.id, self._costs[method.id])
            records.append(self._record(problem, method, chosen, candidates, judged, pool))
            self.ledger.release(problem.id, method.id)
        return records

    def _select(
        self,
        problem: Problem,
        method: Method,
        candidates: tuple[Candidate, ...],
        labels: list[bool],
    ) -> int | None:
        """The selector's choice, once it is None or an index into `candidates`."""
        rng = numpy_rng(self.sampling.seed, problem.id, "select", method.id)
        # the selector gets copies: whatever it does to them (even dict.__setitem__ on their
        # read-only scores) never reaches the record, which is written from the originals
        shown = tuple(dataclasses.replace(c) for c in candidates)
        name = method.spec.selector
        with self.origins.blame("selector", name), self._watch.plugin():
            chosen = method.selector.select(
                shown, rng=rng, labels=tuple(labels) if method.ceiling else None
            )
            # read as a plain int here, under the watch: an int of the selector's own class
            # whose conversion or comparison runs a model is the selector's forward
            index = (
                int(chosen)
                if isinstance(chosen, int | np.integer) and not isinstance(chosen, bool)
                else None
            )
        self._watch.check("select", name, self.origins.distribution("selector", name))
        if chosen is None:
            return None
        size = len(candidates)
        if index is None:
            what = f"select() returned a {type(chosen).__name__}, not an index or None"
        elif not 0 <= index < size:
            what = f"select() returned index {index} for a pool of {size} candidates"
        else:
            return index
        raise self.origins.violation("selector", method.spec.selector, what)

    def _record(
        self,
        problem: Problem,
        method: Method,
        chosen: int | None,
        candidates: list[Candidate],
        judged: Judged,
        pool: Pool,
    ) -> Record:
        return Record(
            problem=problem.id,
            method=method.id,
            budgets=list(method.budgets),
            selected=chosen,
            answer=None if chosen is None else judged.answers[chosen],
            correct=False if chosen is None else judged.labels[chosen],
            ceiling=method.ceiling,
            candidates=[
                _candidate_record(
                    c,
                    judged.labels[c.index],
                    judged.notes[c.index],
                    pool.rows,
                    self.sampling.total_steps,
                )
                for c in candidates
            ],
            ledger=self.ledger.entry(problem.id, method.id),
            info=pool.info,
        )


def capped(method: Method, backbone: Backbone, origins: Origins | None = None) -> bool:
    """Whether a method's cost is a cap: its strategy is `Capped`, or the backbone's own
    settings let rows end early (what the backbone raises saying so is its own fault)."""
    if is_capped(method.strategy):
        return True
    origins = origins or Origins()
    with origins.blame("backbone", origins.backbone):
        return bool(finishes_early(backbone, {}))


@dataclass(frozen=True)
class _Scoring:
    """One scoring forward: the scorer's run name and its batch."""

    scorer: str
    batch: ScoreBatch

    @property
    def tokens(self) -> Sequence[torch.Tensor]:
        return self.batch.tokens


def _candidate_record(
    candidate: Candidate, correct: bool, note: str | None, rows: Rows, total_steps: int
) -> CandidateRecord:
    """A candidate as `samples.jsonl` records it, with its own sampler settings (and T) and
    its canvas edits when it had any."""
    record = CandidateRecord(
        text=candidate.text,
        answer=candidate.answer,
        valid=candidate.answer_key is not None,
        key=None if candidate.answer_key is None else str(candidate.answer_key),
        correct=correct,
        scores=dict(candidate.scores),
        weight=candidate.weight,
        lineage=list(candidate.lineage),
    )
    if note is not None:
        record["grade_note"] = note
    i = candidate.index
    own = rows.setting(i)
    if rows.totals and rows.totals[i] != total_steps:
        own["steps"] = rows.totals[i]
    if own:
        record["settings"] = own
    if rows.edits[i]:
        record["edits"] = [[step, list(positions)] for step, positions in rows.edits[i]]
    return record


def _identical(rows: Iterable[tuple[Any, ...]]) -> list[list[int]]:
    """Group rows whose forward is the same computation: equal key or step fields and equal
    tokens (the last field). Groups are in order of first appearance."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n, (*fields, tokens) in enumerate(rows):
        groups.setdefault((*fields, tokens.numpy().tobytes()), []).append(n)
    return list(groups.values())


def _charged(owners: list[tuple[str, Owners]], same: list[int]) -> tuple[str, Owners]:
    """(problem id, owners) of one computed row: every owner of every row it stands for."""
    return owners[same[0]][0], tuple(o for n in same for o in owners[n][1])


def _computed(wait: Wait) -> Iterable[int]:
    """The rows of a request a round computes."""
    return wait.computed() if isinstance(wait, DenoiseWait) else range(len(wait.rows))


def _vocabulary(backbone: Backbone) -> int | None:
    """How many token ids a transformer backbone's embedding holds; None for another."""
    if not isinstance(backbone, TransformerBackbone):
        return None
    embedding = backbone.transformer.get_input_embeddings()
    return int(embedding.num_embeddings) if embedding is not None else None
