"""The engine: ledger checks, batch-size independence, nested pools, common random numbers."""

from __future__ import annotations

import json
import re
from collections import deque
from typing import ClassVar

import pytest

from dllmbench.core.errors import CostMismatch, PluginViolation
from dllmbench.core.types import Rows
from dllmbench.execution.engine import Capacity, Engine, Sampling, plan_units
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.execution.planner import plan
from dllmbench.execution.scheduler import DenoiseWait, Scheduler, ScoreWait
from dllmbench.loading.provenance import Origins
from dllmbench.loading.registry import registry
from dllmbench.testing.contracts import comparable
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum

T, GEN = 16, 6


def engine(methods, batch_rows=64, problems_in_flight=4, size=6):
    task = ToySum(size=size)
    return task, Engine(
        backbone=ToyBackbone(),
        scorers={"prm": ToyScorer(), "orm": ToyScorer(partial=False)},
        task=task,
        methods=methods,
        sampling=Sampling(T, GEN, "fewshot", 0),
        capacity=Capacity(batch_rows=batch_rows, problems=problems_in_flight),
    )


def method(spec: str, label: str | None = None) -> Method:
    return Method.build(registry(), MethodSpec.parse(spec), label)


class Misreporting:
    """Declares n·T denoising passes but spends `spend` steps per row."""

    prefix_field: ClassVar[str | None] = None
    scorers = ()
    config = None

    def __init__(self, n: int, spend: int):
        self.n, self.spend = n, spend

    def cost(self, total_steps):
        return {"denoise": self.n * total_steps}

    def pool_size(self):
        return self.n

    def pool_scores(self):
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=self.n)
        rows = await ops.denoise(rows, self.spend)
        if self.spend < ops.T:
            rows = await ops.denoise(rows, ops.T - self.spend)
        if self.spend > ops.T:
            raise AssertionError("unreachable")
        return ops.pool(rows)


class ScoresBehindTheLedgersBack(Misreporting):
    """Spends its denoising honestly but calls a scorer it never declared."""

    scorers = ("prm",)

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=self.n)
        rows = await ops.denoise(rows, ops.T)
        await ops.score(rows, "prm")
        return ops.pool(rows)


class SpendsLess(Misreporting):
    """Declares two rows but only ever denoises one."""

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=1)
        rows = await ops.denoise(rows, ops.T)
        return ops.pool(rows.repeat(self.n))


def _bad(strategy) -> Method:
    first = registry().selector("first")
    return Method("bad strategy", MethodSpec("bad"), strategy, first)


@pytest.mark.parametrize(
    "strategy", [ScoresBehindTheLedgersBack(2, T), SpendsLess(2, T)], ids=["more", "less"]
)
def test_ledger_stops_a_strategy_that_misreports(strategy):
    task, eng = engine([method("independent:n=2+majority"), _bad(strategy)])
    with pytest.raises(CostMismatch, match="bad strategy"):
        eng.run(task.problems("test"))


def test_ledger_passes_an_honest_strategy_with_uneven_segments():
    _, eng = engine([_bad(Misreporting(3, 5))])
    task = ToySum(size=2)
    records = eng.run(task.problems("test"))
    assert all(r["ledger"]["passes"] == {"denoise": 3 * T} for r in records)


def all_families(budget: int = 8 * T + 8) -> list[Method]:
    return [p.method for p in plan(registry(), budget, T, scorers={"prm", "orm"}).methods]


def test_results_identical_for_batch_sizes_1_7_64():
    runs = []
    for rows in (1, 7, 64):
        task, eng = engine(all_families(), batch_rows=rows, problems_in_flight=3)
        runs.append(sorted(map(str, map(comparable, eng.run(task.problems("test"))))))
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0]) == 6 * len(all_families())


def test_token_cap_splits_batches_but_not_results():
    task, capped = engine(all_families()[:3], batch_rows=64)
    capped.capacity = Capacity(batch_rows=64, batch_tokens=40, problems=4)
    a = sorted(map(str, map(comparable, capped.run(task.problems("test")))))
    task, free = engine(all_families()[:3], batch_rows=64)
    b = sorted(map(str, map(comparable, free.run(task.problems("test")))))
    assert a == b
    assert (
        capped.ledger.physical()["denoise"]["forwards"]
        > free.ledger.physical()["denoise"]["forwards"]
    )


