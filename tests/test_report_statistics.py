"""The report's statistics, each checked against a value worked by hand (issue 35): guided
Kendall τ by kind of state, the exact order statistic of a resampled interval, a paired
interval that McNemar's test contradicts, Majority counting failed extractions under
`--preset paper`, intervals of the removal rate and the Kendall medians, the recorded SMC ESS,
rounded pool measures, and remasked states kept apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dllmbench.analysis import evidence, leaderboard, report_markdown
from dllmbench.analysis import report_sections as sections
from dllmbench.analysis.results import summarize
from dllmbench.analysis.stats import (
    bootstrap_ci,
    paired_difference,
    percentile_interval,
    resample_indices,
)
from dllmbench.api.interfaces import evidence_of
from dllmbench.loading.registry import registry

DOCS = Path(__file__).parent.parent / "docs"
BOOT = sections.Boot(seed=0, resamples=2000, level=0.95)
SQRT_HALF = 3 / 18**0.5  # τ-b of one state of 4 outranking (or under) the other 3: 3/√18


# -- hand-built run directories ----------------------------------------------------------------


def _method(mid: str, strategy: str, config: dict, selector: str = "first") -> dict:
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


def _candidate(correct: bool, lineage: list[int], text: str = "", **extra) -> dict:
    key = "right" if correct else f"wrong{lineage}"
    return {
        "text": text or f"{key}{lineage}",
        "answer": key,
        "valid": True,
        "key": key,
        "correct": correct,
        "scores": {},
        "weight": None,
        "lineage": lineage,
        **extra,
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


def _run(path: Path, methods: list[dict], records: list[dict]) -> evidence.RunData:
    path.mkdir()
    manifest = {"methods": methods, "scorers": {"prm": {"name": "prm", "config": {}}}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return evidence.load_run(path)


def _guided(first: list[float], kept: list[int], final: list[float]) -> dict:
    """Two segments of a K=4 prm_guided run (steps 4, 8): the cut keeps `kept`, two
    children per kept parent (four when one is kept)."""
    per = 4 // len(kept)
    return {
        "step": [4, 8],
        "mask": [[0.5] * 4, [0.0] * 4],
        "scores": [first, final],
        "parent": [[-1] * 4, [p for p in kept for _ in range(per)]],
        "kept": [kept, [0, 1, 2, 3]],
    }


def _finals(kept: list[int], correct: list[bool], text: str = "", **extra) -> list[dict]:
    per = 4 // len(kept)
    lineages = [[p, j] for p in kept for j in range(per)]
    return [
        _candidate(ok, lin, f"{text}{lin}" if text else "", **extra)
        for ok, lin in zip(correct, lineages, strict=True)
    ]


KEEP_ONE = {"k": 4, "every": 4, "keep": 1, "final": "keep", "scorer": "prm"}
KEEP_TWO = {"k": 4, "every": 4, "keep": 2, "final": "keep", "scorer": "prm"}


# -- 1. guided Kendall τ by kind of state ------------------------------------------------------


def _opposite_kinds(tmp_path: Path) -> evidence.RunData:
    """Two problems, independent candidate 1 the only correct one and the cut keeping child 1.
    First segment: on p-0 the PRM ranks the correct state (child 1) above the other three
    (τ = +3/√18), on p-1 below them (τ = −3/√18). Final states: on both the correct one
    (final child 0) scores lowest (τ = −3/√18)."""
    methods = [
        _method("Majority@4", "independent", {"n": 4}),
        _method("Guided", "prm_guided", KEEP_ONE),
    ]
    records = []
    for pid, first in (("p-0", [0.1, 0.4, 0.2, 0.3]), ("p-1", [0.4, 0.1, 0.3, 0.2])):
        records.append(_record(pid, "Majority@4", [_candidate(i == 1, [i]) for i in range(4)]))
        finals = _finals([1], [True, False, False, False])
        records.append(_record(pid, "Guided", finals, _guided(first, [1], [1.0, 2.0, 3.0, 4.0])))
    return _run(tmp_path / "run", methods, records)


def test_guided_kendall_tau_is_taken_apart_for_each_kind_of_state(tmp_path):
    """The first segment's states and the kept branch's final states are ranked apart, each
    with the interval of its median; one τ over both (the old mixed number) is gone."""
    [entry] = sections.discrimination([_opposite_kinds(tmp_path)], BOOT)
    assert (entry["scorer"], entry["states"], entry["count"]) == ("prm", "guided", 16)
    first, final = entry["kendall_tau"]
    # first segment: τ = +3/√18 on p-0, −3/√18 on p-1; median 0 (the mean of the two)
    assert (first["states"], first["count"]) == ("first_segment", 8)
    assert (first["problems"], first["undefined"]) == (2, 0)
    assert first["median"] == first["mean"] == 0.0
    # resampling 2 problems: both p-0 (¼), one of each (½), both p-1 (¼): the 2.5% and 97.5%
    # quantiles of the median are the two problems' τ
    half = round(SQRT_HALF, 6)
    assert first["interval"] == {
        "value": 0.0,
        "low": -half,
        "high": half,
        "exact": False,
        "mc_error": 0.0,
    }
    # final states: the correct one scores lowest on both problems, τ = −3/√18 each
    assert (final["states"], final["count"]) == ("final", 8)
    assert final["median"] == final["mean"] == -half
    assert (final["interval"]["low"], final["interval"]["high"]) == (-half, -half)


def test_report_md_shows_each_kind_and_names_the_papers_tau_precisely(tmp_path):
    data = sections.diagnostics_section([_opposite_kinds(tmp_path)], 0, 2000, 0.95)
    text = "\n".join(report_markdown.md_discrimination({"diagnostics": data, "level": 0.95}))
    rows = [line for line in text.splitlines() if line.startswith("| prm |")]
    assert rows == [
        "| prm | guided | first segment | 8 | 2 | +0.000 [-0.707, +0.707] | +0.000 | 0 |",
        "| prm | guided | final | 8 | 2 | -0.707 [-0.707, -0.707] | -0.707 | 0 |",
    ]
    assert "the `final` row of the `final` states" in text
    for found in (
        text,
        *((DOCS / doc).read_text() for doc in ("results-schema.md", "user-guide.md")),
    ):
        assert "headline statistic" not in found


# -- 3. the order statistic of a resampled interval --------------------------------------------


def test_a_resampled_interval_takes_the_50th_and_1950th_of_2000_draws():
    """At 95% the tail is 1/40 exactly: of 2,000 draws the ends are the 50th and the 1950th
    smallest (the float (1 − 0.95)/2 = 0.025000000000000022 took the 51st)."""
    draws = np.arange(1.0, 2001.0)
    np.random.default_rng(0).shuffle(draws)
    interval = percentile_interval(draws, 0.0, 0.95)
    assert (interval.low, interval.high) == (50.0, 1950.0)
    # with the draws a resampled mean gives, through bootstrap_ci
    x = np.random.default_rng(3).normal(size=25)
    means = np.sort(x[resample_indices(25, 2000, 7)].mean(axis=1))
    ci = bootstrap_ci(x, resamples=2000, seed=7)
    assert (ci.low, ci.high) == (means[49], means[1949])
    # 10,000 draws at 90%: ranks 500 and 9500
    ten = np.arange(1.0, 10_001.0)
    assert (percentile_interval(ten, 0.0, 0.9).low, percentile_interval(ten, 0.0, 0.9).high) == (
        500.0,
        9500.0,
    )


# -- 4. a paired interval McNemar's test contradicts -------------------------------------------


def _results(better: int) -> dict:
    """A results.json of 30 problems: Vanilla solves none, Method solves `better`."""
    methods = [
        {"id": m, "spec": f"independent:n=1+{s}", "ceiling": False, "cost": {"denoise": 8}}
        for m, s in (("Vanilla", "first"), ("Method", "majority:invalid=vote"))
    ]
    records = [
        {
            "problem": f"p{i}",
            "method": m,
            "correct": m == "Method" and i < better,
            "ceiling": False,
            "candidates": [{"key": "a", "valid": True, "correct": False}],
            "ledger": {"total_passes": 8},
        }
        for i in range(30)
        for m in ("Vanilla", "Method")
    ]
    return summarize(records, methods, [f"p{i}" for i in range(30)], budget=8, resamples=200)


def test_an_interval_that_mcnemar_contradicts_is_flagged():
    """4 better, 0 worse of 30: the exact interval is [+1/30, +8/30] (P(no better problem
    drawn) = (26/30)^30 = 1.4% < 2.5%), excluding 0, while McNemar's p = 2·(½)^4 = 0.125."""
    diff = paired_difference([1] * 4 + [0] * 26, [0] * 30)
    assert (diff.low, diff.high, diff.p_value) == pytest.approx((1 / 30, 8 / 30, 0.125))
    assert diff.agrees is False and diff.as_dict()["mcnemar_agrees"] is False
    agree = paired_difference([1] * 6 + [0] * 24, [0] * 30)  # p = 2·(½)^6 = 0.03125
    assert agree.low > 0 and agree.agrees is True
    results = _results(4)
    [method] = [m for m in results["methods"] if m["id"] == "Method"]
    assert method["delta_vs_reference"]["mcnemar_agrees"] is False
    [row] = [cells for _, cells in leaderboard.rows(results) if cells[0] == "Method"]
    assert row[8] == "0.12 †"
    assert leaderboard.disagree_note(0.95) in leaderboard.capped_note(results)
    assert "† " in leaderboard.markdown(results).split("| Method |")[1]
    report = {"methods": [{**m, "run": 0} for m in results["methods"]], "reference": "Vanilla"}
    text = "\n".join(report_markdown.md_methods({**report, "budgets": [8], "level": 0.95}))
    assert "0.125 (+4/−0) †" in text and leaderboard.disagree_note(0.95) in text
    six = _results(6)
    assert "†" not in leaderboard.markdown(six)
    assert "mcnemar_agrees" in (DOCS / "results-schema.md").read_text()


