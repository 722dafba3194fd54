"""What each method spent, measured: results.json's means and intervals in passes and FLOPs, the
leaderboard's columns and capped marks, and report.md's methods table. Records are made by
hand, with spends that differ from problem to problem."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

from dllmbench.analysis.leaderboard import (
    CAPPED_NOTE,
    PRIORITY,
    headers,
    markdown,
    rich_table,
    rows,
)
from dllmbench.analysis.report_markdown import md_methods
from dllmbench.analysis.results import summarize
from dllmbench.analysis.stats import bootstrap_ci
from dllmbench.core.flops import format_flops

PROBLEMS = [f"p{i}" for i in range(8)]
PER_PASS = 3 * 10**12  # FLOPs of one pass of these records, before the prompt's share
METHODS = [
    {
        "id": "Vanilla",
        "family": "vanilla",
        "spec": "independent:n=1+first",
        "ceiling": False,
        "cost": {"denoise": 8},
        "flops": 8 * PER_PASS,
    },
    {
        "id": "Majority@9",
        "family": "majority",
        "spec": "independent:n=9+majority",
        "ceiling": False,
        "cost": {"denoise": 72},
        "flops": 72 * PER_PASS,
    },
    {
        "id": "Adaptive@9",
        "family": "adaptive",
        "spec": "adaptive:n=9+majority",
        "ceiling": False,
        "cost": {"denoise": 72},
        "capped": True,
        "flops": 72 * PER_PASS,
    },
]
# passes the capped method drew on each problem: its cap is 72, it stops early on most
ADAPTIVE = [24, 32, 72, 24, 40, 72, 24, 49]


def _record(problem: int, method: str, passes: int, flops: int | None, correct: bool) -> dict:
    ledger = {"passes": {"denoise": passes}, "total_passes": passes}
    if flops is not None:
        ledger |= {"flops": {"denoise": flops}, "total_flops": flops}
    else:
        ledger |= {"flops": {}, "total_flops": None}
    return {
        "problem": PROBLEMS[problem],
        "method": method,
        "budgets": [72],
        "selected": 0,
        "answer": "1",
        "correct": correct,
        "ceiling": False,
        "candidates": [
            {
                "text": "1",
                "answer": "1",
                "valid": True,
                "key": "1",
                "correct": correct,
                "scores": {},
                "weight": None,
                "lineage": [0],
            }
        ],
        "ledger": ledger | {"forwards": {}, "seconds": {}},
        "info": {},
    }


def _flops(problem: int, passes: int) -> int:
    """An exact method's FLOPs still differ by problem: a longer prompt costs more per pass."""
    return passes * (PER_PASS + problem * 10**10)


def records(flops: bool = True) -> list[dict]:
    out = []
    for i in range(len(PROBLEMS)):
        for method, passes in (("Vanilla", 8), ("Majority@9", 72), ("Adaptive@9", ADAPTIVE[i])):
            cost = _flops(i, passes) if flops else None
            out.append(_record(i, method, passes, cost, correct=(i + passes) % 3 != 0))
    return out


def summary(recs: list[dict] | None = None, methods: list[dict] | None = None, **kw) -> dict:
    return summarize(
        records() if recs is None else recs,
        METHODS if methods is None else methods,
        PROBLEMS,
        budget=72,
        resamples=500,
        **kw,
    )


def by_id(results: dict) -> dict[str, dict]:
    return {m["id"]: m for m in results["methods"]}


# -- results.json ---------------------------------------------------------------------------


def test_passes_and_flops_per_problem_are_the_means_of_the_records():
    got = by_id(summary())
    adaptive = got["Adaptive@9"]
    assert adaptive["passes_per_problem"] == pytest.approx(np.mean(ADAPTIVE))
    assert adaptive["passes_per_problem"] < adaptive["planned_passes"] == 72
    spent = [_flops(i, p) for i, p in enumerate(ADAPTIVE)]
    assert adaptive["flops_per_problem"] == pytest.approx(np.mean(spent))
    assert adaptive["planned_flops"] == 72 * PER_PASS
    vanilla = got["Vanilla"]
    assert vanilla["passes_per_problem"] == vanilla["planned_passes"] == 8
    assert vanilla["flops_per_problem"] == pytest.approx(np.mean([_flops(i, 8) for i in range(8)]))