def test_pools_at_8_and_32_nest_and_are_charged_as_if_alone():
    methods = [
        method("independent:n=8+majority", "Majority@8"),
        method("independent:n=32+majority", "Majority@32"),
        method("independent:n=8+argmax:scorer=orm", "ORM Rerank@8"),
        method("independent:n=32+argmax:scorer=orm", "ORM Rerank@32"),
    ]
    units = plan_units(ToySum().problems("test")[0], methods)
    assert len(units) == 1 and units[0].strategy.config.n == 32
    task, eng = engine(methods, size=3)
    records = {(r["problem"], r["method"]): r for r in eng.run(task.problems("test"))}
    for p in task.problems("test"):
        small, large = records[p.id, "Majority@8"], records[p.id, "Majority@32"]
        assert small["candidates"] == [
            {**c, "scores": {}} for c in records[p.id, "ORM Rerank@8"]["candidates"]
        ]
        assert [c["text"] for c in small["candidates"]] == [
            c["text"] for c in large["candidates"][:8]
        ]
        assert small["ledger"]["passes"] == {"denoise": 8 * T}
        assert large["ledger"]["passes"] == {"denoise": 32 * T}
        assert records[p.id, "ORM Rerank@8"]["ledger"]["passes"] == {
            "denoise": 8 * T,
            "score:orm": 8,
        }
        assert records[p.id, "ORM Rerank@32"]["ledger"]["passes"] == {
            "denoise": 32 * T,
            "score:orm": 32,
        }
    physical = eng.ledger.physical()
    assert physical["denoise"]["rows"] == 3 * 32 * T  # the pool was generated once
    # and scored once (not again for the @8 members); rows with equal tokens share a score
    assert physical["score:orm"]["rows"] <= 3 * 32


def test_nested_pool_alone_equals_pool_in_group():
    alone_task, alone = engine([method("independent:n=8+majority", "Majority@8")], size=3)
    a = {(r["problem"]): comparable(r) for r in alone.run(alone_task.problems("test"))}
    task, grouped = engine(
        [
            method("independent:n=8+majority", "Majority@8"),
            method("independent:n=32+majority", "Majority@32"),
        ],
        size=3,
    )
    b = {
        r["problem"]: comparable(r)
        for r in grouped.run(task.problems("test"))
        if r["method"] == "Majority@8"
    }
    assert a == b


def test_vanilla_is_the_first_sample_of_every_pool():
    task, eng = engine(
        [method("independent:n=1+first", "Vanilla"), method("independent:n=8+first", "First@8")],
        size=4,
    )
    recs = {(r["problem"], r["method"]): r for r in eng.run(task.problems("test"))}
    for p in task.problems("test"):
        assert recs[p.id, "Vanilla"]["candidates"][0] == recs[p.id, "First@8"]["candidates"][0]


def test_top1_and_topm_share_their_first_segment():
    """Common random numbers: the first segment's children are the same rows in both."""
    task, eng = engine(
        [
            method("prm_guided:k=4,every=8,final=keep+first", "hybrid"),
            method("prm_guided:k=4,every=8,keep=2,final=keep+first", "top2 hybrid"),
        ],
        size=3,
    )
    recs = {(r["problem"], r["method"]): r for r in eng.run(task.problems("test"))}
    for p in task.problems("test"):
        # hybrid's survivor of segment 1 is the argmax; it is one of top-2's survivors too,
        # and its first two children (lineage (j, 0|1)) draw the same noise in both
        a = {tuple(c["lineage"]): c["text"] for c in recs[p.id, "hybrid"]["candidates"]}
        b = {tuple(c["lineage"]): c["text"] for c in recs[p.id, "top2 hybrid"]["candidates"]}
        shared = set(a) & set(b)
        assert len(shared) == 2
        assert all(a[k] == b[k] for k in shared)


