"""Naming a shipped demo model keeps its own sampling: `run --task arith --backbone tiny` (or
`plan` with it) samples at the T, canvas and prompt the model was trained for, not at the
paper's 512-token canvas that its 256 positions cannot hold; a flag given still wins."""

from __future__ import annotations

import json

import pytest

from dllmbench.cli import build_parser
from dllmbench.cli.common import GENERAL
from dllmbench.cli.run import DEMO, DEMO_BUDGET_FACTORS, run_config
from dllmbench.demo import BLOCK_DEMO


def config(*argv: str):
    return run_config(build_parser().parse_args(["run", *argv]))


def sampling(cfg) -> tuple[int, int, str]:
    return cfg.sampling.total_steps, cfg.sampling.gen_length, cfg.sampling.prompt_style


def test_a_task_on_the_tiny_model_samples_as_the_model_was_trained():
    cfg = config("--task", "arith", "--backbone", "tiny", "--limit", "2")
    assert GENERAL["gen_length"] == 512  # what a backbone of its own would get
    assert (
        sampling(cfg) == (DEMO["steps"], DEMO["gen_length"], DEMO["prompt"]) == (24, 32, "fewshot")
    )
    # only its sampling: the task, the problems and the one budget are the command line's
    assert (cfg.task, cfg.task_config, cfg.limit, cfg.budget_factors) == ("arith", {}, 2, (1,))


def test_the_demo_itself_is_unchanged():
    cfg = config("--backbone", "tiny")
    assert sampling(cfg) == (24, 32, "fewshot")
    assert (cfg.limit, cfg.budget_factors) == (DEMO["limit"], DEMO_BUDGET_FACTORS)


def test_the_block_model_keeps_its_own_protocol():
    cfg = config("--task", "arith", "--backbone", "tiny-block")
    assert sampling(cfg) == (BLOCK_DEMO["steps"], BLOCK_DEMO["gen_length"], "fewshot")


def test_a_flag_given_still_wins():
    cfg = config(
        "--task", "arith", "--backbone", "tiny", "--steps", "8", "--gen-length", "16",
        "--prompt", "chat",
    )  # fmt: skip
    assert sampling(cfg) == (8, 16, "chat")


def test_another_backbone_keeps_the_general_protocol():
    cfg = config("--task", "toy_sum:size=2", "--backbone", "toy")
    assert sampling(cfg) == (GENERAL["steps"], GENERAL["gen_length"], GENERAL["prompt"])


def test_plan_dry_runs_the_tiny_model_with_its_own_sampling(cli):
    result = cli("plan", "--task", "arith", "--backbone", "tiny", "--budget", "208", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["sampling"] == {
        "steps": 24,
        "gen_length": 32,
        "prompt": "fewshot",
        "seed": 0,
    }


@pytest.mark.slow  # loads the tiny model and samples with it
def test_run_task_arith_backbone_tiny_runs(tmp_path, cli):
    out = tmp_path / "run"
    result = cli(
        "run", "--task", "arith", "--backbone", "tiny", "--limit", "2",
        "--methods", "vanilla,majority", "--out", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sampling"]["gen_length"] == 32 and manifest["sampling"]["total_steps"] == 24
    assert json.loads((out / "results.json").read_text())["task"]["problems"] == 2
