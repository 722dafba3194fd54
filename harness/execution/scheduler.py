"""The engine's queues: which strategy coroutines are ready, which wait for a forward, which
problems are in flight, and how waiting rows are cut into batches.

A strategy coroutine runs until it awaits `ops.denoise` or `ops.score`; its request then waits
here. When no coroutine is ready, the engine serves one round (`Scheduler.round`): every
waiting scoring request, grouped by scorer (once a scorer has a forward's worth of rows or the
oldest problem waits for one), or else one denoising step of the oldest problems' denoising
requests, whole problems in admission order until the round holds
`Capacity.round_batches` forwards' worth of rows. Problems therefore finish roughly in the order
they came in, a steady stream of records, rather than all together. A request that has had all
it asked for makes its coroutine ready again, with the answer to send it.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dllmbench.api.ops import DenoiseRequest, Posted, ScoreRequest
from dllmbench.core.errors import PluginViolation, blame
from dllmbench.core.types import Pool, Rows
from dllmbench.execution.watch import ComputeWatch

if TYPE_CHECKING:
    from dllmbench.execution.engine import Unit


@dataclass(frozen=True)
class Capacity:
    """How much work one forward and the engine may hold at once."""

    batch_rows: int = 64  # rows per physical forward
    batch_tokens: int | None = None  # rows × canvas length per forward
    problems: int = 32  # problems in flight
    # a denoising round serves the oldest problems until it holds this many forwards' rows
    round_batches: int = 4

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.problems < 1 or self.round_batches < 1:
            raise ValueError("batch_rows, problems and round_batches must be >= 1")

    def round_full(self, rows: int, tokens: int) -> bool:
        """Whether a denoising round of `rows` rows computing `tokens` tokens (rows × canvas)
        fills `round_batches` forwards: by rows, or by tokens when `batch_tokens` caps them."""
        if rows >= self.round_batches * self.batch_rows:
            return True
        return self.batch_tokens is not None and tokens >= self.round_batches * self.batch_tokens

    def batches(
        self, lengths: Sequence[int], canvases: Sequence[int] | None = None
    ) -> list[list[int]]:
        """Indices sorted by canvas length, cut into batches within the row and token caps.

        As many batches as filling each to the row cap takes, cut where they compute the
        fewest tokens (rows × the widest row of each batch: `_least_padding`); filled in
        order when that cut would break the token cap. `canvases` (one id per index) names
        the rows whose forward the backbone shares (`SharesCanvases`): they sit side by side,
        and a batch computes each canvas of it once, so the cut keeps them together where
        it can."""
        key = (lambda i: lengths[i]) if canvases is None else (lambda i: (lengths[i], canvases[i]))
        order = sorted(range(len(lengths)), key=key)
        if not order:
            return []
        shared = None if canvases is None else [canvases[i] for i in order]
        cut = _least_padding([lengths[i] for i in order], self.batch_rows, shared)
        if self.batch_tokens is None or all(
            len(b) * lengths[order[b[-1]]] <= self.batch_tokens for b in cut
        ):
            return [[order[k] for k in b] for b in cut]
        return self._filled(order, lengths)

    def _filled(self, order: list[int], lengths: Sequence[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            too_many = len(current) >= self.batch_rows
            too_wide = (
                self.batch_tokens is not None
                and (len(current) + 1) * lengths[i] > self.batch_tokens
            )
            if current and (too_many or too_wide):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches


def _size(waits: Sequence[DenoiseWait]) -> tuple[int, int]:
    """Rows and tokens (rows × canvas length) the next step of `waits` computes."""
    rows = [len(w.computed()) for w in waits]
    return sum(rows), sum(n * w.tokens.shape[1] for n, w in zip(rows, waits, strict=True))


def _least_padding(
    ascending: Sequence[int], rows: int, canvases: Sequence[int] | None = None
) -> list[list[int]]:
    """Positions 0..n−1 of ascending lengths cut into the fewest batches of at most `rows`
    (⌈n / rows⌉), contiguous, so that Σ canvases computed × the batch's last (widest) length
    is least: a dynamic programme over (batches, rows covered), one vector step per batch
    size. A batch computes each of its rows, or each run of equal `canvases` ids once."""
    n = len(ascending)
    if n <= rows:  # one batch holds them all: the only cut
        return [list(range(n))]
    widths = np.asarray(ascending, dtype=np.int64)
    # new[k]: canvases begun at positions 1..k, so positions a..b−1 compute
    # new[b−1] − new[a] + 1 canvases
    ids = np.arange(n) if canvases is None else np.asarray(canvases)
    new = np.concatenate([[0], np.cumsum(ids[1:] != ids[:-1])])
    never = np.iinfo(np.int64).max // 4
    best = np.full(n + 1, never, dtype=np.int64)
    best[0] = 0
    choices = []
    for _ in range(-(-n // rows)):
        step = np.full(n + 1, never, dtype=np.int64)
        size = np.zeros(n + 1, dtype=np.int64)
        for d in range(1, min(rows, n) + 1):
            # the batch ending at j = d..n holds positions j−d..j−1
            computed = new[d - 1 :] - new[: n - d + 1] + 1
            cost = best[:-d] + computed * widths[d - 1 :]
            better = cost < step[d:]
            step[d:][better] = cost[better]
            size[d:][better] = d
        best = np.minimum(step, never)
        choices.append(size)
    batches, end = [], n
    for size in reversed(choices):
        d = int(size[end])
        batches.append(list(range(end - d, end)))
        end -= d
    return batches[::-1]


@dataclass
class StrategyRun:
    """One strategy coroutine: a unit of the engine on one problem, and who wrote it."""

    unit: Unit
    coroutine: Coroutine[Any, Any, Pool]
    strategy: str  # the strategy plugin's name, to name it when it misbehaves
    distribution: str | None = None


@dataclass
class DenoiseWait:
    """A denoising request being served: each row advances one step per round until it has
    taken the steps asked of it (but for the rows whose result an earlier run's request
    already gave: `reused`)."""

    run: StrategyRun
    rows: Rows
    asked: tuple[int, ...]  # steps each row asked for
    tokens: torch.Tensor = field(init=False)
    steps: list[int] = field(init=False)
    remaining: list[int] = field(init=False)
    rng_keys: tuple[int, ...] = field(init=False)
    confidence: torch.Tensor | None = field(init=False)
    prediction: torch.Tensor | None = field(init=False)  # each row's latest step's x0
    predicted: list[int] = field(init=False)  # the step that made each row's prediction
    reused: set[int] = field(init=False, default_factory=set)
    # what each row's steps of this request cost: passes, and FLOPs (None: unknown)
    passes: list[int] = field(init=False)
    flops: list[int | None] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.rows.tokens.clone()
        self.steps = list(self.rows.steps)
        self.remaining = list(self.asked)
        self.passes = [0] * len(self.asked)
        self.flops = [0] * len(self.asked)
        self.rng_keys = self.rows.rng_keys
        conf = self.rows.confidence
        self.confidence = None if conf is None else conf.clone()
        pred = self.rows.prediction
        self.prediction = None if pred is None else pred.clone()
        self.predicted = list(self.rows.predicted)

    def computed(self) -> list[int]:
        """The rows the next round computes."""
        return [i for i in range(len(self.rows)) if i not in self.reused and self.remaining[i] > 0]

    def settings(self, i: int) -> dict[str, Any]:
        return self.rows.setting(i)

    def edited(self, i: int) -> bool:
        return bool(self.rows.edits[i])

    @property
    def predicts(self) -> bool:
        """Whether the rows ask for each step's predictions (`ReportsPredictions`)."""
        return self.prediction is not None

    def same_computation(self, i: int) -> tuple[Any, ...]:
        """What makes row i's step one computation: its key, step, T, settings, whether it
        was edited, whether it asks for its prediction (which computes, and is charged, more
        of the head), its prompt and its tokens."""
        rows = self.rows
        return (
            self.rng_keys[i],
            self.steps[i],
            rows.totals[i],
            rows.settings[i],
            self.edited(i),
            self.predicts,
            rows.prompt_len,
            self.tokens[i],
        )

    def spent(self, i: int, passes: int, flops: int | None) -> None:
        """Row i's step cost `passes` passes and `flops` FLOPs."""
        self.passes[i] += passes
        previous = self.flops[i]
        self.flops[i] = None if previous is None or flops is None else previous + flops

    def end(self, i: int) -> None:
        """Row i ended before its T (nothing left masked): it stands at its T, steps no more."""
        self.steps[i] = self.rows.totals[i]
        self.remaining[i] = 0

    def put(self, i: int, output: Any) -> None:
        """Row i's step: its tokens, and (a tuple) the confidences of what it committed and
        its prediction, where the backbone gave them."""
        parts = tuple(output) if isinstance(output, tuple) else (output,)
        tokens, confidence, prediction = (*parts, None, None)[:3]
        self.tokens[i] = tokens
        if self.confidence is not None and confidence is not None:
            new = confidence.to(self.confidence.device, self.confidence.dtype)
            self.confidence[i] = torch.where(torch.isnan(new), self.confidence[i], new)
        if self.prediction is not None and prediction is not None:
            self.prediction[i] = prediction.to(self.prediction.device)
            self.predicted[i] = self.steps[i]
        self.steps[i] += 1

    def served(self) -> bool:
        """One round is over (it computed `computed()`); True when every row has taken the
        steps it asked for."""
        for i in self.computed():
            self.remaining[i] -= 1
        return not any(self.remaining)  # reused rows have none left

    def answer(self) -> Rows:
        return self.rows.advanced(
            self.tokens, self.steps, self.confidence, self.prediction, self.predicted
        )