# -- 5. failed extractions vote under --preset paper --------------------------------------------


def test_a_majority_whose_failed_extractions_vote_says_so_under_the_leaderboard():
    results = _results(6)
    assert leaderboard.INVALID_VOTE_NOTE in leaderboard.capped_note(results)
    assert leaderboard.INVALID_VOTE_NOTE in leaderboard.markdown(results)
    assert leaderboard.invalid_votes("independent:n=8+majority:invalid=vote")
    assert not leaderboard.invalid_votes("independent:n=8+majority")
    assert not leaderboard.invalid_votes("independent:n=8+majority:invalid=drop")
    text = (DOCS / "reproducing.md").read_text()
    assert "invalid=vote" in text and "invalid=drop" in text


# -- 9. small things ----------------------------------------------------------------------------


def test_pool_unique_answers_is_rounded_to_six_digits():
    """Unique answers 1, 1, 2 over three problems: 4/3, written as 1.333333."""
    methods = [{"id": "Maj", "spec": "independent:n=2+majority", "ceiling": False, "cost": {}}]
    keys = (("a", "a"), ("b", "b"), ("c", "d"))
    records = [
        {
            "problem": f"p{i}",
            "method": "Maj",
            "correct": False,
            "ceiling": False,
            "candidates": [{"key": k, "valid": True, "correct": False} for k in pair],
            "ledger": {"total_passes": 2},
        }
        for i, pair in enumerate(keys)
    ]
    [entry] = summarize(records, methods, ["p0", "p1", "p2"], budget=2, resamples=20)["methods"]
    assert entry["pool"]["unique_answers"] == 1.333333


