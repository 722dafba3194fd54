"""An approximately decoded run beside an exact one: the report's agreement section, and the
leaderboard's mark."""

from __future__ import annotations

from pathlib import Path

import pytest

from dllmbench.analysis.agreement import agreement
from dllmbench.analysis.evidence import RunData
from dllmbench.analysis.leaderboard import APPROXIMATE_NOTE, capped_note, rows
from dllmbench.analysis.report_markdown import md_agreement
from dllmbench.core.errors import UserError


def _record(problem, keys, selected, correct):
    return {
        "problem": problem,
        "method": "M",
        "selected": selected,
        "correct": correct,
        "candidates": [{"key": k, "lineage": [i]} for i, k in enumerate(keys)],
    }


def _run(path, records, approximate=False, backbone="dream"):
    method = {"id": "M", **({"approximate": True} if approximate else {})}
    manifest = {
        "task": {"name": "arith", "problems": 3},
        "sampling": {"total_steps": 8, "seed": 0},
        "backbone": {"name": backbone, "config": {"cache": "prefix" if approximate else "none"}},
        "methods": [method],
    }
    by_method = {"M": {r["problem"]: r for r in records}}
    return RunData(Path(path), manifest, records, None, by_method)


def test_agreement_counts_same_answers_and_same_candidates():
    cached = _run(
        "cached",
        [
            _record("p1", ["4", "5"], 0, True),  # same final answer, one candidate differs
            _record("p2", ["7", "7"], 1, False),  # final answer differs
            _record("p3", [None, "2"], None, False),  # nothing selected in either: the same
        ],
        approximate=True,
    )
    exact = _run(
        "exact",
        [
            _record("p1", ["4", "4"], 0, True),
            _record("p2", ["8", "7"], 0, True),
            _record("p3", [None, "2"], None, False),
        ],
    )
    entry = agreement(cached, exact)
    (m,) = entry["methods"]
    assert m["problems"] == 3
    assert m["same_answer"] == pytest.approx(2 / 3)
    assert m["candidates"] == 6 and m["same_candidate"] == pytest.approx(4 / 6)
    assert m["accuracy"] == pytest.approx(1 / 3) and m["exact_accuracy"] == pytest.approx(2 / 3)
    text = "\n".join(md_agreement({"agreement": entry}))
    assert (
        "Agreement with exact decoding" in text and "| M | 3 | 66.7 | 66.7 | 33.3 | 66.7 |" in text
    )


def test_agreement_refuses_runs_that_are_not_one_protocol():
    cached = _run("cached", [_record("p1", ["4"], 0, True)], approximate=True)
    with pytest.raises(UserError, match="approximate cache; give an exact run"):
        agreement(cached, cached)
    with pytest.raises(UserError, match="backbone 'llada'"):
        agreement(cached, _run("other", [_record("p1", ["4"], 0, True)], backbone="llada"))
    exact = _run("exact", [_record("p1", ["4"], 0, True)])
    exact.manifest["sampling"] = {"total_steps": 16, "seed": 0}
    with pytest.raises(UserError, match="sampling differs"):
        agreement(cached, exact)


def test_the_leaderboard_marks_an_approximate_method_and_says_why():
    results = {
        "methods": [
            {
                "id": "Vanilla",
                "spec": "independent:n=1+first",
                "ceiling": False,
                "budget": 8,
                "problems": 1,
                "accuracy": None,
                "passes_per_problem": 8.0,
                "planned_passes": 8,
                "share_of_budget": 1.0,
                "approximate": True,
            }
        ]
    }
    ((_, cells),) = rows(results)
    assert cells[0] == "Vanilla ≈"
    assert capped_note(results) == APPROXIMATE_NOTE