def test_first_segments_are_the_independent_pool_computed_once():
    """Guided search and SMC start from K independent samples: the same rows as the
    independent pool for b steps, computed once and charged to every method in full."""
    specs = {
        "independent": "independent:n=4+first",
        "guided": "prm_guided:k=4,every=8,final=keep+first",
        "smc": "smc:k=4,every=8+argmax:scorer=prm",
    }
    task, eng = engine([method(spec, label) for label, spec in specs.items()], size=3)
    records = {(r["problem"], r["method"]): r for r in eng.run(task.problems("test"))}
    for p in task.problems("test"):
        for label in specs:
            assert records[p.id, label]["ledger"]["passes"]["denoise"] == 4 * T
    # per problem: the independent pool (4·T), then at most each run's second segment (a
    # guided child and an SMC particle with the same ancestor and lineage are one row too)
    rows = eng.ledger.physical()["denoise"]["rows"]
    assert 3 * (4 * T + 4 * (T - 8)) < rows <= 3 * (4 * T + 2 * 4 * (T - 8)) < 3 * 3 * 4 * T
    for label in ("guided", "smc"):  # and sharing changes no result
        alone_task, alone = engine([method(specs[label], label)], size=3)
        for r in alone.run(alone_task.problems("test")):
            shared = records[r["problem"], label]
            assert comparable(r) == comparable(shared)


def test_seed_changes_samples():
    task = ToySum(size=4)
    texts = []
    for seed in (0, 1):
        eng = Engine(
            backbone=ToyBackbone(),
            scorers={},
            task=task,
            methods=[method("independent:n=4+first")],
            sampling=Sampling(T, GEN, "fewshot", seed),
        )
        texts.append([c["text"] for r in eng.run(task.problems("test")) for c in r["candidates"]])
    assert texts[0] != texts[1]


class StartsWide(Misreporting):
    """Starts n copies, denoises them all, keeps the first: declares and spends n·T."""

    def pool_size(self):
        return 1

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=self.n)
        rows = await ops.denoise(rows, ops.T)
        return ops.pool(rows.take(0))


def test_every_row_of_a_non_nesting_strategy_is_charged():
    task, eng = engine([_bad(StartsWide(4, T))], size=2)
    records = eng.run(task.problems("test"))
    assert all(r["ledger"]["passes"] == {"denoise": 4 * T} for r in records)


def test_methods_with_one_strategy_configuration_share_one_run():
    methods = [
        method("smc:k=4,every=8+weighted_majority:by=weight", "vote"),
        method("smc:k=4,every=8+argmax:scorer=prm", "top"),
    ]
    assert len(plan_units(ToySum().problems("test")[0], methods)) == 1
    task, eng = engine(methods, size=3)
    records = {(r["problem"], r["method"]): r for r in eng.run(task.problems("test"))}
    for p in task.problems("test"):
        vote, top = records[p.id, "vote"], records[p.id, "top"]
        assert (
            vote["ledger"]["passes"]
            == top["ledger"]["passes"]
            == {
                "denoise": 4 * T,
                "score:prm": 8,
            }
        )
        assert [c["text"] for c in vote["candidates"]] == [c["text"] for c in top["candidates"]]
    assert eng.ledger.physical()["denoise"]["rows"] == 3 * 4 * T  # generated once


class AsksForAnUnknownScorer(Misreporting):
    scorers = ("verifier",)

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=self.n), ops.T)
        await ops.score(rows, "verifier")
        return ops.pool(rows)


class ScoresPartialWithAnORM(Misreporting):
    scorers = ("orm",)

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=self.n), 2)
        await ops.score(rows, "orm")
        rows = await ops.denoise(rows, ops.T - 2)
        return ops.pool(rows)


class CallsAnUndeclaredScorer(Misreporting):
    scorers = ()  # yet it calls the run's ORM

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=self.n), ops.T)
        await ops.score(rows, "orm")
        return ops.pool(rows)


def test_ops_refuses_a_partial_state_to_a_scorer_of_final_ones():
    from dllmbench.core.errors import PluginError

    task, eng = engine([_bad(ScoresPartialWithAnORM(1, T))], size=1)
    with pytest.raises(PluginError, match="reads final states only"):
        eng.run(task.problems("test"))