@dataclass
class ScoreWait:
    """A scoring request being served: one float per row, in one round."""

    run: StrategyRun
    rows: Rows
    scorer: str
    values: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.values = np.empty(len(self.rows))

    @property
    def tokens(self) -> torch.Tensor:
        return self.rows.tokens

    @property
    def steps(self) -> tuple[int, ...]:
        return self.rows.steps

    def same_computation(self, i: int) -> tuple[Any, ...]:
        """What makes row i's score one computation: problem, step, T, prompt and tokens."""
        rows = self.rows
        total = rows.totals[i] if rows.totals else None
        return (rows.problem.id, rows.steps[i], total, rows.prompt_len, self.tokens[i])

    def put(self, i: int, value: float) -> None:
        self.values[i] = value

    def served(self) -> bool:
        return True

    def answer(self) -> np.ndarray:
        return self.values


Wait = DenoiseWait | ScoreWait


class FinishedRows:
    """Denoised rows kept from one engine run for the next: a row's tokens after a request's
    steps, by what fixes them (problem, noise key, step, steps asked, prompt, tokens at the
    start). A run at a larger budget repeats the rows a smaller budget's run computed (keyed
    noise gives them the same tokens): it takes them from here instead of computing them
    again. Kept on the CPU; `clear()` once no run follows."""

    def __init__(self) -> None:
        self.keeping = False
        # key → (tokens, step, confidence, prediction, passes, FLOPs) of the row after the
        # request; the prediction (with the step that made it) only for rows that ask for it
        self._rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    @staticmethod
    def _keys(wait: DenoiseWait, rows: list[int]) -> dict[int, tuple[Any, ...]]:
        """Each row's key; the start tokens come to the CPU once per request, not per row."""
        start = wait.rows.tokens.detach().to("cpu").numpy()
        problem, prompt_len = wait.rows.problem.id, wait.rows.prompt_len
        return {
            i: (
                problem,
                wait.rng_keys[i],
                wait.rows.steps[i],
                wait.asked[i],
                wait.rows.totals[i],
                wait.rows.settings[i],
                wait.edited(i),
                wait.predicts,
                prompt_len,
                hashlib.blake2b(start[i].tobytes(), digest_size=16).digest(),
            )
            for i in rows
        }

    def fill(self, wait: DenoiseWait, charge: Reuse | None = None) -> None:
        """Give `wait` every row kept from an earlier run; those rows are not computed, and
        `charge` charges each what it cost then (passes, FLOPs)."""
        if not self._rows:
            return
        for i, key in self._keys(wait, list(range(len(wait.rows)))).items():
            kept = self._rows.get(key)
            if kept is not None:
                tokens, steps, confidence, prediction, passes, flops = kept
                wait.passes[i], wait.flops[i] = passes, flops
                if charge is not None:
                    charge(wait, i, passes, flops)
                wait.tokens[i] = tokens.to(wait.tokens.device)
                wait.steps[i] = steps
                if wait.confidence is not None and confidence is not None:
                    new = confidence.to(wait.confidence.device)
                    wait.confidence[i] = torch.where(torch.isnan(new), wait.confidence[i], new)
                if wait.prediction is not None and prediction is not None:
                    wait.prediction[i] = prediction[0].to(wait.prediction.device)
                    wait.predicted[i] = prediction[1]
                wait.remaining[i] = 0
                wait.reused.add(i)

    def keep(self, wait: DenoiseWait) -> None:
        """Keep the rows `wait` computed, for a later run (while `keeping`)."""
        if not self.keeping:
            return
        final = wait.tokens.to("cpu", copy=True)
        start = wait.rows.tokens.to("cpu")
        conf = None if wait.confidence is None else wait.confidence.to("cpu", copy=True)
        pred = None if wait.prediction is None else wait.prediction.to("cpu", copy=True)
        computed = [i for i in range(len(wait.rows)) if i not in wait.reused]
        for i, key in self._keys(wait, computed).items():
            # the confidence of what the request committed (NaN where it committed nothing)
            new = None if conf is None else conf[i].masked_fill(final[i] == start[i], torch.nan)
            made = None if pred is None else (pred[i], wait.predicted[i])
            kept = (final[i], wait.steps[i], new, made, wait.passes[i], wait.flops[i])
            self._rows[key] = kept

    def clear(self) -> None:
        self._rows.clear()


