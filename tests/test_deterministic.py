"""A backbone that samples deterministically gives every copy the same candidate: a method
that needs several candidates per problem is refused with one line before the backbone loads,
unless `--allow-deterministic`."""

from __future__ import annotations

import json

import pytest
from conftest import TOY_RUN, assert_user_error, snapshot

from dllmbench.execution.planner import plan
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.backbones.llada import LLaDAConfig
from dllmbench.running.runner import _trajectories
from dllmbench.testing.doubles import ToyBackbone

# TOY_RUN on the toy backbone drawing every row's noise from one key
DETERMINISTIC = list(TOY_RUN)
DETERMINISTIC[TOY_RUN.index("--backbone") + 1] = "toy:deterministic=true"
TOY = ["run", "--task", "toy_sum:size=4", "--backbone", "toy:deterministic=true"]


@pytest.fixture
def toy_not_built(monkeypatch):
    def built(self, *args, **kwargs):
        raise AssertionError("the backbone was built before the mistake was found")

    monkeypatch.setattr(ToyBackbone, "__init__", built)


def test_the_double_really_is_deterministic(cli, tmp_path):
    result = cli(*DETERMINISTIC, "--allow-deterministic", "--out", tmp_path / "same")
    assert result.code == 0, result.err
    result = cli(*TOY_RUN, "--out", tmp_path / "varied")
    assert result.code == 0, result.err

    def texts(run):
        lines = (tmp_path / run / "samples.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        return [{c["text"] for c in r["candidates"]} for r in records if r["method"] != "Vanilla"]

    assert all(len(pool) == 1 for pool in texts("same"))  # --allow-deterministic ran them
    assert any(len(pool) > 1 for pool in texts("varied"))


def test_multi_candidate_methods_are_refused_before_the_backbone_loads(
    cli, finished_run, toy_not_built
):
    before = snapshot(finished_run)
    result = cli(*DETERMINISTIC, "--out", finished_run)
    assert_user_error(
        result,
        "backbone 'toy' samples deterministically",
        "Majority@9 (9 copies), ORM Rerank@8 (8 copies), Oracle@9 (9 copies)",
        "--allow-deterministic",
    )
    assert "Vanilla" not in result.err
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    "method,needle",
    [
        ("prm_guided", "PRM Guided K=8 b=4 (8 copies)"),
        ("smc_vote", "SMC K=8 b=4 (weighted vote) (8 copies)"),
        ("independent:n=2+majority", "independent:n=2+majority (2 copies)"),
        ("prm_guided:k=4,every=4,final=prune+first", "(4 copies)"),
    ],
)
def test_guided_smc_and_any_spec_count_their_copies(cli, tmp_path, toy_not_built, method, needle):
    argv = [*TOY, "--steps", "8", "--gen-length", "5", "--method", method, "--budget", "80"]
    argv += ["--scorer", "prm=toy"] if "prm" in method or "smc" in method else []
    result = cli(*argv, "--out", tmp_path / "r")
    assert_user_error(result, needle, "--allow-deterministic")
    assert not (tmp_path / "r").exists()


def test_one_candidate_methods_run_on_a_deterministic_backbone(cli, tmp_path):
    argv = [*TOY, "--steps", "8", "--gen-length", "5", "--methods", "vanilla"]
    result = cli(*argv, "--out", tmp_path / "r")
    assert result.code == 0, result.err


def test_llada_at_temperature_zero_says_how_to_sample(cli, tmp_path, monkeypatch):
    assert LLaDAConfig(temperature=0).deterministic  # greedy tokens, low-confidence order

    def built(self, *args, **kwargs):
        raise AssertionError("the backbone was built before the mistake was found")

    monkeypatch.setattr(DiffusionBackbone, "__init__", built)
    argv = ["run", "--task", "arith:test_size=4", "--steps", "4", "--gen-length", "8"]
    argv += ["--backbone", "llada:temperature=0", "--methods", "vanilla,majority,oracle"]
    result = cli(*argv, "--out", tmp_path / "r")
    assert_user_error(
        result,
        "backbone 'llada' samples deterministically (temperature=0): Majority@12 (12 copies), "
        "Oracle@12 (12 copies) would compare copies of one answer",
        "--backbone llada:temperature=0.5, the paper's",
        "or pass --allow-deterministic",
    )
    assert not (tmp_path / "r").exists()


def test_copies_are_trajectories_whatever_the_passes_per_step():
    reg = registry()
    for passes in (1, 2):  # classifier-free guidance doubles the passes, not the copies
        chosen = plan(reg, 1040 * passes, 128, ["vanilla", "majority"], passes_per_step=passes)
        assert [_trajectories(p, 128, passes) for p in chosen.methods] == [1, 8]