@pytest.mark.parametrize("strategy", [AsksForAnUnknownScorer(1, T), CallsAnUndeclaredScorer(1, T)])
def test_a_strategy_calling_a_scorer_it_does_not_declare_or_the_run_lacks_is_at_fault(strategy):
    """The planner leaves out a method whose declared scorer the run lacks, so a call of a
    scorer ops cannot serve is a scorer the strategy did not declare: its fault (exit status
    3), also when the run has that scorer for other methods."""
    from dllmbench.core.errors import PluginCrashed

    task, eng = engine([_bad(strategy)], size=1)
    with pytest.raises(PluginCrashed, match="asks for a scorer it may not call here"):
        eng.run(task.problems("test"))


def test_a_pool_is_graded_at_once_through_grade_many_when_the_task_has_it():
    methods = [method("independent:n=4+majority"), method("independent:n=1+first")]
    task, plain = engine(methods)
    expected = sorted(map(str, map(comparable, plain.run(task.problems("test")))))

    calls = []

    class Parallel(ToySum):
        def grade(self, problem, answer, text):
            raise AssertionError("the engine must grade a pool through grade_many")

        def grade_many(self, items):
            calls.append(len(items))
            return [ToySum.grade(self, *item) for item in items]

    task, eng = engine(methods)
    eng.task = Parallel(size=6)
    got = sorted(map(str, map(comparable, eng.run(task.problems("test")))))
    assert got == expected
    assert calls == [4] * 6  # one call per problem: the shared pool of 4 serves both methods


# -- run-time contract violations: one error naming the plugin and its distribution ------------

ORIGINS = Origins(
    backbone="toy",
    task="toy_sum",
    scorers={"prm": "toy", "orm": "toy"},
    distributions={
        ("selector", "picky"): "dllmbench-picky",
        ("strategy", "bad"): "dllmbench-bad",
        ("scorer", "toy"): "dllmbench-toys",
        ("backbone", "toy"): "dllmbench-toys",
        ("task", "toy_sum"): "dllmbench-toys",
    },
)


class Picks:
    """A selector returning a fixed choice, whatever the pool."""

    needs = ()
    ceiling = False
    config = None

    def __init__(self, choice):
        self.choice = choice

    def select(self, candidates, *, rng, labels=None):
        return self.choice


def _violating(strategy=None, choice=0) -> list[Method]:
    strategy = strategy or Misreporting(2, T)
    return [Method("bad method", MethodSpec("bad", {}, "picky"), strategy, Picks(choice))]


@pytest.mark.parametrize(
    "choice,needle",
    [
        (-1, "select() returned index -1 for a pool of 2 candidates"),
        (2, "select() returned index 2 for a pool of 2 candidates"),
        (1.0, "select() returned a float, not an index or None"),
        (True, "select() returned a bool, not an index or None"),
    ],
)
def test_a_selector_choosing_outside_its_pool_is_a_violation_naming_it(choice, needle):
    task, eng = engine(_violating(choice=choice), size=1)
    eng.origins = ORIGINS
    with pytest.raises(PluginViolation) as info:
        eng.run(task.problems("test"))
    assert (info.value.plugin, info.value.distribution) == ("picky", "dllmbench-picky")
    assert str(info.value) == f"plugin 'picky' (from dllmbench-picky) broke its contract: {needle}"


def test_a_selector_may_choose_none_or_a_numpy_index():
    import numpy as np

    for choice, selected in ((None, None), (np.int64(1), 1)):
        task, eng = engine(_violating(choice=choice), size=1)
        [record] = eng.run(task.problems("test"))
        assert record["selected"] == selected and type(record["selected"]) is type(selected)


class ReturnsPool(Misreporting):
    """Denoises n rows honestly, then returns `keep` of them (or something not a pool)."""

    def __init__(self, n, keep):
        super().__init__(n, T)
        self.keep = keep

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=self.n), ops.T)
        if self.keep is None:
            return rows
        return ops.pool(rows.repeat(2).take(range(self.keep)))


class AwaitsSomethingElse(Misreporting):
    async def search(self, problem, ops):
        await _Bare()
        return ops.pool(ops.start(problem, copies=self.n))


class _Bare:
    def __await__(self):
        return (yield "please denoise")