class Trusted:
    """Requests the engine itself posts from inside a strategy run (the scores selectors need),
    whose rows may be charged to some of the methods that own them: those that need the
    score. Every other request's rows are charged to the owners `ops.start` gave them."""

    def __init__(self) -> None:
        self._requests: dict[int, ScoreRequest] = {}

    def post(self, request: ScoreRequest) -> Posted:
        self._requests[id(request)] = request
        return Posted(request)

    def take(self, request: Any) -> bool:
        """Whether the engine posted `request` (each is taken once)."""
        return self._requests.pop(id(request), None) is request


# charges a row kept from an earlier run: (request, row, passes, FLOPs)
Reuse = Callable[[DenoiseWait, int, int, "int | None"], None]


class Scheduler:
    """The queue state of one engine run."""

    def __init__(
        self,
        capacity: Capacity,
        finished: FinishedRows | None = None,
        charge_reused: Reuse | None = None,
        watch: ComputeWatch | None = None,
        trusted: Trusted | None = None,
    ):
        self.capacity = capacity
        self.watch = watch if watch is not None else ComputeWatch()
        self.trusted = trusted if trusted is not None else Trusted()
        self.kept_rows = finished if finished is not None else FinishedRows()
        self._charge_reused = charge_reused
        self.ready: deque[tuple[StrategyRun, Any]] = deque()
        self.waiting: list[Wait] = []
        self._units_left: Counter[str] = Counter()  # problem id → unfinished strategy runs

    @property
    def busy(self) -> bool:
        return bool(self.ready or self.waiting)

    @property
    def has_room(self) -> bool:
        return len(self._units_left) < self.capacity.problems

    def in_flight(self, problem_id: str) -> bool:
        return problem_id in self._units_left

    def admit(self, runs: Sequence[StrategyRun]) -> None:
        """Start the strategy runs of one problem."""
        for run in runs:
            self._units_left[run.unit.problem.id] += 1
            self.ready.append((run, None))

    def resume(self) -> Iterator[tuple[StrategyRun, Any]]:
        """Resume ready coroutines until each has posted a request or finished; yield each
        finished run with what it returned. Runs admitted meanwhile are resumed too."""
        while self.ready:
            run, value = self.ready.popleft()
            try:
                with blame("strategy", run.strategy, run.distribution), self.watch.plugin():
                    request = run.coroutine.send(value)
            except StopIteration as stop:
                self.watch.check("search", run.strategy, run.distribution)
                yield run, stop.value
                continue
            self.watch.check("search", run.strategy, run.distribution)
            with self.watch.plugin():  # reading the request runs code of the plugin's values
                wait = self._wait(run, request)
            self.watch.check("search", run.strategy, run.distribution)
            if isinstance(wait, DenoiseWait):
                self.kept_rows.fill(wait, self._charge_reused)
                if not wait.computed():  # every row kept from an earlier run: answered now
                    self.ready.append((run, wait.answer()))
                    continue
            self.waiting.append(wait)

    def close(self) -> None:
        """Close every strategy run still queued or waiting (a run that stopped early): a
        coroutine never resumed again is closed, not left to warn when it is collected."""
        runs = [run for run, _ in self.ready] + [wait.run for wait in self.waiting]
        self.ready.clear()
        self.waiting.clear()
        for run in runs:
            run.coroutine.close()

    @staticmethod
    def _check_owners(run: StrategyRun, rows: Rows, trusted: bool) -> None:
        """Each row is charged to the methods `ops.start` gave its first ancestor (the engine's
        own scores for selectors: to some of them, never to none)."""
        for owners, lineage in zip(rows.owners, rows.lineage, strict=True):
            given = run.unit.owner_of(lineage[0]) if lineage else ()
            fits = set(owners) <= set(given) if trusted else tuple(owners) == given
            if not (fits and owners):
                what = (
                    f"asked for a forward of a row charged to {list(owners)}, not to the "
                    f"methods that own it ({list(given)}): rows are charged as ops.start "
                    "gave them"
                )
                if lineage and not given:  # a copy beyond every pool of nested members
                    what = (
                        f"asked for a forward of copy {lineage[0]} of ops.start, which belongs "
                        "to no method: with prefix_field set, copy i belongs to the methods "
                        "whose pool is larger than i; start at most pool_size() copies"
                    )
                raise PluginViolation(run.strategy, run.distribution, what)

    def finished(self, run: StrategyRun) -> bool:
        """Count a finished run; True when it was its problem's last (the problem leaves)."""
        problem = run.unit.problem.id
        self._units_left[problem] -= 1
        if self._units_left[problem]:
            return False
        del self._units_left[problem]
        return True

    def round(self) -> list[list[Wait]]:
        """What to serve next, one group per physical kind: every scoring request (a group per
        scorer, by name) when `_score_now`, else one denoising step of the oldest problems.

        A denoising round takes whole problems, every denoising request of each, in the order
        they were admitted, until it fills `Capacity.round_batches` forwards (`round_full`);
        the problems after wait for a later round. The oldest problems thus move every round
        and finish first, and a problem's rows stay in one round, where identical rows are
        computed once."""
        scoring = [w for w in self.waiting if isinstance(w, ScoreWait)]
        if scoring and self._score_now(scoring):
            names = sorted({w.scorer for w in scoring})
            return [[w for w in scoring if w.scorer == name] for name in names]
        by_problem: dict[str, list[DenoiseWait]] = {}
        for wait in self.waiting:
            if isinstance(wait, DenoiseWait):
                by_problem.setdefault(wait.rows.problem.id, []).append(wait)
        sizes = {p: _size(waits) for p, waits in by_problem.items()}
        order = [p for p in self._admitted() if p in by_problem]
        # the shortest prefix that fills the round, or up to twice that if a longer one
        # leaves fewer empty rows in its last forward
        cap, rows, tokens = self.capacity, 0, 0
        best: tuple[float, int] | None = None
        for n, problem in enumerate(order, 1):
            rows, tokens = rows + sizes[problem][0], tokens + sizes[problem][1]
            if not cap.round_full(rows, tokens):
                continue
            fill = rows / (cap.batch_rows * -(-rows // cap.batch_rows))
            if best is None or fill > best[0]:
                best = (fill, n)
            if fill == 1.0 or cap.round_full(rows // 2, tokens // 2):
                break
        taken = order[: best[1] if best else len(order)]
        return [[w for p in taken for w in by_problem[p]]]

    def _admitted(self) -> list[str]:
        """The problems with waiting requests, oldest first: in admission order (any not
        admitted through `admit` after, in request order)."""
        waiting = {w.rows.problem.id: None for w in self.waiting}
        return [p for p in self._units_left if p in waiting] + [
            p for p in waiting if p not in self._units_left
        ]

    def _score_now(self, scoring: list[ScoreWait]) -> bool:
        """Whether to serve the waiting scoring requests now rather than a denoising round:
        when one scorer has a forward's worth of rows, when the oldest problem waits for a
        score, or when nothing waits to be denoised."""
        if len(scoring) == len(self.waiting):
            return True
        oldest = self._admitted()[0]
        if any(w.rows.problem.id == oldest for w in scoring):
            return True
        rows: Counter[str] = Counter()
        for wait in scoring:
            rows[wait.scorer] += len(wait.rows)
        return max(rows.values()) >= self.capacity.batch_rows

    def served(self, groups: list[list[Wait]]) -> None:
        """After a round: a request that had all it asked for readies its coroutine."""
        done = {id(w) for group in groups for w in group if w.served()}
        for wait in self.waiting:
            if id(wait) in done:
                if isinstance(wait, DenoiseWait):
                    self.kept_rows.keep(wait)
                self.ready.append((wait.run, wait.answer()))
        self.waiting = [w for w in self.waiting if id(w) not in done]

    def _wait(self, run: StrategyRun, request: Any) -> Wait:
        if type(request) in (DenoiseRequest, ScoreRequest):  # not a class of the plugin's own
            if type(request.rows) is not Rows:
                what = f"search() posted a request of {type(request.rows).__name__}, not Rows"
                raise PluginViolation(run.strategy, run.distribution, what)
            if request.rows.problem.id != run.unit.problem.id:
                what = (
                    f"search() asked for a forward of rows of problem "
                    f"{request.rows.problem.id!r} while serving problem "
                    f"{run.unit.problem.id!r}: a search computes only its own problem's rows"
                )
                raise PluginViolation(run.strategy, run.distribution, what)
            self._check_owners(run, request.rows, self.trusted.take(request))
            steps = request.steps if type(request) is DenoiseRequest else ()
            odd = _not_plain(request.rows, steps)
            if odd is not None:
                what = (
                    f"search() asked for a forward of rows whose {odd}: what the backbone or a "
                    "scorer reads in its forward is plain tensors, ints, floats, strings and bools"
                )
                raise PluginViolation(run.strategy, run.distribution, what)
        if type(request) is DenoiseRequest:
            return DenoiseWait(run, request.rows, tuple(request.steps))
        if type(request) is ScoreRequest:
            return ScoreWait(run, request.rows, request.scorer)
        raise PluginViolation(
            run.strategy,
            run.distribution,
            f"search() awaited a {type(request).__name__}; await only ops.denoise or ops.score",
        )


PLAIN = (bool, int, float, str, type(None))


def _not_plain(rows: Rows, steps: Any) -> str | None:
    """What of a request's rows, read inside the engine's forward (tokens, prompt length,
    steps, each row's T and sampler settings), is not a plain value, whose own code would run
    there, unwatched; None when all are."""
    if type(rows.tokens) is not torch.Tensor:
        return f"tokens are a {type(rows.tokens).__name__}, not a torch.Tensor"
    if rows.confidence is not None and type(rows.confidence) is not torch.Tensor:
        return f"confidences are a {type(rows.confidence).__name__}, not a torch.Tensor"
    if rows.prediction is not None and type(rows.prediction) is not torch.Tensor:
        return f"predictions are a {type(rows.prediction).__name__}, not a torch.Tensor"
    if type(rows.predicted) is not tuple or any(type(v) is not int for v in rows.predicted):
        return "predicted steps are not a tuple of ints"
    if type(rows.prompt_len) is not int:
        return f"prompt length is a {type(rows.prompt_len).__name__}, not an int"
    for name, values in (("steps", steps), ("steps", rows.steps), ("totals", rows.totals)):
        if type(values) is not tuple or any(type(v) is not int for v in values):
            return f"{name} are not a tuple of ints"
    if type(rows.settings) is not tuple:
        return "settings are not a tuple"
    for row in rows.settings:
        if type(row) is not tuple:
            return "settings are not pairs of a name and a value"
        for pair in row:
            if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:
                return "settings are not pairs of a name and a value"
            if type(pair[1]) not in PLAIN:
                return f"setting {pair[0]!r} is a {type(pair[1]).__name__}, not a plain value"
    return None
