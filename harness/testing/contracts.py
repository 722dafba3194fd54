"""Contract checks every plugin must pass, parametrised over every registered plugin.

Run them on every installed plugin with `pytest --pyargs dllmbench.testing.contracts`;
`-k NAME` selects your plugin's checks (built-ins always load; DLLMBENCH_PLUGINS=your-dist
leaves out other third-party packages). A factory may carry `contract_configs`, a list of
configurations to check (default: one, the defaults). Backbone, scorer and task checks run
over the registered ones; set DLLMBENCH_PLUGIN_MODULES=dllmbench.testing.doubles to include
the doubles as well.

Strategies and selectors run through the real engine on the deterministic doubles of
`dllmbench.testing.doubles`, at several T: 3, 12 and the first of 40, 130, 260 at which the
strategy denoises in more than one call (so that its pruning or resampling code runs).
Backbones, scorers and tasks are checked through their own interfaces. Each check is a plain
function of `(name, config)`; a failure is an AssertionError whose message says what broke,
and a check that does not apply to a plugin skips, saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dllmbench.analysis.evidence import UnreadableEvidence, read_method, run_data
from dllmbench.api.interfaces import (
    CountsStepWork,
    GradesMany,
    ScoreBatch,
    SearchStrategy,
    SizedBySteps,
    StepBatch,
    commit_orders,
    contract_backbone,
    contract_configs,
    evidence_of,
    finishes_early,
    is_capped,
    is_deterministic,
    pool_size_of,
    reports_predictions,
    row_settings,
    sets_per_row,
)
from dllmbench.core.errors import CostMismatch, OverCap, PluginViolation
from dllmbench.core.keys import row_key
from dllmbench.core.types import Candidate, Pool, Problem, Prompt
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.provenance import Origins, config_data
from dllmbench.loading.registry import options, registry
from dllmbench.testing.doubles import ToyBackbone, ToySum
from dllmbench.testing.elsewhere import as_data, pair_key, records_elsewhere
from dllmbench.testing.helpers import (
    GEN_LENGTH,
    PROBLEMS,
    STEPS,
    make_candidate,
    make_candidates,
    run_methods,
)

BASE_STEPS = (3, STEPS)  # fewer steps than generated tokens, and the usual 12
LONG_STEPS = (40, 130, 260)  # tried in turn until the strategy denoises in several calls
Key = tuple[int, str, str]  # (T, problem id, method id)
# the toy backbone with a confidence threshold: rows fill their canvas and end before their T
# (as a block model's, Fast-dLLM's or EB-Sampler's may), on some problems all of them
EARLY = {"threshold": 0.5}


def comparable(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record without what legitimately varies between runs (timings, batch counts)."""
    out = {k: v for k, v in record.items() if k != "ledger"}
    out["passes"] = record["ledger"]["passes"]
    return out


# -- running strategies, observed --------------------------------------------------------------


@dataclass
class Seen:
    """What one strategy run on one problem returned, noted by `Observed`."""

    problem: str
    steps: int  # the run's T
    returned: int  # candidates in the pool
    denoise_calls: int
    scores: dict[str, np.ndarray]


class Observed:
    """A strategy seen through a one-way mirror: the same search, with what it did noted.

    With `hide_pool_scores` it claims no pool scores and strips them from its pools, so the
    engine scores the final candidates itself (to compare with what the pool claimed)."""

    def __init__(self, inner: SearchStrategy, *, hide_pool_scores: bool = False):
        self.inner = inner
        self.hide = hide_pool_scores
        self.seen: list[Seen] = []

    def __getattr__(self, name: str) -> Any:  # config, scorers, prefix_field, cost, pool_size
        return getattr(self.inner, name)

    def pool_scores(self) -> frozenset[str]:
        return frozenset() if self.hide else self.inner.pool_scores()

    async def search(self, problem: Problem, ops: Any) -> Pool:
        calls = 0
        denoise = ops.denoise

        async def counted(rows: Any, steps: int | None = None) -> Any:
            nonlocal calls
            calls += 1
            return await denoise(rows, steps)

        ops.denoise = counted
        pool = await self.inner.search(problem, ops)
        if not isinstance(pool, Pool):
            return pool  # the engine refuses it
        scores = {k: np.asarray(v, np.float64).reshape(-1) for k, v in pool.scores.items()}
        self.seen.append(Seen(problem.id, ops.T, len(pool), calls, scores))
        if self.hide:
            claimed = self.inner.pool_scores()
            pool.scores = {k: v for k, v in pool.scores.items() if k not in claimed}
        return pool


class Reads:
    """A selector that reads the given scorers on every candidate and picks the first."""

    ceiling = False
    config = None

    def __init__(self, needs: Sequence[str]):
        self.needs = tuple(needs)

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        return 0 if candidates else None


def host(declares: str, size: int | None = None) -> tuple[str, dict[str, Any]]:
    """A registered strategy the kit runs beside a plugin, or under a selector, chosen by what
    it declares (`Evidence`: `plain` nested samples, `cuts`, `particles`), never by name: the
    first in name order, with its nested size set to `size` (other hosts at their defaults)."""
    for name in registry().names("strategy"):
        try:
            declared = evidence_of(registry().strategy(name))
        except Exception:  # a strategy that needs options is no host
            continue
        if not getattr(declared, declares):
            continue
        if declared.nested and size is not None:
            return name, {declared.nested: size}
        return name, {}
    raise AssertionError(f"the kit needs a registered strategy declaring {declares}")


def built(kind: str, name: str, *, shared: dict[str, Any] | None = None, **config: Any) -> Any:
    """The plugin built from its configuration as a run builds it (`shared`: the run objects
    a scorer's factory may ask for); a failure (an option its Config refuses, a member its
    kind's Protocol lacks, an exception in its factory) is an AssertionError naming it, in one
    line.

    A backbone with a `device` option that its configuration leaves out is built on the CPU:
    the checks compare a row alone with the row in a batch exactly, and a GPU's kernels, picked
    by the batch's shape, round a batch of other rows differently in their last bits (which a
    run allows: docs/scaling.md). A configuration that names a device is built there."""
    __tracebackhide__ = True
    try:
        factory = registry().info(kind, name).factory if kind == "backbone" else None
        if factory is not None and "device" not in config and "device" in options(factory):
            config = {**config, "device": "cpu"}
        return registry().build(kind, name, shared=shared, **config)
    except Exception as exc:
        raise AssertionError(f"{kind} {name!r} with {config}: {explain(exc)}") from None