@pytest.mark.parametrize(
    "strategy,needle",
    [
        (ReturnsPool(3, 2), "search() returned 2 candidates but declared 3"),
        (ReturnsPool(3, 4), "search() returned 4 candidates but declared 3"),
        (ReturnsPool(3, None), "search() returned a Rows, not a Pool"),
        (AwaitsSomethingElse(1, T), "search() awaited a str; await only ops.denoise or ops.score"),
    ],
    ids=["too-few", "too-many", "not-a-pool", "awaits-a-str"],
)
def test_a_strategy_breaking_its_contract_is_a_violation_naming_it(strategy, needle):
    task, eng = engine(_violating(strategy), size=1)
    eng.origins = ORIGINS
    with pytest.raises(PluginViolation, match=re.escape(needle)) as info:
        eng.run(task.problems("test"))
    assert (info.value.plugin, info.value.distribution) == ("bad", "dllmbench-bad")


class MiscountingScorer(ToyScorer):
    def score(self, batch):
        return super().score(batch)[:-1]


class MiscountingBackbone(ToyBackbone):
    def denoise_step_with_confidence(self, batch):
        out = super().denoise_step_with_confidence(batch)
        return [*out, out[0]]


class ShortRows(ToyBackbone):
    def denoise_step_with_confidence(self, batch):  # its denoise_step too
        return [(t[:-1], c[:-1]) for t, c in super().denoise_step_with_confidence(batch)]


class FloatCanvas(ToyBackbone):
    def canvas(self, prompt_ids, gen_length):
        return super().canvas(prompt_ids, gen_length).float()


class MiscountingGrader(ToySum):
    def grade_many(self, items):
        return [True]


@pytest.mark.parametrize(
    "part,needle",
    [
        ("scorers", "score() returned shape (1,) for a batch of 2 rows"),
        ("backbone", "denoise_step() returned 3 rows for a batch of 2"),
        ("task", "grade_many() returned 1 grades for 2 candidates"),
        (
            "short rows",
            "denoise_step() returned row 0 as a tensor of shape (20,) and dtype torch.int64 for "
            "a row of 21 token ids; return each row as long as it came, in its dtype",
        ),
        (
            "float canvas",
            "canvas() gave a tensor of shape (21,) and dtype torch.float32; return a 1-D long "
            "tensor",
        ),
    ],
)
def test_a_backbone_scorer_or_task_miscounting_is_a_violation_naming_it(part, needle):
    task, eng = engine([method("independent:n=2+argmax:scorer=orm")], size=1)
    eng.origins = ORIGINS
    if part == "scorers":
        eng.scorers = {"prm": ToyScorer(), "orm": MiscountingScorer(partial=False)}
    elif part == "backbone":
        eng.backbone = MiscountingBackbone()
    elif part == "short rows":
        eng.backbone = ShortRows()
    elif part == "float canvas":
        eng.backbone = FloatCanvas()
    else:
        eng.task = MiscountingGrader(size=1)
    with pytest.raises(PluginViolation, match=re.escape(needle)) as info:
        eng.run(task.problems("test"))
    expected = "toy_sum" if part == "task" else "toy"
    assert (info.value.plugin, info.value.distribution) == (expected, "dllmbench-toys")


MINUS_ONE = """
from dllmbench.api.hookspecs import hookimpl


class MinusOne:
    needs = ()
    ceiling = False

    def select(self, candidates, *, rng, labels=None):
        return -1


@hookimpl
def dllmbench_register_selectors(register):
    register("minus_one", MinusOne)
"""


@pytest.fixture
def minus_one_plugin(tmp_path, monkeypatch, registry_with):
    """A plugin module registering the selector `minus_one`, which always returns -1."""
    (tmp_path / "minus_one_double.py").write_text(MINUS_ONE)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_with("minus_one_double")


def test_a_selector_returning_minus_one_ends_the_run_with_one_line_and_exit_3(
    cli, tmp_path, minus_one_plugin
):
    out = tmp_path / "run"
    result = cli(
        *("run", "--task", "toy_sum:size=2", "--backbone", "toy", "--steps", "4"),
        *("--gen-length", "5", "--methods", "independent:n=2+minus_one", "--budget", "8"),
        *("--resamples", "10", "--out", out),
    )
    assert result.code == 3, result
    assert "Traceback" not in result.err
    # stderr: the progress line the run had started, then the error as one line
    [line] = [x for x in result.err.splitlines() if not x.startswith("dllmbench: toy_sum: ")]
    assert line == (
        "dllmbench: error: plugin 'minus_one' (from module:minus_one_double) broke its "
        "contract: select() returned index -1 for a pool of 2 candidates"
    )
    assert not (out / "samples.jsonl").exists() or not (out / "samples.jsonl").read_text()