def _removal_run(tmp_path: Path) -> evidence.RunData:
    """Two problems whose first cut keeps child 0 while only independent candidate 1 is
    correct (p-0: lost) or only candidate 0 is (p-1: kept)."""
    methods = [
        _method("Majority@4", "independent", {"n": 4}),
        _method("Guided", "prm_guided", KEEP_ONE),
    ]
    records = []
    for pid, good in (("p-0", 1), ("p-1", 0)):
        pool = [_candidate(i == good, [i]) for i in range(4)]
        records.append(_record(pid, "Majority@4", pool))
        info = _guided([0.4, 0.3, 0.2, 0.1], [0], [1.0, 2.0, 3.0, 4.0])
        records.append(_record(pid, "Guided", _finals([0], [False] * 4), info))
    return _run(tmp_path / "run", methods, records)


def test_the_runs_removal_rate_has_its_interval(tmp_path):
    """1 lost of 2 at risk: rate ½. Resampling the 2 cuts gives both lost (¼, rate 1), one of
    each (½, rate ½) or neither (¼, rate 0): the interval is [0, 1]."""
    diagnostics = sections.diagnostics_section([_removal_run(tmp_path)], 0, 2000, 0.95)
    [entry] = diagnostics["removal_risk"]
    assert (entry["events"], entry["at_risk"], entry["lost"], entry["rate"]) == (2, 2, 1, 0.5)
    assert entry["interval"] == {
        "value": 0.5,
        "low": 0.0,
        "high": 1.0,
        "exact": False,
        "mc_error": 0.0,
    }