def kit_method(
    strategy: str,
    config: dict[str, Any],
    selector: str = "first",
    selector_config: dict[str, Any] | None = None,
    *,
    reads: Sequence[str] = (),
    hide_pool_scores: bool = False,
) -> Method:
    """A method whose strategy is `Observed`; with `reads`, its selector is `Reads(reads)`."""
    spec = MethodSpec(strategy, dict(config), selector, dict(selector_config or {}))
    searcher = built("strategy", strategy, **config)
    chosen = Reads(reads) if reads else built("selector", selector, **spec.selector_config)
    observed = Observed(searcher, hide_pool_scores=hide_pool_scores)
    return Method(spec.text(), spec, observed, chosen)  # type: ignore[arg-type]


def seen(method: Method) -> list[Seen]:
    strategy = method.strategy
    return strategy.seen if isinstance(strategy, Observed) else []


def explain(exc: BaseException) -> str:
    """An exception as one readable line: its type, message and where it was raised."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 400 else text[:400] + "…"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, PluginViolation):  # it names the plugin and what broke (a crash: where)
        where = ""
    hint = ""
    if isinstance(exc, OverCap):
        hint = "; a capped strategy may spend less than cost(T), never more, on every problem"
    elif isinstance(exc, CostMismatch):
        hint = "; cost(T) must equal what search charges through ops, on every problem and T"
    return f"{type(exc).__name__}: {text}{where}{hint}"


def run_kit(
    methods: Sequence[Method],
    steps: Sequence[int],
    *,
    batch_rows: int = 64,
    seed: int = 0,
    problems: int = PROBLEMS,
    backbone: Mapping[str, Any] | None = None,
) -> dict[Key, dict[str, Any]]:
    """Run methods on the toy task at each T; records (without timings) by (T, problem,
    method). Anything the run raises becomes an AssertionError naming it, in one line.
    `backbone`: options of the toy backbone (`EARLY`: its rows may end before their T)."""
    __tracebackhide__ = True  # pytest shows the check's line and this message
    out: dict[Key, dict[str, Any]] = {}
    for total in steps:
        try:
            records = run_methods(
                methods,
                steps=total,
                problems=problems,
                seed=seed,
                batch_rows=batch_rows,
                backbone=backbone,
            )
        except Exception as exc:
            ids = ", ".join(m.id for m in methods)
            raise AssertionError(f"{ids} at T={total}: {explain(exc)}") from None
        out.update({(total, r["problem"], r["method"]): comparable(r) for r in records})
    return out


@cache
def _steps(strategy: str, config_json: str) -> tuple[int, ...]:
    config = json.loads(config_json)
    for total in LONG_STEPS:
        method = kit_method(strategy, config)
        try:
            run_kit([method], (total,), problems=2)
        except AssertionError:
            return (*BASE_STEPS, total)  # the checks themselves report it
        if max((s.denoise_calls for s in seen(method)), default=0) > 1:
            return (*BASE_STEPS, total)
    return (*BASE_STEPS, LONG_STEPS[0])


def steps_for(strategy: str, config: dict[str, Any]) -> tuple[int, ...]:
    """The T values a strategy is checked at: 3, 12 and the first of `LONG_STEPS` at which
    it denoises in more than one call (40 when it never does)."""
    return _steps(strategy, json.dumps(config, sort_keys=True))


@contextlib.contextmanager
def global_seed(seed: int) -> Iterator[None]:
    """Seed Python's, numpy's and torch's global generators; restore them afterwards."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


# -- readable differences ----------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in [*a, *(k for k in b if k not in a)]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                out.append(f"{sub}: only in the {'first' if k in a else 'second'} run")
            else:
                out += _diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {_short(a)} != {_short(b)}"]


def diff_records(
    first: dict[Key, dict[str, Any]],
    second: dict[Key, dict[str, Any]],
    *,
    limit: int = 8,
    per_record: int = 3,
) -> str:
    """The first differences between two runs' records, one line each (at most `per_record`
    for one record, `limit` in all)."""
    lines = []
    for key in sorted(set(first) | set(second), key=str):
        where = f"T={key[0]} problem {key[1]!r} method {key[2]!r}"
        if key not in first or key not in second:
            lines.append(f"{where}: only in the {'first' if key in first else 'second'} run")
            continue
        found = _diff(first[key], second[key], "")
        lines += [f"{where}: {d}" for d in found[:per_record]]
        if len(found) > per_record:
            lines.append(f"{where}: ... {len(found) - per_record} more here")
    more = len(lines) - limit
    return "\n".join(
        ["  " + line for line in lines[:limit]] + ([f"  ... {more} more lines"] if more > 0 else [])
    )


def assert_same(
    first: dict[Key, dict[str, Any]], second: dict[Key, dict[str, Any]], what: str
) -> None:
    __tracebackhide__ = True
    if first != second:
        raise AssertionError(
            f"{what}; first differences (first run != second run):\n" + diff_records(first, second)
        )


# -- strategies ------------------------------------------------------------------------------


def test_strategy_spends_what_it_declares(dllmbench_strategy):
    """The ledger check passes at every T, and each record's passes equal `cost(T)`, or stay
    within it for a capped strategy (`capped = True`); every pass and FLOP the ledger charged
    is in a record (`run_methods` checks)."""
    name, config = dllmbench_strategy
    method = kit_method(name, config)
    records = run_kit([method], steps_for(name, config))  # the engine checks every problem
    capped = is_capped(method.strategy)
    for (total, problem, _), record in records.items():
        declared = method.cost(total)
        spent = record["passes"]
        over = any(v > declared.get(k, 0) for k, v in spent.items())
        if over or (not capped and spent != declared):
            what = "over its cap" if capped else "but declared"
            raise AssertionError(
                f"strategy {name!r} at T={total} spent {spent} on problem {problem!r} "
                f"{what} {declared}"
            )


