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


def test_a_cached_dream_run_is_marked_and_its_report_sets_it_beside_exact_decoding(tmp_path, cli):
    """Tiny random Dream on arith, decoded with Fast-dLLM's prefix cache and exactly: the
    cached run's leaderboard marks its methods, its manifest and results say `approximate`,
    and `report --exact` writes the agreement of each method with the exact run."""
    import json

    common = (
        "--task",
        "arith",
        "--methods",
        "vanilla,majority",
        "--budget",
        "64",
        "--limit",
        "3",
        "--steps",
        "16",
        "--gen-length",
        "16",
        "--prompt",
        "fewshot",
    )
    runs = {}
    for cache in ("prefix", "none"):
        out = tmp_path / cache
        backbone = f"dream:model=random,block_length=8,cache={cache}"
        result = cli("run", "--backbone", backbone, *common, "--out", out)
        assert result.code == 0, result.err
        runs[cache] = (out, result.out)
    cached, leaderboard = runs["prefix"]
    assert "Vanilla ≈" in leaderboard and "approximate KV cache" in leaderboard
    assert "≈" not in runs["none"][1]
    manifest = json.loads((cached / "manifest.json").read_text())
    assert all(m.get("approximate") for m in manifest["methods"])
    results = json.loads((cached / "results.json").read_text())
    assert all(m.get("approximate") for m in results["methods"])
    report = cli("report", cached, "--exact", runs["none"][0], "--out", tmp_path / "report")
    assert report.code == 0, report.err
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    agreed = {m["id"]: m for m in data["agreement"]["methods"]}
    assert "Vanilla" in agreed and len(agreed) == 2  # both methods, set beside their exact runs
    for m in agreed.values():
        assert m["problems"] == 3 and 0 <= m["same_answer"] <= 1
    assert "## Agreement with exact decoding" in (tmp_path / "report" / "report.md").read_text()
    refused = cli("report", cached, "--exact", cached, "--out", tmp_path / "again")
    assert refused.code == 2 and "approximate cache; give an exact run" in refused.err
