"""A method whose rows set sampler settings the backbone's configuration refuses (Fast-dLLM's
threshold under a commit order that ranks no drawn token's probability) is refused before
any model loads, with the line the backbone gives when a row starts; as a family that was not
named, it is left out with that line."""

from __future__ import annotations

import json

import pytest

from dllmbench.loading.registry import Registry

LINE = (
    "dllmbench: error: tiny: a row's sampler settings {'threshold': 0.9}: threshold and factor "
    "compare the drawn token's probability, which only alg=maskgit_plus commits by; got "
    "alg=entropy\n"
)


@pytest.fixture
def no_model_loads(monkeypatch):
    def load(self, name, **config):
        raise AssertionError(f"backbone {name!r} was built")

    monkeypatch.setattr(Registry, "backbone", load)


@pytest.mark.parametrize("budget", [[], ["--budget", "208"], ["--budget", "1e9flops"]])
def test_a_threshold_under_alg_entropy_is_refused_before_the_model_loads(
    cli, tmp_path, no_model_loads, budget
):
    out = tmp_path / "run"
    argv = ["--backbone", "tiny:alg=entropy", "--methods", "threshold", *budget]
    done = cli("run", *argv, "--out", out)
    assert (done.code, done.err) == (2, LINE)
    assert not out.exists()
    planned = cli("plan", "--task", "arith", *argv, *([] if budget else ["--budget", "208"]))
    assert (planned.code, planned.err) == (2, LINE)


def test_the_same_line_as_the_backbone_gives_when_a_row_starts(monkeypatch, tmp_path, cli):
    """The line refusing it early is the backbone's own: with the early check taken away, the
    first problem refuses it with the same line (after the model loaded)."""
    from dllmbench.execution import planner

    monkeypatch.setattr(planner, "settings_by_config", lambda strategy: [])
    done = cli(
        "run", "--backbone", "tiny:alg=entropy", "--methods", "threshold", "--out", tmp_path / "r"
    )
    assert (done.code, done.err.splitlines()[-1] + "\n") == (2, LINE)


def test_a_family_not_named_is_left_out_with_the_line(cli, no_model_loads):
    """Every family (none named) on a backbone that refuses the threshold family's rows: the
    family is left out, saying why, where the run stopped at its first problem."""
    planned = cli("--json", "plan", "--backbone", "tiny:alg=entropy", "--budget", "208")
    assert planned.code == 0, planned.err
    left = {x["family"]: x["reason"] for x in json.loads(planned.out)["left_out"]}
    assert left["threshold"] == LINE.removeprefix("dllmbench: error: ").strip()
    assert "vanilla" not in left
