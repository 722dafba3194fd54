"""The shipped demo: `dllmbench run` with no arguments, and the command that rebuilds it."""

from __future__ import annotations

import json

from dllmbench.cli import main
from dllmbench.plugins.backbones.retrain_demo import main as retrain
from dllmbench.plugins.backbones.tiny import TINY_DIR

FAMILIES = (
    "Vanilla",
    "Majority@8",
    "ORM Rerank@8",
    "Weighted Majority@8",
    "PRM Rerank@8",
    "Random Rerank@8",
    "PRM Guided K=8 b=12",
    "Top-2 Retention K=8 b=12",
    "PRM Hybrid K=8 b=12 + Majority",
    "SMC K=8 b=12 (weighted vote)",
    "SMC K=8 b=12 (top particle)",
    "Oracle@8",
    "Oracle of PRM Hybrid K=8 b=12",
)


def test_the_package_ships_the_demo_model_and_its_scorers():
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "prm/config.json",
        "prm/adapter.safetensors",
        "orm/head.safetensors",
    ):
        assert (TINY_DIR / name).exists(), name
    size = sum(p.stat().st_size for p in TINY_DIR.rglob("*") if p.is_file())
    assert size <= 10 * 2**20
    for kind in ("prm", "orm"):
        validation = json.loads((TINY_DIR / kind / "config.json").read_text())["validation"]
        assert validation["auc"] is not None and validation["auc"] > 0.5


def test_run_without_arguments_runs_every_family_of_the_demo(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    for label in FAMILIES:
        assert label in out, label
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    results = json.loads((runs[0] / "results.json").read_text())
    assert [m["id"] for m in results["methods"]] == list(FAMILIES)
    assert results["budget"] == 208
    assert all(m["passes_per_problem"] == m["planned_passes"] for m in results["methods"])


def test_the_retrain_command_rebuilds_model_and_scorers(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    retrain(
        [
            "--pretrain-steps",
            "2",
            "--problems",
            "4",
            "--scorer-steps",
            "2",
            "--orm-groups",  # a 2-step model gets every answer wrong: no problem is mixed
            "all",
            "--out",
            str(out),
            "--work",
            str(work),
        ]
    )
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "prm/adapter.safetensors",
        "orm/adapter.safetensors",
    ):
        assert (out / name).exists(), name
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "--task",
                "arith:max_steps=2",
                "--backbone",
                f"tiny:model={out}",
                "--scorer",
                f"orm=orm:checkpoint={out / 'orm'}",
                "--steps",
                "24",
                "--gen-length",
                "24",
                "--prompt",
                "fewshot",
                "--limit",
                "2",
                "--methods",
                "vanilla,orm_rerank",
                "--out",
                str(tmp_path / "run"),
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in results["methods"]] == ["Vanilla", "ORM Rerank@8"]