def test_strategy_returns_its_pool_size(dllmbench_strategy):
    """Every pool holds exactly `pool_size()` candidates, or `pool_size_at(T)` for a strategy
    whose size depends on T (`SizedBySteps`); a capped strategy: 1 to that."""
    name, config = dllmbench_strategy
    method = kit_method(name, config)
    error: AssertionError | None = None
    try:
        run_kit([method], steps_for(name, config))
    except AssertionError as exc:
        error = exc
    capped = is_capped(method.strategy)
    for s in seen(method):
        size = pool_size_of(method.strategy, s.steps)  # `SizedBySteps`: its size at T
        if s.returned != size and not (capped and 1 <= s.returned < size):
            allowed = " (a capped strategy may return 1 to that)" if capped else ""
            sized = isinstance(method.strategy, SizedBySteps)
            said = f"pool_size_at({s.steps})" if sized else "pool_size()"
            raise AssertionError(
                f"strategy {name!r} returned {s.returned} candidates on problem {s.problem!r} "
                f"at T={s.steps}, but its {said} is {size}{allowed}"
            )
    if error is not None:
        raise error


def test_strategy_same_seed_same_result(dllmbench_strategy):
    """Two runs with the same seed give the same records, whatever the global random state;
    another seed gives records for the same problems."""
    name, config = dllmbench_strategy
    steps = steps_for(name, config)
    with global_seed(1):
        first = run_kit([kit_method(name, config)], steps)
    with global_seed(2):
        second = run_kit([kit_method(name, config)], steps)
    assert_same(
        first,
        second,
        f"strategy {name!r}: the same seed gave different records; does it read global random "
        "state? Draw from ops.rng(label) or the rows' keys",
    )
    other = run_kit([kit_method(name, config)], steps, seed=1)
    if other.keys() != first.keys():
        raise AssertionError(f"strategy {name!r}: another seed gave records for other problems")


def test_strategy_same_result_in_another_process(dllmbench_strategy):
    """Two processes with other hash seeds (PYTHONHASHSEED 1 and 2) give the records this one
    gives: a pool must not depend on `hash()` of a string or on a set's order. Every
    registered strategy runs in each of the two processes once (`elsewhere.py`)."""
    name, config = dllmbench_strategy
    here = as_data(run_kit([kit_method(name, config)], (STEPS,)))
    pairs = strategy_pairs()
    if [name, config] not in pairs:
        pairs.append([name, config])
    for seed in ("1", "2"):
        there = records_elsewhere(seed, json.dumps(pairs))[pair_key(name, config)]
        if there != here:
            differences = there.get("error") or diff_records(_keyed(here), _keyed(there))
            raise AssertionError(
                f"strategy {name!r}: a process with PYTHONHASHSEED={seed} gave other records; "
                "does the pool depend on hash() or on a set's order (sort by values, not "
                "hashes), or on a global random generator (draw from ops.rng(label))? First "
                f"differences (this process != that one):\n{differences}"
            )


def strategy_pairs() -> list[list[Any]]:
    """Every registered strategy with each of its contract configurations: what the other
    processes run, once each."""
    reg = registry()
    return [
        [name, dict(config)]
        for name in reg.names("strategy")
        for config in contract_configs(reg.info("strategy", name).factory)
    ]