# -- the collector's own channel for snapshots ----------------------------------------------


def test_collected_snapshots_travel_beside_the_records_not_inside_them(tmp_path):
    from dllmbench.scoring.collect import (
        CollectConfig,
        Trajectories,
        collection_manifest,
        load,
        run_collection,
    )

    task, backbone = ToySum(size=3), ToyBackbone()
    problems = task.problems("test")
    sampling = Sampling(T, GEN, "fewshot", 0)
    meta = collection_manifest("toy_sum", task, "test", "toy", backbone, sampling, 2, [4, T], 3)
    cfg = CollectConfig(task, backbone, meta, problems, 2, [4, T], sampling,
                        Capacity(batch_rows=8), shard_problems=2)  # fmt: skip
    records, strategies = [], set()
    real = Engine.run

    def spy(self, *args, **kwargs):
        strategies.add(self.methods[0].strategy)
        out = real(self, *args, **kwargs)
        records.extend(out)
        return out

    Engine.run = spy
    try:
        counts = run_collection(cfg, registry(), tmp_path)
    finally:
        Engine.run = real
    assert counts == {"problems": 3, "skipped": 0, "trajectories": 6}
    assert [r["info"] for r in records] == [{}] * 3  # no tensors ride in the records
    [strategy] = strategies
    assert isinstance(strategy, Trajectories) and strategy.kept == {}  # written, let go
    _, snapshots = load(tmp_path)
    assert len(snapshots) == 3 * 2 * 2  # problems × trajectories × snapshot steps
    assert [s.step for s in snapshots[:2]] == [4, T] and snapshots[1].final
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [line["shard"] for line in lines] == [0, 0, 0, 0, 1, 1]
    assert all(line["prompt_len"] > 0 and line["snapshots"] == 2 for line in lines)


# -- the scheduler ---------------------------------------------------------------------------


def test_capacity_cuts_rows_sorted_by_length_within_both_caps():
    lengths = [9, 3, 5, 3, 9, 4]
    assert Capacity(batch_rows=2).batches(lengths) == [[1, 3], [5, 2], [0, 4]]
    # at most 12 tokens: rows × the widest canvas of the batch
    assert Capacity(batch_rows=8, batch_tokens=12).batches(lengths) == [[1, 3, 5], [2], [0], [4]]
    assert Capacity().batches([]) == []
    with pytest.raises(ValueError, match="must be >= 1"):
        Capacity(problems=0)


def test_capacity_keeps_the_rows_of_one_canvas_in_one_batch():
    """Rows whose forward the backbone shares (`canvases`: one id per row) sit side by side
    and are cut where the batches compute the fewest canvases × width; without ids the cut is
    as before."""
    lengths = [5] * 8
    interleaved = [0, 1, 2, 3, 0, 1, 2, 3]
    assert Capacity(batch_rows=4).batches(lengths) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cut = Capacity(batch_rows=4).batches(lengths, interleaved)
    assert sorted(len({interleaved[i] for i in b}) for b in cut) == [2, 2]  # each canvas once
    assert sorted(i for b in cut for i in b) == list(range(8))
    # two canvases of three rows: by rows alone any cut costs as much, and the first (four
    # rows, then two) splits the second canvas; by canvases the cut keeps both whole
    lengths, canvases = [5] * 6, [0, 0, 0, 1, 1, 1]
    assert Capacity(batch_rows=4).batches(lengths) == [[0, 1, 2, 3], [4, 5]]
    assert Capacity(batch_rows=4).batches(lengths, canvases) == [[0, 1, 2], [3, 4, 5]]


