"""The shipped block-diffusion demo: the `tiny-block` backbone, its PRM and ORM, its gates, and
the command that rebuilds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_user_error
from test_demo import _package_files, assert_ships_a_model_and_its_scorers

from dllmbench.cli.run import DEMO
from dllmbench.demo import (
    BLOCK_DEMO,
    BLOCK_DIR,
    BLOCK_LENGTH,
    DEMO_TASK,
    SCORER_KINDS,
    TASK_CONFIG,
    RetrainConfig,
)
from dllmbench.demo.pretrain_block import (
    BlockPretrainConfig,
    block_batch,
    build_model,
    canvas_tokens,
)
from dllmbench.execution.planner import default_budget
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones import tiny_block
from dllmbench.plugins.backbones.block import BlockDiffusion
from dllmbench.plugins.backbones.loading import char_tokenizer

# the block demo as `dllmbench run` takes it: the demo's problems and prompt, the block
# model's T and gen_length, at its first budget (PRM Guided K=8 with two segments)
BUDGET = default_budget(BLOCK_DEMO["steps"])
DEMO_ARGS = (
    "--task",
    DEMO_TASK,
    "--backbone",
    "tiny-block",
    "--steps",
    BLOCK_DEMO["steps"],
    "--gen-length",
    BLOCK_DEMO["gen_length"],
    "--prompt",
    "fewshot",
)


def test_the_package_ships_the_block_model_and_its_scorers():
    assert_ships_a_model_and_its_scorers(BLOCK_DIR)
    config = json.loads((BLOCK_DIR / "config.json").read_text())
    assert config["block_length"] == BLOCK_LENGTH == tiny_block.TinyBlockConfig().block_length
    assert config["data"] == TASK_CONFIG  # the model learned the demo's problems
    assert config["pretrain"]["gen_length"] == BLOCK_DEMO["gen_length"]
    assert isinstance(config["mask_token_id"], int)


def test_tiny_block_is_the_block_backbone_on_the_shipped_model():
    backbone = registry().backbone("tiny-block")
    assert isinstance(backbone, BlockDiffusion)
    assert type(backbone.transformer).__name__ == "Qwen3ForCausalLM"
    params = sum(p.numel() for p in backbone.transformer.parameters())
    assert 3e5 <= params <= 1.5e6, params
    assert backbone.config.chat is False and backbone.config.block_length == BLOCK_LENGTH
    assert backbone.mask_id == backbone.tokenizer.mask_token_id
    shipped = backbone.shipped_scorers
    assert shipped["prm"] == ("prm", {"checkpoint": str(BLOCK_DIR / "prm")})
    assert shipped["orm"] == ("orm", {"checkpoint": str(BLOCK_DIR / "orm")})
    assert tiny_block.TinyBlockConfig(model="elsewhere").shipped_scorers == {}
    # the scorers load on it (they were trained on these weights)
    for kind in SCORER_KINDS:
        assert registry().scorer(kind, shared={"backbone": backbone}, **shipped[kind][1]).trained


def test_the_training_forward_sees_what_the_sampler_sees():
    """Each noisy block of the doubled training sequence gets the logits the block backbone
    computes for the clean blocks before it followed by that noisy block."""
    tokenizer = char_tokenizer()
    cfg = BlockPretrainConfig(hidden=32, intermediate=64, layers=2, heads=2, kv_heads=2)
    net = build_model(len(tokenizer), cfg, tokenizer).eval()
    block = 4
    bb = BlockDiffusion(transformer=net, tokenizer=tokenizer, block_length=block)
    rows = [
        canvas_tokens(tokenizer, "Question: 2+3?\nAnswer:", " 2+3=5\n#### 5", 16, block),
        canvas_tokens(tokenizer, "Q: 7-1?", " 7-1=6", 12, block),
    ]
    assert [len(ids) for ids, _ in rows] == [(22 + 16) // 4 * 4, (7 + 12) // 4 * 4]
    gen = torch.Generator().manual_seed(0)
    batch = block_batch(rows, block, bb.mask_id, bb.pad_id, 1e-3, gen)
    with torch.no_grad():
        logits = net(
            input_ids=batch["ids"], attention_mask=batch["mask"], position_ids=batch["positions"]
        ).logits
    clean_width = max(len(ids) for ids, _ in rows)
    masked = 0
    for i, (ids, plen) in enumerate(rows):
        start = plen // block * block
        noisy = batch["ids"][i, clean_width : clean_width + len(ids) - start]
        assert (noisy[: plen - start] == torch.tensor(ids[start:plen])).all()  # prompt clean
        masked += int((noisy == bb.mask_id).sum())
        for lo in range(start, len(ids), block):
            seq = torch.tensor([*ids[:lo], *noisy[lo - start : lo - start + block].tolist()])
            want = bb.logits(seq[None], torch.ones(1, len(seq), dtype=torch.long))[0, lo:]
            got = logits[i, clean_width + lo - start : clean_width + lo - start + block]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert masked == int((batch["targets"] >= 0).sum()) > 0


def test_demo_retrain_refuses_to_write_into_the_block_demo(cli):
    before = _package_files()
    for target in (BLOCK_DIR, BLOCK_DIR / "orm"):
        result = cli("demo", "retrain", "--quick", "--backbone", "tiny-block", "--out", target)
        assert_user_error(result, "inside the installed package")
    assert _package_files() == before
    assert RetrainConfig(Path("x")).backbone == "tiny"  # the Dream-architecture demo by default


def test_run_with_the_block_model_and_no_task_is_the_block_demo():
    """`--backbone tiny-block` alone is the demo on the block model: the demo's problems and
    prompt at the block model's own T and gen_length, at both demo budgets."""
    from dllmbench.cli import build_parser
    from dllmbench.cli.run import DEMO_BUDGET_FACTORS, run_config

    cfg = run_config(build_parser().parse_args(["run", "--backbone", "tiny-block"]))
    assert (cfg.task, cfg.backbone) == ("arith", "tiny-block")
    assert cfg.sampling.total_steps == BLOCK_DEMO["steps"]
    assert cfg.sampling.gen_length == BLOCK_DEMO["gen_length"]
    assert (cfg.sampling.prompt_style, cfg.limit) == ("fewshot", DEMO["limit"])
    assert cfg.budget_factors == DEMO_BUDGET_FACTORS
    tiny = run_config(build_parser().parse_args(["run"]))
    assert (tiny.backbone, tiny.sampling.total_steps) == ("tiny", DEMO["steps"])