def test_spend_intervals_are_bootstrap_intervals_of_the_mean_over_problems():
    got = by_id(summary(seed=3))
    adaptive = got["Adaptive@9"]["spend"]
    # passes vary: a resampled percentile interval, the run's resamples and seed
    want = bootstrap_ci(ADAPTIVE, resamples=500, seed=3).as_dict()
    assert adaptive["passes"] == want and adaptive["passes"]["exact"] is False
    assert adaptive["passes"]["low"] < adaptive["passes"]["value"] < adaptive["passes"]["high"]
    flops = [_flops(i, p) for i, p in enumerate(ADAPTIVE)]
    assert adaptive["flops"] == bootstrap_ci(flops, resamples=500, seed=3).as_dict()
    # an exact method's passes are one value: the interval is that point, exactly
    vanilla = got["Vanilla"]["spend"]
    assert vanilla["passes"] == {"value": 8.0, "low": 8.0, "high": 8.0, "exact": True}
    # its FLOPs follow its prompts' lengths: an interval of some width
    assert vanilla["flops"]["low"] < vanilla["flops"]["value"] < vanilla["flops"]["high"]
    # deterministic: the same records give the same numbers, whatever their order
    assert summary(seed=3) == summary(list(reversed(records())), seed=3)


def test_flops_are_unknown_when_any_record_lacks_them():
    recs = records()
    ledgers = {(r["problem"], r["method"]): r["ledger"] for r in recs}
    ledgers["p1", "Majority@9"]["total_flops"] = None  # a kind of unknown shape
    del ledgers["p2", "Adaptive@9"]["total_flops"]  # a record written before FLOPs were
    got = by_id(summary(recs))
    for mid in ("Majority@9", "Adaptive@9"):
        assert got[mid]["flops_per_problem"] is None and got[mid]["spend"]["flops"] is None
        assert got[mid]["spend"]["passes"]["value"] == got[mid]["passes_per_problem"]
    assert got["Vanilla"]["flops_per_problem"] is not None
    unknown = by_id(summary(records(flops=False)))
    assert all(m["flops_per_problem"] is None for m in unknown.values())


def test_capped_and_planned_flops_come_from_the_manifest_with_defaults_for_older_ones():
    got = by_id(summary())
    assert [m["capped"] for m in got.values()] == [False, False, True]
    older = copy.deepcopy(METHODS)
    for m in older:
        m.pop("capped", None)
        m.pop("flops")
    old = by_id(summary(methods=older))
    assert not any(m["capped"] for m in old.values())
    assert all(m["planned_flops"] is None for m in old.values())
    # a method with no records has no spend
    empty = by_id(summary([r for r in records() if r["method"] != "Vanilla"]))["Vanilla"]
    assert empty["spend"] is None and empty["flops_per_problem"] is None


def test_a_budget_in_flops_takes_the_planned_flops_share():
    budget = 80 * PER_PASS
    results = summarize(records(), METHODS, PROBLEMS, budget=budget, unit="flops")
    assert results["budget_unit"] == "flops" and summary()["budget_unit"] == "passes"
    got = by_id(results)
    assert got["Majority@9"]["share_of_budget"] == pytest.approx(72 / 80)
    assert got["Vanilla"]["share_of_budget"] == pytest.approx(8 / 80)


# -- the leaderboard ------------------------------------------------------------------------


def _cell(results: dict, method: str, column: str) -> str:
    index = headers(results).index(column)
    (cells,) = [c for _, c in rows(results) if c[0] == method]
    return cells[index]