def test_smc_ess_is_the_one_the_strategy_recorded(tmp_path):
    """32 particles, two of weight 0.4999940 and thirty of 4e-7: the weights as recorded (6
    digits) give ESS 2.0, the strategy's unrounded weights 2.000048, which `info.ess` holds."""
    config = {"k": 32, "every": 2, "scorer": "prm"}
    weights = [0.499994, 0.499994] + [0.0] * 30
    info = {
        "beta": [0.5, 1.0],
        "ess": [2.000048, 32.0],
        "resampled": [False],
        "step": [2, 4],
        "mask": [[0.5] * 32, [0.0] * 32],
        "weights": [weights, [1 / 32] * 32],
        "ancestors": [list(range(32))],
    }
    cands = [_candidate(False, [j, 0]) for j in range(32)]
    run = _run(
        tmp_path / "run", [_method("SMC", "smc", config)], [_record("p-0", "SMC", cands, info)]
    )
    [entry] = sections.smc([run])
    assert entry["ess_before"] == entry["ess_after"] == 2.000048
    assert entry["by_checkpoint"] == [{"index": 0, "ess_before": 2.000048, "ess_after": 2.000048}]


# -- 10. remasked states are never merged -------------------------------------------------------


def _two_searches(tmp_path: Path, first_b: list[float], **edits) -> evidence.RunData:
    """One problem: PRM Guided keeping child 0, and a Top-2 search keeping children 0 and 1
    whose first segment scored `first_b` and whose candidates carry `edits`."""
    methods = [
        _method("Majority@4", "independent", {"n": 4}),
        _method("Guided", "prm_guided", KEEP_ONE),
        _method("Top2", "prm_guided", KEEP_TWO),
    ]
    first_a = [0.4, 0.3, 0.2, 0.1]
    records = [
        _record("p-0", "Majority@4", [_candidate(i == 1, [i]) for i in range(4)]),
        _record(
            "p-0",
            "Guided",
            _finals([0], [True, False, False, False], "a"),
            _guided(first_a, [0], [1.0, 2.0, 3.0, 4.0]),
        ),
        _record(
            "p-0",
            "Top2",
            _finals([0, 1], [False, True, False, False], "b", **edits),
            _guided(first_b, [0, 1], [1.5, 2.5, 3.5, 4.5]),
        ),
    ]
    return _run(tmp_path / f"run{len(edits)}{first_b[0]}", methods, records)


def test_a_canvas_a_search_edited_is_never_merged_with_another(tmp_path):
    """Both searches' first-segment children have the same problem, step and lineage. Where
    the second re-masked (other scores, and edits its candidates carry), its 4 states are its
    own: 4 + 4 first-segment states and 4 + 4 final ones; unedited and scored alike, the two
    first segments are one state each (4 + 4 + 4)."""
    edited = _two_searches(tmp_path, [0.9, 0.8, 0.7, 0.6], edits=[[2, [0, 3]]])
    states = evidence.scored_states(edited)
    assert [(s.score, s.mask_ratio) for s in states if s.mask_ratio == 0.5] == [
        (0.4, 0.5),
        (0.3, 0.5),
        (0.2, 0.5),
        (0.1, 0.5),
        (0.9, 0.5),
        (0.8, 0.5),
        (0.7, 0.5),
        (0.6, 0.5),
    ]
    finals = [s.score for s in states if s.mask_ratio == 0.0]
    assert finals == [1.0, 2.0, 3.0, 4.0, 1.5, 2.5, 3.5, 4.5]
    # the same scores, but the canvases the second search edited (its candidates' edits at
    # step 2, before the first cut) are other states
    same_scores = _two_searches(tmp_path, [0.4, 0.3, 0.2, 0.1], edits=[[2, [0, 3]]])
    assert len(evidence.scored_states(same_scores)) == 16
    unedited = _two_searches(tmp_path, [0.4, 0.3, 0.2, 0.1])
    assert len(evidence.scored_states(unedited)) == 12
    # across run directories too: the same run twice counts once
    [entry] = sections.discrimination([edited, edited], BOOT)
    assert entry["count"] == 16