@pytest.mark.slow
def test_every_family_runs_on_the_block_demo_at_a_flop_budget_and_reports(tmp_path, cli):
    """Every built-in family on the block model, matched in FLOPs, each within its share; and
    the report reads the run."""
    run = tmp_path / "run"
    budget = 4e9
    result = cli(
        "run",
        "--backbone",
        "tiny-block",
        "--limit",
        2,
        "--budget",
        f"{budget:g}flops",
        "--out",
        run,
        "--json",
    )
    assert result.code == 0, result.err
    results = json.loads(result.out)
    assert results["budget_unit"] == "flops" and results["budget"] == budget
    families = {f.name for f in registry().families()}
    assert {m["family"] for m in results["methods"]} == families
    for m in results["methods"]:
        assert m["problems"] == 2 and m["capped"], m["id"]  # block rows may end early
        assert 0 < m["flops_per_problem"] <= m["planned_flops"] <= budget, m["id"]
    assert cli("report", run).code == 0
    report = (run / "report" / "report.md").read_text()
    assert "tiny-block" in report and "Sampler Ensemble" in report and "ReMDM" in report


@pytest.mark.slow
def test_the_block_demo_gates_hold(tmp_path, cli):
    """On the demo's problems at the block model's first budget (272 passes at T=32): Vanilla
    20–70% (36), Oracle@8 at least 15 points above it (79), ORM Rerank@8 above it (42), and
    the ORM's weighted vote over the same eight samples above it (48) with an exact paired 95%
    interval that excludes zero (+12 [+2, +22] points, McNemar p = 0.029)."""
    methods = "vanilla,orm_rerank,weighted_majority,oracle"
    argv = ("run", *DEMO_ARGS, "--limit", DEMO["limit"], "--methods", methods)
    result = cli(*argv, "--budget", BUDGET, "--out", tmp_path / "run", "--json")
    assert result.code == 0, result.err
    methods = {m["id"]: m for m in json.loads(result.out)["methods"]}
    vanilla = methods["Vanilla"]["accuracy"]["value"]
    assert methods["Vanilla"]["problems"] == DEMO["limit"]
    assert 0.2 <= vanilla <= 0.7, vanilla
    assert methods["Oracle@8"]["accuracy"]["value"] >= vanilla + 0.15
    assert methods["ORM Rerank@8"]["delta_vs_reference"]["value"] > 0
    delta = methods["Weighted Majority@8"]["delta_vs_reference"]
    assert delta["exact"] and delta["value"] > 0 and delta["low"] > 0, delta
    assert delta["mcnemar_p"] < 0.05, delta


@pytest.mark.slow
def test_block_demo_retrain_quick_runs_end_to_end_and_writes_only_into_out(
    tmp_path, cli, monkeypatch
):
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = _package_files()
    argv = ("demo", "retrain", "--quick", "--backbone", "tiny-block", "--out", out, "--json")
    result = cli(*argv)
    assert result.code == 0, result.err
    done = json.loads(result.out)
    assert _package_files() == before
    assert list(cwd.iterdir()) == []
    assert {p.name for p in tmp_path.iterdir()} == {"cwd", "out"}
    for name in ("model.safetensors", "tokenizer.json", "prm/adapter.safetensors", "orm/"):
        assert (out / name).exists(), name
    assert not (out / "prm_causal").exists()  # the readout controls are the tiny demo's
    written = json.loads((out / "config.json").read_text())
    assert written["block_length"] == BLOCK_LENGTH and written["pretrain"]["steps"] == 2
    assert done["backbone"] == f"tiny-block:model={out}"
    assert (done["steps"], done["gen_length"]) == (BLOCK_DEMO["steps"], BLOCK_DEMO["gen_length"])
    assert "pretraining the tiny block-diffusion LM" in result.err

    # the files run as the command says
    result = cli(
        "run",
        *DEMO_ARGS[:2],
        "--backbone",
        done["backbone"],
        "--scorer",
        done["scorers"]["orm"],
        *DEMO_ARGS[4:],
        "--limit",
        2,
        "--methods",
        "vanilla,orm_rerank",
        "--out",
        tmp_path / "run",
        "--json",
    )
    assert result.code == 0, result.err
    results = json.loads(result.out)
    assert [m["id"] for m in results["methods"]] == ["Vanilla", "ORM Rerank@8"]