def _keyed(data: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """`as_data`'s records by (T, problem, method) again."""
    keys = {k: k.split("|", 2) for k in data}
    return {(int(t), p, m): data[k] for k, (t, p, m) in keys.items()}


def test_strategy_independent_of_batch_size(dllmbench_strategy):
    """Records are equal at 64, 7 and 1 rows per forward."""
    name, config = dllmbench_strategy
    steps = steps_for(name, config)
    wide = run_kit([kit_method(name, config)], steps, batch_rows=64)
    for rows in (7, 1):
        narrow = run_kit([kit_method(name, config)], steps, batch_rows=rows)
        assert_same(
            wide, narrow, f"strategy {name!r}: records at 64 and {rows} rows per forward differ"
        )


def test_strategy_independent_of_other_methods(dllmbench_strategy):
    """A method's records are equal alone and run beside other methods."""
    name, config = dllmbench_strategy
    steps = steps_for(name, config)
    alone = run_kit([kit_method(name, config)], steps)
    mine = kit_method(name, config)
    others = [kit_method(*host("plain", 3), "majority"), kit_method(*host("cuts"), "first")]
    together = run_kit([*(m for m in others if m.id != mine.id), mine], steps)
    beside = {k: v for k, v in together.items() if k[2] == mine.id}
    assert_same(alone, beside, f"strategy {name!r}: records alone and beside other methods differ")


def test_strategy_config_roundtrips(dllmbench_strategy):
    name, config = dllmbench_strategy
    _roundtrip("strategy", name, built("strategy", name, **config))


def test_strategy_prefix_pools_nest(dllmbench_strategy):
    """With `prefix_field` set, the pool at size n is the first n candidates of the pool at
    size n + 2, at every T."""
    name, config = dllmbench_strategy
    field = built("strategy", name, **config).prefix_field
    if field is None:
        pytest.skip(f"strategy {name} sets prefix_field = None: it claims no nested pools")
    size = config_data(built("strategy", name, **config))[field]
    steps = steps_for(name, config)
    small = run_kit([kit_method(name, {**config, field: size})], steps)
    large = run_kit([kit_method(name, {**config, field: size + 2})], steps)
    by_problem = {(t, p): r["candidates"][:size] for (t, p, _), r in large.items()}
    cut = {(t, p, m): by_problem.get((t, p), []) for t, p, m in small}
    mine = {key: r["candidates"] for key, r in small.items()}
    if mine != cut:
        first = {key: {"candidates": c} for key, c in mine.items()}
        second = {key: {"candidates": c} for key, c in cut.items()}
        raise AssertionError(
            f"strategy {name!r} sets prefix_field = {field!r}, but its pools at {field}={size} "
            f"are not the first {size} candidates of its pools at {field}={size + 2}; set "
            f"prefix_field = None unless they always are. First differences:\n"
            + diff_records(first, second)
        )


def _check_pool_carries(name: str, claimed: list[str], method: Method) -> None:
    __tracebackhide__ = True
    for s in seen(method):
        for scorer in claimed:
            where = f"its pool on problem {s.problem!r} at T={s.steps}"
            values = s.scores.get(scorer)
            if values is None:
                carried = ", ".join(sorted(s.scores)) or "none"
                raise AssertionError(
                    f"strategy {name!r} claims pool_scores() {claimed}, but {where} carries no "
                    f"{scorer!r} scores (it carries: {carried}); return them with "
                    f"ops.pool(rows, scores=...) or leave {scorer!r} out of pool_scores()"
                )
            if values.shape != (s.returned,):
                raise AssertionError(
                    f"strategy {name!r}: {where} carries {values.shape[0]} {scorer!r} scores for "
                    f"{s.returned} candidates"
                )
            if not np.isfinite(values).all():
                raise AssertionError(
                    f"strategy {name!r}: {where} carries {scorer!r} scores that are not finite: "
                    f"{values.tolist()}"
                )


def test_strategy_pool_scores_are_true(dllmbench_strategy):
    """Every scorer in `pool_scores()` comes with the pool: one value per candidate, equal
    to what the engine's own scoring of the final candidates gives."""
    name, config = dllmbench_strategy
    claimed = sorted(built("strategy", name, **config).pool_scores())
    if not claimed:
        pytest.skip(f"strategy {name} claims no pool scores")
    steps = steps_for(name, config)
    carried = kit_method(name, config, reads=claimed)
    try:
        records = run_kit([carried], steps)
    except AssertionError:
        _check_pool_carries(name, claimed, carried)
        raise
    _check_pool_carries(name, claimed, carried)
    rescored = run_kit([kit_method(name, config, reads=claimed, hide_pool_scores=True)], steps)
    for key, record in records.items():
        for i, (mine, fresh) in enumerate(
            zip(record["candidates"], rescored[key]["candidates"], strict=True)
        ):
            for scorer in claimed:
                a, b = mine["scores"][scorer], fresh["scores"][scorer]
                if not np.isclose(a, b, rtol=1e-6, atol=1e-9):
                    raise AssertionError(
                        f"strategy {name!r}: the pool's {scorer!r} score of candidate {i} on "
                        f"problem {key[1]!r} at T={key[0]} is {a:.6g}, but the scorer gives "
                        f"{b:.6g} on that final candidate; a pool carries scores of exactly "
                        "its final candidates"
                    )


def test_strategy_evidence_reads_as_the_report_reads_it(dllmbench_strategy):
    """What the strategy declares it records (`evidence()`) is in its records as
    `dllmbench report` reads them (`dllmbench.analysis.evidence.read_method`, on the records as
    samples.jsonl holds them, beside a plain host): cuts and checkpoints in their layout, the
    last cut's `kept` giving the candidates' lineages in pool order, a nested pool the same in
    every method sharing it. The report leaves out a method whose evidence it cannot read."""
    name, config = dllmbench_strategy
    steps = steps_for(name, config)
    mine = kit_method(name, config)
    methods = [kit_method(*host("plain", 4), "majority"), mine]
    records = run_kit(methods, steps)
    for total in steps:
        entries = [m.manifest_entry(m.cost(total)) for m in methods]
        manifest = json.loads(json.dumps({"methods": entries}))
        written = json.loads(json.dumps([r for (t, _, _), r in records.items() if t == total]))
        try:
            read_method(run_data(Path("kit"), manifest, written), mine.id)
        except UnreadableEvidence as exc:
            declared = evidence_of(mine.strategy)
            raise AssertionError(
                f"strategy {name!r} at T={total} declares {declared}, but the report cannot read "
                f"its records ({exc}); dllmbench report would leave it out of the pooled curves "
                "and diagnostics (docs/plugin-authors.md, 'What the report reads')"
            ) from None


def test_strategy_works_when_rows_end_early(dllmbench_strategy):
    """On a backbone whose rows may end before their T (the toy with a confidence threshold,
    as block models and threshold samplers do), the strategy still runs every problem to its
    pool, spending no more than `cost(T)`: a row its sampler ended stands at its T, so a
    strategy re-masks or extends only the rows that are not final (`rows.finished`)."""
    name, config = dllmbench_strategy
    method = kit_method(name, config)
    records = run_kit([method], steps_for(name, config), backbone=EARLY)
    for (total, problem, _), record in records.items():
        declared = method.cost(total)
        over = {k: v for k, v in record["passes"].items() if v > declared.get(k, 0)}
        if over:
            raise AssertionError(
                f"strategy {name!r} at T={total} on a backbone whose rows end early spent "
                f"{record['passes']} on problem {problem!r}, over its cost {declared}"
            )


# -- selectors -------------------------------------------------------------------------------

SELECTOR_STEPS = (STEPS, LONG_STEPS[0])
ANSWER_LISTS = (["4", None, "7", "4", "9"], ["3"], [None, None], ["8", "2", "2"])


def selector_candidates(
    needs: Sequence[str], answers: Sequence[str | None]
) -> tuple[Candidate, ...]:
    """Candidates with the given answers, a score for every scorer named (and orm, prm) and
    a weight, all distinct."""
    names = sorted({*needs, "orm", "prm"})
    n = len(answers)
    scores = {s: [float((i * 7 + j) % 5) - 2.0 for i in range(n)] for j, s in enumerate(names)}
    return make_candidates(answers, scores=scores, weights=[1.0 / (i + 1) for i in range(n)])


def _labels(answers: Sequence[str | None]) -> list[bool]:
    return [a in ("7", "2") for a in answers]


def test_selector_declares_its_kind(dllmbench_selector):
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    if not isinstance(selector.ceiling, bool):
        raise AssertionError(f"selector {name!r}: ceiling is {selector.ceiling!r}, not a bool")
    if not all(isinstance(s, str) for s in selector.needs):
        raise AssertionError(f"selector {name!r}: needs {selector.needs!r} are not all strings")


def _changes(exc: BaseException) -> bool:
    """Whether `exc` is what changing read-only candidates raises: a frozen candidate's
    attribute, a read-only score, the candidates' tuple."""
    text = str(exc)
    return isinstance(exc, dataclasses.FrozenInstanceError) or any(
        s in text for s in ("read-only", "does not support item", "'tuple' object has no attr")
    )


def _choose(name: str, selector: Any, cands: Sequence[Candidate], labels: Any) -> Any:
    """`select` on `cands` with rng seed 0; whatever it raises, or an answer that is no index
    or None, is an AssertionError naming the selector in one line."""
    __tracebackhide__ = True
    try:
        chosen = selector.select(cands, rng=np.random.default_rng(0), labels=labels)
    except Exception as exc:
        if _changes(exc):
            raise AssertionError(
                f"selector {name!r} tried to change its candidates ({explain(exc)}); "
                "candidates and their scores are read-only: copy what you need"
            ) from None
        given = "labels=None (it is not a ceiling: it never gets labels)"
        raise AssertionError(
            f"selector {name!r} raised on {len(cands)} candidates with "
            f"{given if labels is None else 'labels'}: {explain(exc)}"
        ) from None
    index = isinstance(chosen, (int, np.integer)) and not isinstance(chosen, bool)
    if chosen is not None and not index:
        raise AssertionError(
            f"selector {name!r} returned {_short(chosen)} ({type(chosen).__name__}) for "
            f"{len(cands)} candidates; return an int index or None"
        )
    return chosen


def test_selector_works_without_labels(dllmbench_selector):
    """A selector that is not a ceiling chooses with `labels=None`."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    if selector.ceiling:
        pytest.skip(f"selector {name} is a ceiling: it always gets labels")
    for answers in ANSWER_LISTS:
        _choose(name, selector, selector_candidates(selector.needs, answers), None)


def test_selector_ceiling_uses_labels(dllmbench_selector):
    """A ceiling given labels returns an index (it reads them)."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    if not selector.ceiling:
        pytest.skip(f"selector {name} is not a ceiling: it never gets labels")
    answers = ANSWER_LISTS[0]
    chosen = _choose(name, selector, selector_candidates(selector.needs, answers), _labels(answers))
    if chosen is None:
        raise AssertionError(f"ceiling {name!r} chose nothing though a candidate is correct")


def test_selector_returns_an_index_in_range(dllmbench_selector):
    """`select` returns None or an int index of one of the candidates it was given."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    for answers in ANSWER_LISTS:
        n = len(answers)
        labels = _labels(answers) if selector.ceiling else None
        chosen = _choose(name, selector, selector_candidates(selector.needs, answers), labels)
        if chosen is None:
            continue
        if not 0 <= chosen < n:
            raise AssertionError(
                f"selector {name!r} chose {chosen} of {n} candidates (answers {answers}); "
                f"return an index in 0..{n - 1}, or None for no choice"
            )


def test_selector_deterministic_and_costed(dllmbench_selector):
    """In a run the selector's choices repeat with the seed, and its scoring is charged as
    the method declares (the ledger check)."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    weighted = "weight" in config_data(selector).values()
    strategy, sconf = host("particles") if weighted else host("plain", 4)
    method = kit_method(strategy, sconf, name, config)
    first = run_kit([method], SELECTOR_STEPS)  # the engine's ledger check covers its scoring
    second = run_kit([kit_method(strategy, sconf, name, config)], SELECTOR_STEPS)
    assert_same(first, second, f"selector {name!r}: the same seed gave different records")
    for (total, problem, _), record in first.items():
        if record["passes"] != method.cost(total):
            raise AssertionError(
                f"selector {name!r}: {method.id} spent {record['passes']} on problem "
                f"{problem!r} at T={total} but declared {method.cost(total)}"
            )


def _snapshot(candidates: Sequence[Candidate]) -> list[tuple]:
    return [
        (c.index, c.text, c.answer, c.answer_key, c.lineage, dict(c.scores), c.weight)
        for c in candidates
    ]


def test_selector_leaves_its_candidates_alone(dllmbench_selector):
    """A selector reads its candidates: they come as a tuple of read-only candidates, and one
    that tries to change them (or their scores) fails."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    for answers in ANSWER_LISTS:
        cands = selector_candidates(selector.needs, answers)
        before = _snapshot(cands)
        labels = tuple(_labels(answers)) if selector.ceiling else None
        _choose(name, selector, cands, labels)
        if _snapshot(cands) != before:
            raise AssertionError(
                f"selector {name!r} changed its candidates (answers {answers}); "
                "a selector must only read them"
            )


TIES = (["4", "4", "7", "7"], ["1", "2", "3"], ["5", None, "5", "6", "6"])


def _fresh(needs: Sequence[str], answers: Sequence[str], reverse: bool) -> list[Candidate]:
    """Equal candidates with tied scores, built anew (in reverse order when `reverse`, so that
    their object ids come in another order)."""
    order = range(len(answers) - 1, -1, -1) if reverse else range(len(answers))
    names = sorted({*needs, "orm", "prm"})
    built = {
        i: make_candidate(i, answers[i], scores={s: 0.5 for s in names}, weight=0.5) for i in order
    }
    return [built[i] for i in range(len(answers))]


def test_selector_same_choice_on_equal_inputs(dllmbench_selector):
    """Equal candidates (ties included) and an equal rng give the same choice, whatever the
    objects: a selector must not break ties by object identity, hashing or global state."""
    name, config = dllmbench_selector
    selector = built("selector", name, **config)
    for answers in TIES:
        labels = tuple(_labels(answers)) if selector.ceiling else None
        choices = set()
        for trial in range(8):
            cands = tuple(_fresh(selector.needs, answers, reverse=bool(trial % 2)))
            chosen = _choose(name, selector, cands, labels)
            choices.add(None if chosen is None else int(chosen))
        if len(choices) > 1:
            raise AssertionError(
                f"selector {name!r} chose {sorted(c for c in choices if c is not None)} on "
                f"equal candidates (answers {answers}, one rng seed): break ties by the "
                "candidates and the rng given only, never by object identity, hashing or a "
                "global random generator"
            )


def test_selector_config_roundtrips(dllmbench_selector):
    name, config = dllmbench_selector
    _roundtrip("selector", name, built("selector", name, **config))


def _roundtrip(kind: str, name: str, obj: Any) -> None:
    __tracebackhide__ = True
    config = json.loads(json.dumps(config_data(obj)))
    again = config_data(built(kind, name, **config))
    if again != config_data(obj):
        raise AssertionError(f"{kind} {name!r}: its config {config} built again gives {again}")


# -- backbones -------------------------------------------------------------------------------


def _canvases(backbone: Any, n: int) -> list[tuple[torch.Tensor, int]]:
    task = ToySum(size=n)
    out = []
    for problem in task.problems("test"):
        ids = backbone.encode(Prompt(text=problem.question))
        out.append((backbone.canvas(ids, GEN_LENGTH), len(ids)))
    return out


def _step(
    backbone: Any,
    rows: list[tuple[torch.Tensor, int, int, int]],
    totals: Sequence[int] = (),
    settings: Sequence[Mapping[str, Any]] = (),
) -> list[torch.Tensor]:
    """One step of rows (canvas, prompt length, step, key), each at its own T and sampler
    settings when given (empty: the run's T, the backbone's settings)."""
    return backbone.denoise_step(
        StepBatch(
            tokens=[r[0] for r in rows],
            prompt_lens=[r[1] for r in rows],
            steps=[r[2] for r in rows],
            keys=[r[3] for r in rows],
            total_steps=STEPS,
            totals=list(totals),
            settings=[dict(s) for s in settings],
        )
    )


def test_backbone_canvas_is_prompt_then_masks(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    for canvas, plen in _canvases(backbone, 3):
        assert canvas.dim() == 1 and canvas.dtype == torch.long, (
            f"backbone {name!r}: canvas is not a 1-D long tensor"
        )
        assert (canvas[plen:] == backbone.mask_id).all() and len(canvas) == plen + GEN_LENGTH, (
            f"backbone {name!r}: the canvas is not the prompt followed by {GEN_LENGTH} masks"
        )


def test_backbone_row_alone_equals_row_in_batch(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    rows = [
        (c, p, i % STEPS, row_key(0, f"p{i}", "sample", (i,)))
        for i, (c, p) in enumerate(_canvases(backbone, 6))
    ]
    batched = _step(backbone, rows)
    assert len(batched) == len(rows), (
        f"backbone {name!r}: denoise_step returned {len(batched)} rows for {len(rows)}"
    )
    for i, (row, out) in enumerate(zip(rows, batched, strict=True)):
        given = row[0]
        same = isinstance(out, torch.Tensor) and out.shape == given.shape
        assert same and out.dtype == given.dtype, (
            f"backbone {name!r}: denoise_step returned row {i} as "
            f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
            f"{' ' + str(out.dtype) if isinstance(out, torch.Tensor) else ''} for a row of "
            f"{tuple(given.shape)} {given.dtype}: each row comes back as long, of its dtype"
        )
        for _ in range(2):  # twice: no hidden state
            assert torch.equal(_step(backbone, [row])[0], out), (
                f"backbone {name!r}: row {i} alone differs from row {i} in a batch of {len(rows)}"
            )


def test_backbone_copies_with_other_keys_can_differ(dllmbench_backbone):
    """Copies of a row differ only in their keys: unless the backbone's config says it samples
    deterministically (`deterministic`, which makes a run refuse multi-sample methods), some
    of 16 copies must come out different. A sampler that ignores the key collapses every
    multi-sample method to Vanilla, silently."""
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    if is_deterministic(getattr(backbone, "config", None)):
        pytest.skip(f"backbone {name!r} with {config} samples deterministically, as it says")
    canvas, plen = _canvases(backbone, 1)[0]
    finals = set()
    for copy in range(16):
        key, row = row_key(0, "p", "sample", (copy,)), canvas
        for t in range(STEPS):
            row = _step(backbone, [(row, plen, t, key)])[0]
        finals.add(tuple(row.tolist()))
    assert len(finals) > 1, (
        f"backbone {name!r}: 16 copies of a row with different keys came out the same; draw "
        "the noise from batch.keys[i], or say deterministic=True on the config"
    )


def test_backbone_predictions_leave_the_step_as_it_was(dllmbench_backbone):
    """A backbone that reports each step's predictions (`ReportsPredictions`): along a
    trajectory, every row steps to the tokens `denoise_step` gives it, whether it asks for
    its prediction or not; a row that does not ask gets None, one that asks a prediction that
    keeps every token the row holds after the step; and `step_work` charges an asking row
    at least the head it charges the same row not asking, the rest of the forward alike."""
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    if not reports_predictions(backbone):
        pytest.skip(f"backbone {name!r} with {config} reports no predictions")
    (canvas, plen), (other, oplen) = _canvases(backbone, 2)
    rows = [(canvas, plen, 0, row_key(0, "p", "sample", (0,))), (other, oplen, 0, 11)]
    for t in range(STEPS):
        batch = StepBatch(
            tokens=[r[0] for r in rows],
            prompt_lens=[r[1] for r in rows],
            steps=[t, t],
            keys=[r[3] for r in rows],
            total_steps=STEPS,
            predict=[True, False],
        )
        out = backbone.denoise_step_with_predictions(batch)
        plain = backbone.denoise_step(dataclasses.replace(batch, predict=()))
        for i, (row, want) in enumerate(zip(out, plain, strict=True)):
            assert torch.equal(row[0], want), (
                f"backbone {name!r}: at step {t}, row {i} {'asking' if i == 0 else 'not asking'} "
                "for its prediction stepped to other tokens than through denoise_step"
            )
        assert out[1][2] is None, f"backbone {name!r}: a row that did not ask got a prediction"
        made, after = out[0][2], out[0][0]
        assert isinstance(made, torch.Tensor) and made.shape == after.shape, (
            f"backbone {name!r}: a row that asked got no prediction of its canvas at step {t}"
        )
        kept = (after == backbone.mask_id) | (made == after)
        assert bool(kept.all()), (
            f"backbone {name!r}: at step {t} the prediction changed a token the row holds"
        )
        if isinstance(backbone, CountsStepWork):
            asks = backbone.step_work(batch)
            plain_work = backbone.step_work(dataclasses.replace(batch, predict=()))
            same = asks[1] == plain_work[1]
            more = asks[0].head >= plain_work[0].head
            rest = dataclasses.replace(asks[0], head=0) == dataclasses.replace(
                plain_work[0], head=0
            )
            assert same and more and rest, (
                f"backbone {name!r}: step_work charges {asks} asking and {plain_work} not: an "
                "asking row adds only head positions, and the others are charged as before"
            )
        rows = [(r[0], p, t + 1, k) for r, (_, p, _, k) in zip(out, rows, strict=True)]


def test_backbone_config_roundtrips(dllmbench_backbone):
    name, config = dllmbench_backbone
    _roundtrip("backbone", name, built("backbone", name, **config))


def test_task_config_roundtrips(dllmbench_task):
    name, config = dllmbench_task
    _roundtrip("task", name, built("task", name, **config))


def test_backbone_trajectory_ends_decodable(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    canvas, plen = _canvases(backbone, 1)[0]
    key = row_key(0, "p", "sample", (0,))
    for t in range(STEPS):
        canvas = _step(backbone, [(canvas, plen, t, key)])[0]
    assert isinstance(backbone.decode(canvas, plen), str), f"backbone {name!r}: decode is not a str"


def _trajectories(
    backbone: Any,
    rows: Sequence[tuple[torch.Tensor, int, int]],
    totals: Sequence[int],
    settings: Sequence[Mapping[str, Any]],
) -> list[torch.Tensor]:
    """Rows (canvas, prompt length, key) denoised together to each one's own T, as the engine
    steps them: a row at its T, or one its sampler ended (no mask left, `finishes_early`),
    takes no more steps."""
    tokens = [r[0] for r in rows]
    for t in range(max(totals)):
        live = [
            i
            for i, r in enumerate(rows)
            if t < totals[i]
            and not (
                finishes_early(backbone, settings[i])
                and not bool((tokens[i][r[1] :] == backbone.mask_id).any())
            )
        ]
        if not live:
            break
        out = _step(
            backbone,
            [(tokens[i], rows[i][1], t, rows[i][2]) for i in live],
            totals=[totals[i] for i in live],
            settings=[settings[i] for i in live],
        )
        for i, row in zip(live, out, strict=True):
            tokens[i] = row
    return tokens


def _masked(backbone: Any, row: torch.Tensor, plen: int) -> int:
    return int((row[plen:] == backbone.mask_id).sum())


def test_backbone_honours_a_rows_own_t(dllmbench_backbone):
    """Every backbone honours `steps`, a row's own T (`batch.total(i)`: ReMDM's extra steps,
    a strategy's shorter rows): a sampler that fills its canvas by the run's T fills it by a
    row's own T too, and rows of different T in one batch each come out as they do alone."""
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    canvas, plen = _canvases(backbone, 1)[0]
    key = row_key(0, "p", "sample", (0,))
    if _masked(backbone, _trajectories(backbone, [(canvas, plen, key)], [STEPS], [{}])[0], plen):
        pytest.skip(f"backbone {name!r} leaves masks at T={STEPS}: no schedule to hold it to")
    totals = (GEN_LENGTH - 1, STEPS, STEPS + 8)
    rows = [(canvas, plen, row_key(0, "p", "sample", (i,))) for i in range(len(totals))]
    alone = [
        _trajectories(backbone, [row], [total], [{}])[0]
        for row, total in zip(rows, totals, strict=True)
    ]
    for total, row in zip(totals, alone, strict=True):
        left = _masked(backbone, row, plen)
        assert not left, (
            f"backbone {name!r}: a row whose own T is {total} still has {left} masked "
            f"position(s) after its {total} steps, though at the run's T={STEPS} the canvas "
            "fills: read each row's T as batch.total(i), not batch.total_steps"
        )
    together = _trajectories(backbone, rows, totals, [{}] * len(rows))
    for total, one, both in zip(totals, alone, together, strict=True):
        assert torch.equal(one, both), (
            f"backbone {name!r}: a row of T={total} alone differs from that row in a batch "
            f"with rows of T={', '.join(str(t) for t in totals if t != total)}"
        )


def _alternatives(backbone: Any) -> list[tuple[list[dict[str, Any]], bool]]:
    """Groups of per-row settings a strategy sets on this backbone (sampler ensembles' commit
    orders and temperatures), each with whether its values must sample apart: a low and a
    high temperature must; commit orders may agree on a short canvas (a confident model
    ranks its positions alike by any confidence)."""
    groups = [
        ([{setting: value} for value in values], False)
        for setting, values in commit_orders(backbone).items()
        if len(values) > 1
    ]
    varies = row_settings(backbone)
    if "temperature" in varies and not is_deterministic(getattr(backbone, "config", None)):
        groups.append(([{"temperature": 0.3}, {"temperature": 0.8}], True))
    return groups


def test_backbone_honours_a_rows_own_settings(dllmbench_backbone):
    """A backbone that lists a setting in `row_settings` reads it per row
    (`batch.setting(i)`): each commit order it offers (`commit_orders`) and a low and a high
    temperature, when it varies `temperature`, are taken by `check_row_settings`, and give
    each row in a batch of mixed settings what it gives alone; the two temperatures sample
    apart on some of 8 keys. A sampler that ignored them would collapse sampler ensembles to
    plain samples."""
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    groups = _alternatives(backbone)
    if not groups:
        pytest.skip(f"backbone {name!r} offers no commit orders and no temperature per row")
    canvas, plen = _canvases(backbone, 1)[0]
    for group, apart in groups:
        for setting in group:
            try:
                backbone.check_row_settings(setting, GEN_LENGTH, STEPS)
            except Exception as exc:
                raise AssertionError(
                    f"backbone {name!r}: check_row_settings refused {setting}, which it "
                    f"offers per row: {type(exc).__name__}: {exc}"
                ) from None
        keys = [row_key(0, "p", "sample", (i,)) for i in range(8)]
        finals = {  # the 8 keys' rows of one setting in one batch
            tuple(sorted(setting.items())): [
                tuple(row.tolist())
                for row in _trajectories(
                    backbone, [(canvas, plen, k) for k in keys], [STEPS] * 8, [setting] * 8
                )
            ]
            for setting in group
        }
        assert not apart or len({tuple(v) for v in finals.values()}) > 1, (
            f"backbone {name!r}: rows setting {' and '.join(str(s) for s in group)} came out "
            "the same for 8 keys; a sampler reads each row's settings as batch.setting(i)"
        )
        mixed = [(canvas, plen, keys[i]) for i in range(len(group))]
        together = _trajectories(backbone, mixed, [STEPS] * len(group), group)
        for i, (setting, row) in enumerate(zip(group, together, strict=True)):
            alone = finals[tuple(sorted(setting.items()))][i]
            assert tuple(row.tolist()) == alone, (
                f"backbone {name!r}: a row with {setting} beside rows with "
                f"{[s for s in group if s != setting]} differs from the row beside rows of its "
                "own settings; read row i's settings as batch.setting(i), not another row's"
            )


def test_backbone_runs_in_the_engine(dllmbench_backbone):
    """The backbone through the real engine on the toy task, with every built-in family its
    rows' settings allow: what a run checks of each step (the prompt and committed tokens
    kept, ids in the vocabulary, one `Work` per row, a `str` from `decode`) is checked here,
    and the records are the same at 64 and at 7 rows per forward."""
    name, config = dllmbench_backbone
    backbone = built("backbone", name, **config)
    varies = row_settings(backbone)
    specs = [
        "independent:n=3+first",
        "remdm:n=3,extra=3,t_on=0.9,t_off=0.1,eta=0.5+first",
        "hex:n=3+first",
        "ensemble:n=3+first",
    ]
    methods = [Method.build(registry(), MethodSpec.parse(spec)) for spec in specs]
    methods = [m for m in methods if sets_per_row(m.strategy) <= varies]
    distribution = registry().info("backbone", name).distribution
    origins = Origins(backbone=name, distributions={("backbone", name): distribution})

    def run(batch_rows: int) -> dict[Key, dict[str, Any]]:
        __tracebackhide__ = True
        task = ToySum(size=2)
        engine = Engine(
            backbone=backbone,
            scorers={},
            task=task,
            methods=methods,
            sampling=Sampling(STEPS, GEN_LENGTH, "fewshot", 0),
            capacity=Capacity(batch_rows=batch_rows, problems=2),
            origins=origins,
        )
        try:
            records = engine.run(task.problems("test"))
        except Exception as exc:
            raise AssertionError(f"backbone {name!r} in a run: {explain(exc)}") from None
        return {(STEPS, r["problem"], r["method"]): comparable(r) for r in records}

    assert_same(run(64), run(7), f"backbone {name!r}: records at 64 and 7 rows per forward differ")


# -- scorers ---------------------------------------------------------------------------------


def test_scorer_returns_one_finite_float_per_row(dllmbench_scorer):
    name, config = dllmbench_scorer
    # a scorer that reads a model names the backbone to check it on: (name, config)
    spec = contract_backbone(registry().info("scorer", name).factory)
    backbone = built("backbone", spec[0], **spec[1]) if spec else ToyBackbone()
    scorer = built("scorer", name, shared={"backbone": backbone}, **config)
    canvases = _canvases(backbone, 4)
    batch = ScoreBatch([c for c, _ in canvases], [p for _, p in canvases], [0] * 4, STEPS)
    values = np.asarray(scorer.score(batch))
    assert values.shape == (4,), (
        f"scorer {name!r} gave values of shape {values.shape} for 4 rows: one float per row"
    )
    assert np.isfinite(values).all(), f"scorer {name!r} gave values that are not finite: {values}"
    single = [
        float(np.asarray(scorer.score(ScoreBatch([c], [p], [0], STEPS)))[0]) for c, p in canvases
    ]
    apart = ~np.isclose(values, single, rtol=1e-5, atol=1e-6)
    if apart.any():
        i = int(np.flatnonzero(apart)[0])
        raise AssertionError(
            f"scorer {name!r}: a row's value depends on the rows beside it: row {i} scored "
            f"{values[i]:.7g} in a batch of 4 and {single[i]:.7g} alone ({int(apart.sum())} of "
            "4 rows differ); score each row as if alone"
        )
    assert isinstance(scorer.reads_partial, bool), f"scorer {name!r}: reads_partial is not a bool"


# -- tasks -----------------------------------------------------------------------------------


def test_task_problems_are_well_formed(dllmbench_task):
    name, config = dllmbench_task
    task = built("task", name, **config)
    splits = task.splits()
    assert splits, f"task {name} has no splits"
    for split, size in splits.items():
        problems = task.problems(split)
        assert len(problems) == size, (
            f"task {name!r}: split {split} has {len(problems)} problems, splits() says {size}"
        )
        assert len({p.id for p in problems}) == size, (
            f"task {name!r}: problem ids in {split} are not unique"
        )
    problem = task.problems(next(iter(splits)))[0]
    for style in ("chat", "fewshot"):
        assert isinstance(task.prompt(problem, style), Prompt), (
            f"task {name!r}: prompt({style!r}) is not a Prompt"
        )
    assert task.grade(problem, None, "") is False, (
        f"task {name!r}: grade(problem, None, '') is not False"
    )
    assert task.extract("") is None, f"task {name!r}: extract('') is not None"


def _answer_texts(gold: Any) -> list[str]:
    """Texts a model might write for a problem: its gold in the usual final-answer shapes,
    and a wrong number in them."""
    texts = []
    for value in ("7", str(gold)):
        texts += [value, f"#### {value}", f"The answer is {value}.", f"\\boxed{{{value}}}"]
    return list(dict.fromkeys(texts))


def test_task_reads_answers_as_the_engine_does(dllmbench_task):
    """What a run holds a task to on every candidate (`Engine.read`, `Engine.judge`), on texts
    in the usual final-answer shapes: `extract` gives a string or None, `answer_key` of an
    extracted answer something hashable, `grade` a bool. A task that breaks one passes the
    other checks and stops its first run (exit status 3)."""
    name, config = dllmbench_task
    task = built("task", name, **config)
    problem = task.problems(next(iter(task.splits())))[0]
    graded: set[str] = set()
    for text in _answer_texts(problem.gold):
        answer = task.extract(text)
        assert answer is None or isinstance(answer, str), (
            f"task {name!r}: extract({text!r}) returned {answer!r}, not a string or None"
        )
        if answer is None or answer in graded:
            continue
        graded.add(answer)
        key = task.answer_key(answer)
        try:
            hash(key)
        except TypeError:
            raise AssertionError(
                f"task {name!r}: answer_key({answer!r}) returned {key!r}: not hashable "
                "(votes count keys)"
            ) from None
        verdict = task.grade(problem, answer, text)
        assert isinstance(verdict, bool | np.bool_), (
            f"task {name!r}: grade(problem, {answer!r}, {text!r}) returned {verdict!r}, not a bool"
        )


def test_task_grade_many_agrees_with_grade(dllmbench_task):
    """`grade_many`, which the engine uses for a whole pool when a task has it, must give
    `grade`'s verdicts in order: for no answer, a likely wrong one and the gold one (when the
    gold is an answer string)."""
    name, config = dllmbench_task
    task = built("task", name, **config)
    if not isinstance(task, GradesMany):
        pytest.skip(f"task {name} has no grade_many; the engine calls grade")
    problems = task.problems(next(iter(task.splits())))[:2]
    items = [
        (p, a, a or "")
        for p in problems
        for a in ((None, "0", p.gold) if isinstance(p.gold, str) else (None, "0"))
    ]
    many, one = list(task.grade_many(items)), [task.grade(*item) for item in items]
    assert many == one, f"task {name!r}: grade_many gave {many}, grade gives {one}"
