"""The engine: ledger checks, batch-size independence, nested pools, common random numbers."""

from __future__ import annotations

from typing import ClassVar

import pytest

from dllmbench.engine import Engine, Limits, Sampling, plan_units
from dllmbench.errors import CostMismatch
from dllmbench.method import Method, MethodSpec
from dllmbench.planner import plan
from dllmbench.registry import registry
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
        limits=Limits(batch_rows=batch_rows, problems=problems_in_flight),
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
    return [p.method for p in plan(registry(), budget, T).methods]


def test_results_identical_for_batch_sizes_1_7_64():
    runs = []
    for rows in (1, 7, 64):
        task, eng = engine(all_families(), batch_rows=rows, problems_in_flight=3)
        runs.append(sorted(map(str, map(comparable, eng.run(task.problems("test"))))))
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0]) == 6 * len(all_families())


def test_token_cap_splits_batches_but_not_results():
    task, capped = engine(all_families()[:3], batch_rows=64)
    capped.limits = Limits(batch_rows=64, batch_tokens=40, problems=4)
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


@pytest.mark.parametrize(
    "strategy,needle",
    [
        (AsksForAnUnknownScorer(1, T), "which this run lacks"),
        (ScoresPartialWithAnORM(1, T), "reads final states only"),
    ],
)
def test_ops_refuses_scorers_the_run_cannot_serve(strategy, needle):
    from dllmbench.errors import PluginError

    task, eng = engine([_bad(strategy)], size=1)
    with pytest.raises(PluginError, match=needle):
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
