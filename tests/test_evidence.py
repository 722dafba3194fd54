"""dllmbench.analysis.evidence: a run directory's records as the inputs of the pooled estimators and
the diagnostics, on a real run of the doubles and on hand-built records whose answers are
known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import toy_argv

from dllmbench.analysis import diagnostics, evidence
from dllmbench.analysis.pooled import PooledCandidate, pooled_curves
from dllmbench.api.interfaces import evidence_of
from dllmbench.cli import main
from dllmbench.core.errors import UserError
from dllmbench.loading.registry import registry

# T = 8, segments of 4 steps; the toy spreads its commits over T, so states at step 4 are partial
BASE = [*toy_argv(5, "toy:spread=true"), "--resamples", "100"]
GUIDED_FAMILIES = "vanilla,majority,orm_rerank,prm_guided,top_m,prm_hybrid,smc_vote,smc_top,oracle"
GUIDED_RUN = [*BASE, "--methods", GUIDED_FAMILIES, "--budget", "80"]


@pytest.fixture(scope="module")
def guided_run(tmp_path_factory) -> evidence.RunData:
    out = tmp_path_factory.mktemp("evidence") / "run"
    assert main([*GUIDED_RUN, "--out", str(out)]) in (0, None)
    return evidence.load_run(out)


def _method(run: evidence.RunData, family: str) -> str:
    return next(mid for mid, m in run.methods.items() if m["family"] == family)


# -- a real run ------------------------------------------------------------------------------


def test_load_run_reads_every_file(guided_run):
    assert guided_run.problems == tuple(f"test-{i}" for i in range(5))
    assert guided_run.results is not None and guided_run.results["methods"]
    assert set(guided_run.by_method) == set(guided_run.methods)
    assert all(len(recs) == 5 for recs in guided_run.by_method.values())


def test_independent_pool_is_the_largest_with_every_score(guided_run):
    [(key, pools)] = evidence.independent_pools(guided_run).items()
    assert key == "independent"
    majority = guided_run.by_method[_method(guided_run, "majority")]
    orm = guided_run.by_method[_method(guided_run, "orm_rerank")]
    for pid, pool in zip(pools.problems, pools.pools, strict=True):
        assert [c.key for c in pool] == [c["key"] for c in majority[pid]["candidates"]]
        scored = [c["scores"]["orm"] for c in orm[pid]["candidates"]]
        assert [c.scores["orm"] for c in pool[: len(scored)]] == scored
        assert all("orm" not in c.scores for c in pool[len(scored) :])
    n_orm = len(next(iter(orm.values()))["candidates"])
    assert len(pools.pools[0]) > n_orm  # Majority's pool is larger than ORM Rerank's
    assert pools.scorers == ()
    assert pools.prefix(n_orm).scorers == ("orm",)
    curves = pooled_curves(pools.prefix(n_orm).pools, seed=0)
    assert "argmax:orm" in curves


def test_pools_by_method_hold_each_methods_candidates(guided_run):
    pools = evidence.pools_by_method(guided_run)
    assert list(pools) == list(guided_run.methods)
    for mid, pool_set in pools.items():
        for pid, pool in zip(pool_set.problems, pool_set.pools, strict=True):
            record = guided_run.by_method[mid][pid]
            assert [c.correct for c in pool] == [c["correct"] for c in record["candidates"]]
    summary = diagnostics.pool_diversity(pools[_method(guided_run, "prm_hybrid")].pools)
    assert 0.0 <= summary.oracle <= 1.0


def test_scored_states_on_a_real_run(guided_run):
    guided = guided_run.methods[_method(guided_run, "prm_guided")]["strategy"]["config"]
    k, problems = guided["k"], len(guided_run.problems)
    states = evidence.scored_states(guided_run)
    partial = [s for s in states if s.mask_ratio > 0]
    final = [s for s in states if s.mask_ratio == 0]
    # the first segment (shared by PRM Guided and Top-M) once, and PRM Guided's K finals
    assert len(partial) == len(final) == k * problems
    assert {s.mask_ratio for s in partial} == {0.4}  # 2 of 5 positions masked at step 4 of 8
    assert len(diagnostics.auc_by_mask_bucket(states, resamples=50)) == 10
    lineage = evidence.scored_states(guided_run, labels="lineage")
    # per problem: PRM Guided's one kept first-segment child and K finals, and Top-M's argmax
    # unless it descends from the same first-segment child (then it is one of those finals)
    top_m = guided_run.by_method[_method(guided_run, "top_m")]
    prm = guided_run.by_method[_method(guided_run, "prm_guided")]
    extra = sum(
        top_m[pid]["candidates"][0]["lineage"][0] != prm[pid]["candidates"][0]["lineage"][0]
        for pid in guided_run.problems
    )
    assert len(lineage) == (1 + k) * problems + extra


def test_final_states_are_the_scored_independent_candidates(guided_run):
    orm = guided_run.by_method[_method(guided_run, "orm_rerank")]
    states = evidence.final_states(guided_run, "orm")
    assert len(states) == sum(len(r["candidates"]) for r in orm.values())
    assert all(s.mask_ratio == 0.0 for s in states)
    assert evidence.final_states(guided_run, "nothing") == []


def test_pruning_events_and_checkpoints_on_a_real_run(guided_run):
    events = evidence.pruning_events(guided_run)
    problems = len(guided_run.problems)
    assert sorted(len(e.kept) for e in events) == [1] * problems + [2] * problems
    assert diagnostics.removal_risk(events).events == 2 * problems
    only_top_m = evidence.pruning_events(guided_run, method=_method(guided_run, "top_m"))
    assert [len(e.kept) for e in only_top_m] == [2] * problems
    checkpoints = evidence.smc_checkpoints(guided_run)
    assert len(checkpoints) == problems  # one intermediate checkpoint each, the runs shared
    assert len(evidence.smc_checkpoints(guided_run, final=True)) == 2 * problems
    assert diagnostics.smc_diagnostics(checkpoints).checkpoints[0].n == len(checkpoints[0].weights)
    assert set(evidence.guided_methods(guided_run)) == {
        _method(guided_run, f) for f in ("prm_guided", "top_m", "prm_hybrid", "smc_vote", "smc_top")
    }
    with pytest.raises(ValueError, match="no method"):
        evidence.pruning_events(guided_run, method="Nothing@3")


def test_a_single_segment_is_the_independent_sample(tmp_path):
    """The premise of the continuation labels: a guided child with lineage (i,) denoised
    with its own key is independent candidate i (common random numbers)."""
    out = tmp_path / "run"
    methods = ["independent:n=4+argmax:scorer=orm", "prm_guided:k=4,every=8,final=keep+majority"]
    argv = [*BASE, "--budget", "200", "--out", str(out)]
    assert main([*argv, "--method", methods[0], "--method", methods[1]]) in (0, None)
    run = evidence.load_run(out)
    independent, guided = run.methods
    for pid in run.problems:
        a = run.by_method[independent][pid]["candidates"]
        b = run.by_method[guided][pid]["candidates"]
        assert [(c["text"], c["lineage"]) for c in a] == [(c["text"], c["lineage"]) for c in b]


# -- hand-built records ----------------------------------------------------------------------


def _method_entry(mid: str, strategy: str, config: dict, selector: str = "first") -> dict:
    """A manifest entry as a run writes it, with the evidence the built-in strategy declares."""
    declared = evidence_of(registry().strategy(strategy, **config)).as_dict()
    return {
        "id": mid,
        "family": None,
        "spec": mid,
        "strategy": {"name": strategy, "config": config},
        "selector": {"name": selector, "config": {}},
        "ceiling": False,
        "evidence": declared,
        "cost": {},
    }


def _candidate(correct: bool, lineage: list[int], key: str | None = None, **scores) -> dict:
    key = key if key is not None else ("right" if correct else f"wrong{lineage}")
    return {
        "text": f"{key}{lineage}",
        "answer": key,
        "valid": True,
        "key": key,
        "correct": correct,
        "scores": scores,
        "weight": None,
        "lineage": lineage,
    }


def _record(problem: str, method: str, candidates: list[dict], info: dict | None = None) -> dict:
    return {
        "problem": problem,
        "method": method,
        "selected": 0,
        "answer": candidates[0]["answer"],
        "correct": candidates[0]["correct"],
        "ceiling": False,
        "candidates": candidates,
        "ledger": {"passes": {}, "total_passes": 0, "forwards": {}, "seconds": {}},
        "info": info or {},
    }


def _write_run(path: Path, methods: list[dict], records: list[dict]) -> evidence.RunData:
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"methods": methods}))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return evidence.load_run(path)


GUIDED = {"k": 4, "every": 4, "keep": 1, "final": "keep", "scorer": "prm"}


def _guided_info(first_scores: list[float], kept_first: int, masks=(0.5, 0.0)) -> dict:
    return {
        "step": [4, 8],
        "mask": [[masks[0]] * 4, [masks[1]] * 4],
        "scores": [first_scores, [1.0, 2.0, 3.0, 4.0]],
        "parent": [[-1] * 4, [kept_first] * 4],
        "kept": [[kept_first], [0, 1, 2, 3]],
    }


def _two_segment_run(tmp_path, kept_first: int, final_correct: list[bool]) -> evidence.RunData:
    """Independent pool of 4 where only candidate 1 is correct; a PRM Guided K=4 run whose cut
    keeps `kept_first`, its final children with the given correctness."""
    methods = [
        _method_entry("Majority@4", "independent", {"n": 4}),
        _method_entry("Guided", "prm_guided", GUIDED),
    ]
    independent = [_candidate(i == 1, [i]) for i in range(4)]
    finals = [
        _candidate(ok, [kept_first, j], prm=float(j + 1)) for j, ok in enumerate(final_correct)
    ]
    info = _guided_info([0.1, 0.2, 0.3, 0.4], kept_first)
    records = [_record("p-0", "Majority@4", independent), _record("p-0", "Guided", finals, info)]
    return _write_run(tmp_path / f"run{kept_first}", methods, records)


def test_a_cut_that_removes_the_only_correct_lineage_has_removal_risk_one(tmp_path):
    run = _two_segment_run(tmp_path, kept_first=0, final_correct=[False] * 4)
    [event] = evidence.pruning_events(run)
    assert event.kept == {(0,)} and event.removed == {(1,), (2,), (3,)}
    assert event.reaches_correct == {(0,): False, (1,): True, (2,): False, (3,): False}
    risk = diagnostics.removal_risk([event])
    assert (risk.at_risk, risk.lost, risk.rate) == (1, 1, 1.0)


def test_a_cut_that_keeps_the_correct_lineage_loses_nothing(tmp_path):
    run = _two_segment_run(tmp_path, kept_first=1, final_correct=[True, False, True, False])
    risk = diagnostics.removal_risk(evidence.pruning_events(run))
    assert (risk.at_risk, risk.lost, risk.rate) == (1, 0, 0.0)


def test_continuation_labels_follow_the_independent_candidates(tmp_path):
    run = _two_segment_run(tmp_path, kept_first=2, final_correct=[False, True, False, False])
    states = evidence.scored_states(run)
    first = [(s.score, s.label, s.mask_ratio) for s in states if s.mask_ratio == 0.5]
    assert first == [(0.1, False, 0.5), (0.2, True, 0.5), (0.3, False, 0.5), (0.4, False, 0.5)]
    final = [(s.score, s.label) for s in states if s.mask_ratio == 0.0]
    assert final == [(1.0, False), (2.0, True), (3.0, False), (4.0, False)]
    [bucket] = [b for b in diagnostics.auc_by_mask_bucket(states, resamples=20) if b.n and b.low]
    assert bucket.auc == pytest.approx(1 / 3)  # the correct state outranks 1 of 3 wrong ones


def test_lineage_labels_only_states_whose_future_is_recorded(tmp_path):
    run = _two_segment_run(tmp_path, kept_first=2, final_correct=[False, True, False, False])
    states = evidence.scored_states(run, labels="lineage")
    # the kept first-segment child (score 0.3) reaches the correct final child; removed ones
    # have no future and are left out
    assert [(s.score, s.label) for s in states if s.mask_ratio == 0.5] == [(0.3, True)]
    assert len([s for s in states if s.mask_ratio == 0.0]) == 4


def test_later_segments_and_pruned_finals_are_left_out(tmp_path):
    """A three-segment Top-2 run with final=prune: continuation labels only the first
    segment; lineage labels only the argmax (the others' final siblings are not graded)."""
    config = {"k": 4, "every": 3, "keep": 2, "final": "prune", "scorer": "prm"}
    methods = [
        _method_entry("Majority@4", "independent", {"n": 4}),
        _method_entry("Top2", "prm_guided", config),
    ]
    info = {
        "step": [3, 6, 8],
        "mask": [[0.6] * 4, [0.3] * 4, [0.0] * 4],
        "scores": [[0.4, 0.3, 0.2, 0.1], [1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3]],
        "parent": [[-1] * 4, [0, 0, 1, 1], [3, 3, 2, 2]],
        "kept": [[0, 1], [3, 2], [1]],
    }
    # child 1 of the last segment: parent 3 of segment 2 (lineage (1, 1)), its second child
    final = [_candidate(True, [1, 1, 1], prm=2.1)]
    independent = [_candidate(i == 3, [i]) for i in range(4)]
    records = [_record("p-0", "Majority@4", independent), _record("p-0", "Top2", final, info)]
    run = _write_run(tmp_path / "run", methods, records)
    continuation = evidence.scored_states(run)
    assert [(s.mask_ratio, s.label) for s in continuation] == [
        (0.6, False),
        (0.6, False),
        (0.6, False),
        (0.6, True),
    ]
    lineage = evidence.scored_states(run, labels="lineage")
    assert [(s.score, s.label, s.mask_ratio) for s in lineage] == [(2.1, True, 0.0)]
    [event] = evidence.pruning_events(run)  # only the first cut
    assert event.kept == {(0,), (1,)}


def test_records_that_disagree_with_their_info_are_refused(tmp_path):
    methods = [_method_entry("Guided", "prm_guided", GUIDED)]
    finals = [_candidate(False, [3, j]) for j in range(4)]  # info says the cut kept 0
    records = [_record("p-0", "Guided", finals, _guided_info([0.1, 0.2, 0.3, 0.4], 0))]
    run = _write_run(tmp_path / "run", methods, records)
    with pytest.raises(ValueError, match="does not match its candidates"):
        evidence.scored_states(run)


def test_shared_runs_count_once_and_cuts_without_continuations_are_left_out(tmp_path):
    methods = [
        _method_entry("Guided", "prm_guided", GUIDED, "argmax"),
        _method_entry("Hybrid", "prm_guided", GUIDED, "majority"),
        _method_entry("Majority@2", "independent", {"n": 2}),
    ]
    finals = [_candidate(j == 0, [0, j], prm=float(j)) for j in range(4)]
    info = _guided_info([0.4, 0.3, 0.2, 0.1], 0)
    independent = [_candidate(False, [i]) for i in range(2)]
    records = [
        _record("p-0", "Guided", finals, info),
        _record("p-0", "Hybrid", finals, info),
        _record("p-0", "Majority@2", independent),
    ]
    run = _write_run(tmp_path / "run", methods, records)
    assert evidence.pruning_events(run) == []  # independent candidates 2 and 3 are missing
    states = evidence.scored_states(run)
    assert len(states) == 2 + 4  # first-segment children 0 and 1, and the 4 finals, once
    assert len(evidence.scored_states(run, method="Hybrid")) == 6


def test_a_state_scored_again_in_another_batch_counts_once(tmp_path):
    """PRM Guided K=2 and K=4 at the same `every` share their first-segment rows (lineages
    (0,) and (1,)). Scored in other batches (a resumed run, another share) one score differs in
    its last digit; the state still counts once, as in a run scored in one batch, so the
    report of a resumed run is the uninterrupted run's."""
    small = {**GUIDED, "k": 2}
    methods = [
        _method_entry("Majority@4", "independent", {"n": 4}),
        _method_entry("Guided", "prm_guided", GUIDED),
        _method_entry("Guided2", "prm_guided", small),
    ]
    independent = [_candidate(i == 1, [i]) for i in range(4)]
    finals = [_candidate(False, [0, j], prm=float(j + 1)) for j in range(4)]
    pair = [_candidate(False, [0, j], prm=float(j + 1)) for j in range(2)]
    info = _guided_info([0.1, 0.2, 0.3, 0.4], 0)

    def run_with(second: float, name: str) -> evidence.RunData:
        info2 = {
            "step": [4, 8],
            "mask": [[0.5, 0.5], [0.0, 0.0]],
            "scores": [[0.1, second], [1.0, 2.0]],
            "parent": [[-1, -1], [0, 0]],
            "kept": [[0], [0, 1]],
        }
        records = [
            _record("p-0", "Majority@4", independent),
            _record("p-0", "Guided", finals, info),
            _record("p-0", "Guided2", pair, info2),
        ]
        return _write_run(tmp_path / name, methods, records)

    def first_segment(run: evidence.RunData) -> list[float]:
        return [s.score for s in evidence.scored_states(run) if s.mask_ratio == 0.5]

    assert first_segment(run_with(0.2, "one_batch")) == [0.1, 0.2, 0.3, 0.4]
    assert first_segment(run_with(0.200001, "resumed")) == [0.1, 0.2, 0.3, 0.4]
    # a score that is not the same row's is another state
    assert first_segment(run_with(0.25, "other")) == [0.1, 0.2, 0.3, 0.4, 0.25]


def test_smc_checkpoints_from_info(tmp_path):
    config = {"k": 3, "every": 2, "scorer": "prm"}
    methods = [_method_entry("SMC", "smc", config)]
    info = {
        "beta": [0.5, 0.25, 1.0],
        "ess": [1.8, 3.0, 2.5],
        "resampled": [True, False],
        "step": [2, 4, 6],
        "mask": [[0.6] * 3, [0.3] * 3, [0.0] * 3],
        "weights": [[0.8, 0.1, 0.1], [0.3, 0.3, 0.4], [0.2, 0.3, 0.5]],
        "ancestors": [[0, 0, 2], [0, 1, 2]],
    }
    cands = [_candidate(False, [a, j]) for j, a in enumerate([0, 0, 2])]
    run = _write_run(tmp_path / "run", methods, [_record("p-0", "SMC", cands, info)])
    first, second = evidence.smc_checkpoints(run)
    assert (first.resampled, first.beta, list(first.ancestors)) == (True, 0.5, [0, 0, 2])
    assert (second.resampled, second.ancestors) == (False, None)
    stats = diagnostics.checkpoint_stats(first)
    assert stats.distinct_ancestors == 2 and stats.ess_after == 3.0
    *_, last = evidence.smc_checkpoints(run, final=True)
    assert (last.weights, last.resampled, last.beta) == ([0.2, 0.3, 0.5], False, 1.0)


def test_independent_pools_merge_scores_and_order_problems_naturally(tmp_path):
    methods = [
        _method_entry("Majority@3", "independent", {"n": 3}, "majority"),
        _method_entry("ORM@2", "independent", {"n": 2}, "argmax"),
    ]
    records = []
    for pid in ("q-10", "q-2"):
        records.append(_record(pid, "Majority@3", [_candidate(i == 0, [i]) for i in range(3)]))
        records.append(_record(pid, "ORM@2", [_candidate(i == 0, [i], orm=i) for i in range(2)]))
    run = _write_run(tmp_path / "run", methods, records)
    assert run.problems == ("q-2", "q-10")
    pools = evidence.independent_pools(run)["independent"]
    assert pools.problems == ("q-2", "q-10")
    assert [len(p) for p in pools.pools] == [3, 3]
    assert pools.pools[0][1] == PooledCandidate("wrong[1]", False, {"orm": 1.0}, None)
    assert pools.pools[0][2].scores == {}
    assert [s.label for s in evidence.final_states(run, "orm")] == [True, False, True, False]


def test_pools_of_one_run_that_differ_are_refused(tmp_path):
    methods = [
        _method_entry("Majority@2", "independent", {"n": 2}),
        _method_entry("Vanilla", "independent", {"n": 1}),
    ]
    records = [
        _record("p-0", "Majority@2", [_candidate(True, [0]), _candidate(False, [1])]),
        _record("p-0", "Vanilla", [_candidate(False, [0])]),
    ]
    run = _write_run(tmp_path / "run", methods, records)
    with pytest.raises(ValueError, match="differ at candidate 0"):
        evidence.independent_pools(run)


def test_records_without_info_are_skipped(tmp_path):
    methods = [_method_entry("Guided", "prm_guided", GUIDED), _method_entry("SMC", "smc", {})]
    records = [
        _record("p-0", "Guided", [_candidate(True, [0, 0])]),
        _record("p-0", "SMC", [_candidate(True, [0, 0])]),
    ]
    run = _write_run(tmp_path / "run", methods, records)
    assert evidence.scored_states(run) == []
    assert evidence.pruning_events(run) == []
    assert evidence.smc_checkpoints(run) == []


def test_load_run_refuses_what_is_not_a_run_directory(tmp_path):
    with pytest.raises(UserError, match="not a run directory") as err:
        evidence.load_run(tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not a JSON object"):
        evidence.load_run(tmp_path)