def _render(board, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(board, crop=False)
    return console.export_text()


def test_the_leaderboard_shows_the_mean_spend_in_passes_and_flops_and_marks_a_cap():
    results = summary()
    got = by_id(results)
    assert _cell(results, "Vanilla", "passes") == "8"
    assert _cell(results, "Majority@9", "passes") == "72"
    assert _cell(results, "Adaptive@9", "passes") == f"{np.mean(ADAPTIVE):.1f} (≤72)"
    for mid, m in got.items():
        assert _cell(results, mid, "FLOPs") == format_flops(m["flops_per_problem"])
    assert _cell(results, "Adaptive@9", "FLOPs").endswith("TFLOP")
    md = markdown(results, "title")
    assert "| passes | FLOPs | share |" in md and f"{np.mean(ADAPTIVE):.1f} (≤72)" in md
    assert md.rstrip().endswith(CAPPED_NOTE)
    wide = _render(rich_table(results, "title"), 250)
    assert "(≤72)" in wide and "(≤C): capped" in wide
    # without a capped method, no mark and no note; unknown FLOPs are a dash
    exact = summary(records(flops=False), METHODS[:2])
    assert CAPPED_NOTE not in markdown(exact) and "(≤C)" not in _render(rich_table(exact), 250)
    assert _cell(exact, "Vanilla", "FLOPs") == "–"


def test_the_flops_column_is_the_first_to_go_and_the_cap_note_fits_any_width():
    results = summary()
    names = headers(results)
    assert names[PRIORITY[-1]] == "FLOPs"  # the least wanted column
    full = rich_table(results, "title")
    assert [c.header for c in full.columns] == names
    everything = len(_render(full, 300).splitlines()[1])  # the table's top border
    narrower = next(
        board
        for width in range(everything - 1, 40, -1)
        if len((board := rich_table(results, "title", width=width)).columns) < len(names)
    )
    assert {c.header.replace("\n", " ") for c in narrower.columns} == set(names) - {"FLOPs"}
    for width in (30, 40, 64, 80, 120):
        board = rich_table(results, "title", width=width)
        text = _render(board, width)
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        assert "(≤C): capped" in text and "measured means" in " ".join(text.split())
        if isinstance(board, Table):
            assert {"method", "acc %"} <= {c.header.replace("\n", " ") for c in board.columns}


# -- report.md ------------------------------------------------------------------------------


def test_the_report_methods_table_shows_both_mean_spends():
    results = summary()
    report = {
        "reference": "Vanilla",
        "budgets": [72],
        "methods": [{**m, "run": 0} for m in results["methods"]],
    }
    text = "\n".join(md_methods(report))
    assert "| passes | FLOPs |" in text
    for m in results["methods"]:
        (line,) = [x for x in text.splitlines() if x.startswith(f"| {m['id']} |")]
        passes, flops = line.split(" | ")[2:4]
        assert passes == _cell(results, m["id"], "passes")
        assert flops == format_flops(m["flops_per_problem"])
    assert CAPPED_NOTE in text
    # an entry of a results.json written before spend was measured
    old = {
        k: v for k, v in report["methods"][1].items() if k not in ("flops_per_problem", "capped")
    }
    text = "\n".join(md_methods({**report, "methods": [old]}))
    assert "| Majority@9 | `independent:n=9+majority` | 72 | – |" in text


def test_the_report_names_budgets_in_their_unit():
    results = summarize(records(), METHODS, PROBLEMS, budget=80 * PER_PASS, unit="flops")
    report = {
        "reference": "Vanilla",
        "budgets": [80 * PER_PASS],
        "budget_unit": "flops",
        "methods": [{**m, "run": 0} for m in results["methods"]],
    }
    assert "### Budget 240 TFLOP per problem" in md_methods(report)
    assert "### Budget 72 passes per problem" in md_methods({**summary(), "budget_unit": "passes"})
