"""The helpers of `dllmbench.testing` for plugin authors' tests, as documented."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import dllmbench.testing as testing
from dllmbench.core.errors import PluginError
from dllmbench.core.types import Problem
from dllmbench.plugins.selectors.voting import Majority
from dllmbench.testing import make_candidate, make_candidates, make_pool, make_rows, run_strategy
from dllmbench.testing.doubles import MASK, ToyBackbone

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugin-authors.md"


def test_make_candidates_as_a_selector_sees_them():
    cands = make_candidates(["4", None, "4"], scores={"orm": [1, 2, 3]}, weights=[0.5, 0.2, 0.3])
    assert [c.index for c in cands] == [0, 1, 2]
    assert [c.answer_key for c in cands] == ["4", None, "4"]
    assert [c.text for c in cands] == ["4", "", "4"]
    assert cands[2].scores == {"orm": 3.0} and cands[1].weight == 0.2
    assert cands[1].lineage == (1,)
    assert Majority().select(cands, rng=np.random.default_rng(0)) == 0
    with pytest.raises(ValueError, match=r"scores\['orm'\] has 2 values for 3"):
        make_candidates(["1", "2", "3"], scores={"orm": [1, 2]})
    one = make_candidate(4, "12", answer_key=12, text="so 12", lineage=(0, 4), weight=1.0)
    assert (one.index, one.answer_key, one.text, one.lineage, one.weight) == (
        4,
        12,
        "so 12",
        (0, 4),
        1.0,
    )


def test_make_rows_and_pool_hold_toy_canvases():
    masked = make_rows(2, step=0)
    assert len(masked) == 2 and masked.steps == (0, 0)
    assert (masked.tokens[:, masked.prompt_len :] == MASK).all()
    pool = make_pool(3, scores={"prm": [0.1, 0.2, 0.3]}, weights=[1, 1, 2], info={"a": 1})
    assert len(pool) == 3 and pool.rows.steps == (12, 12, 12) and pool.info == {"a": 1}
    assert pool.scores["prm"].tolist() == [0.1, 0.2, 0.3] and pool.weights.tolist() == [1, 1, 2]
    assert ToyBackbone().decode(pool.rows.tokens[0], pool.rows.prompt_len) == "7"
    assert pool.prefix(2).scores["prm"].tolist() == [0.1, 0.2]
    other = make_rows(1, problem=Problem("p", "20+22=", 42), gen_length=4, step=3)
    assert ToyBackbone().decode(other.tokens[0], other.prompt_len) == "42"


def test_run_strategy_runs_one_method_on_the_toy_task():
    records = run_strategy("independent:n=3+majority", steps=8, problems=4)
    assert [r["method"] for r in records] == ["independent:n=3+majority"] * 4
    assert sorted(r["problem"] for r in records) == ["test-0", "test-1", "test-2", "test-3"]
    assert all(
        r["ledger"]["passes"] == {"denoise": 24} and len(r["candidates"]) == 3 for r in records
    )
    again = run_strategy("independent:n=3+majority", steps=8, problems=4)
    by_problem = {r["problem"]: r["candidates"] for r in again}
    assert all(r["candidates"] == by_problem[r["problem"]] for r in records)  # keyed noise
    (first,) = run_strategy("prm_guided:k=2,every=4", steps=8, problems=1)
    assert first["method"] == "prm_guided:k=2,every=4+first"
    assert first["ledger"]["passes"] == {"denoise": 16, "score:prm": 4}
    with pytest.raises(PluginError, match="unknown strategy 'nope'"):
        run_strategy("nope")


def test_every_helper_is_documented_with_its_parameters():
    doc = DOC.read_text(encoding="utf-8")
    for name in testing.HELPERS:
        match = re.search(rf"`{name}\((.*?)\)`", doc)
        assert match, f"{name} is not in docs/plugin-authors.md"
        written = [p.split("=")[0].strip() for p in match.group(1).split(",")]
        params = list(inspect.signature(getattr(testing, name)).parameters)
        assert [p for p in written if p != "*"] == params, name