class SharingToy(ToyBackbone):
    """The toy as a backbone that computes each canvas of a batch once (`SharesCanvases`),
    counting the canvases it computed."""

    def __init__(self, **config):
        super().__init__(**config)
        self.computed = 0

    def computed_rows(self, batch):
        firsts: dict[bytes, int] = {}
        for i, tokens in enumerate(batch.tokens):
            firsts.setdefault(tokens.numpy().tobytes(), i)
        return list(firsts.values())

    def denoise_step_with_confidence(self, batch):
        self.computed += len(self.computed_rows(batch))
        return super().denoise_step_with_confidence(batch)


def test_rows_of_one_canvas_are_batched_together_and_no_record_changes(monkeypatch):
    """Every row of a problem starts from one canvas and an ensemble steps one canvas at
    several settings: with small batches, keeping a canvas's rows in one batch computes
    fewer canvases than cutting by length alone, and every record is the same."""
    methods = [method(f"{name}:n=8+majority") for name in ("ensemble", "independent", "hex")]

    def run() -> tuple[list[str], int, int]:
        task, eng = engine(methods, batch_rows=6, problems_in_flight=2, size=3)
        eng.backbone = eng._shares = SharingToy()
        records = sorted(map(str, map(comparable, eng.run(task.problems("test")))))
        return records, eng.backbone.computed, eng.ledger.physical()["denoise"]["forwards"]

    together, computed, forwards = run()
    monkeypatch.setattr(Engine, "_canvases", lambda self, like, items: None)
    apart, computed_apart, forwards_apart = run()
    assert together == apart and len(together) == 3 * len(methods)
    assert forwards == forwards_apart  # as many forwards, each computing fewer canvases
    assert computed < 0.9 * computed_apart


def test_scoring_waits_are_served_before_any_denoising_step_and_resume_in_order():
    problem = ToySum(size=1).problems("test")[0]
    canvas = ToyBackbone().canvas([1, 2], GEN)
    one = Rows(problem, 0, "sample", 2, canvas.unsqueeze(0), (0,), ((0,),), (("m",),), (2,))
    queue = Scheduler(Capacity())
    waits = [
        DenoiseWait("d1", one, (2,)),
        ScoreWait("s-orm", one, "orm"),
        ScoreWait("s-prm", one, "prm"),
        ScoreWait("s-orm2", one, "orm"),
    ]
    queue.waiting = list(waits)
    groups = queue.round()
    assert [[w.run for w in g] for g in groups] == [["s-orm", "s-orm2"], ["s-prm"]]
    queue.served(groups)
    assert [run for run, _ in queue.ready] == ["s-orm", "s-prm", "s-orm2"]  # request order
    queue.ready.clear()
    for _ in range(2):  # a request for 2 steps takes part in 2 rounds
        assert queue.ready == deque()
        [group] = queue.round()
        assert [w.run for w in group] == ["d1"]
        queue.served([group])
    assert [run for run, _ in queue.ready] == ["d1"] and queue.waiting == []


def test_a_tasks_grade_note_lands_in_the_candidate_record(cli, tmp_path, monkeypatch):
    """A task with `grade_note` (NotesGrades) has its note kept per candidate; without a note
    the key is absent, so records of other tasks keep their shape."""
    from conftest import TOY_RUN

    from dllmbench.api.interfaces import NotesGrades
    from dllmbench.testing.doubles import ToySum

    def grade_note(self, problem, answer):
        return f"noted {answer}" if int(answer) % 2 else None

    monkeypatch.setattr(ToySum, "grade_note", grade_note, raising=False)
    out = tmp_path / "run"
    try:
        assert cli(*TOY_RUN, "--out", str(out)).code == 0
    finally:
        # isinstance(task, NotesGrades) caches ToySum as a NotesGrades once it has the method
        # (a Protocol of methods only is an ABC's subclass check): with the method gone, the
        # cache would make every later ToySum run in this process call a grade_note it lacks
        monkeypatch.undo()
        NotesGrades._abc_caches_clear()
    candidates = [
        c
        for line in (out / "samples.jsonl").read_text().splitlines()
        for c in json.loads(line)["candidates"]
    ]
    noted = [c for c in candidates if "grade_note" in c]
    assert noted and all(c["grade_note"] == f"noted {c['answer']}" for c in noted)
    assert all(
        c["answer"] is None or int(c["answer"]) % 2 == 0
        for c in candidates
        if "grade_note" not in c
    )
