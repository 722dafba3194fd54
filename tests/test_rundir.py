"""Run directory: records survive interruption, resume reproduces, other manifests refused."""

from __future__ import annotations

import json

import pytest

from dllmbench.engine import Limits, Sampling
from dllmbench.errors import UserError
from dllmbench.rundir import RunDir, manifest_differences
from dllmbench.runner import RunConfig, run

METHODS = ["vanilla", "majority", "orm_rerank", "prm_guided", "smc_vote", "oracle"]


def config(out, **overrides) -> RunConfig:
    base = dict(
        task="toy_sum",
        task_config={"size": 8},
        backbone="toy",
        scorers={"prm": ("toy", {}), "orm": ("toy", {"partial": False})},
        methods=METHODS,
        sampling=Sampling(total_steps=16, gen_length=6, prompt_style="fewshot", seed=3),
        limits=Limits(batch_rows=16, problems=2),
        resamples=500,
        out=str(out),
    )
    base.update(overrides)
    return RunConfig(**base)


class Interrupt(KeyboardInterrupt):
    pass


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    whole = run(config(tmp_path / "whole"))
    seen = []

    def stop_after_some(record):
        seen.append(record)
        if len(seen) == 13:
            raise Interrupt

    with pytest.raises(Interrupt):
        run(config(tmp_path / "cut"), on_record=stop_after_some)
    kept = RunDir(tmp_path / "cut").read_records()
    assert len(kept) == 13  # every record written before the interruption is on disk
    assert not (tmp_path / "cut" / "results.json").exists()

    resumed = run(config(tmp_path / "cut", limits=Limits(batch_rows=5, problems=3)))
    assert resumed.resumed == 13
    assert resumed.written == 8 * len(METHODS) - 13
    a = (tmp_path / "whole" / "results.json").read_text()
    b = (tmp_path / "cut" / "results.json").read_text()
    assert a == b
    assert json.loads(a) == whole.results
    assert (tmp_path / "cut" / "leaderboard.md").read_text() == (
        tmp_path / "whole" / "leaderboard.md"
    ).read_text()


def test_rerun_of_a_finished_run_writes_nothing(tmp_path):
    run(config(tmp_path / "r"))
    again = run(config(tmp_path / "r"))
    assert again.written == 0 and again.resumed == 8 * len(METHODS)


def test_torn_last_line_is_dropped_and_redone(tmp_path):
    whole = run(config(tmp_path / "r"))
    samples = tmp_path / "r" / "samples.jsonl"
    lines = samples.read_bytes().splitlines(keepends=True)
    samples.write_bytes(b"".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    again = run(config(tmp_path / "r"))
    assert again.resumed == len(lines) - 3 and again.written == 3
    assert again.results == whole.results
    assert len(RunDir(tmp_path / "r").read_records()) == len(lines)


def test_different_manifest_is_refused_with_differences(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    with pytest.raises(UserError) as err:
        run(config(tmp_path / "r", methods=["vanilla"], sampling=Sampling(16, 6, "fewshot", 4)))
    assert "sampling.seed: 3 → 4" in str(err.value)


def test_manifest_records_protocol_plugins_and_costs(tmp_path):
    out = run(config(tmp_path / "r"))
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert manifest["sampling"] == {
        "total_steps": 16,
        "gen_length": 6,
        "prompt_style": "fewshot",
        "seed": 3,
    }
    assert manifest["backbone"]["name"] == "toy"
    assert manifest["scorers"]["orm"]["config"] == {"noise": 1.0, "partial": False}
    assert {"torch", "dllmbench", "python"} <= set(manifest["versions"])
    guided = next(m for m in manifest["methods"] if m["family"] == "prm_guided")
    assert guided["cost"] == {"denoise": 8 * 16, "score:prm": 16}  # two segments of T/2
    assert guided["strategy"]["config"]["k"] == 8
    assert guided["strategy"]["distribution"] == "dllmbench"


def test_manifest_differences_ignore_volatile_keys():
    a = {"created": "x", "command": ["a"], "execution": {"batch_rows": 1}, "budget": 5}
    b = {"created": "y", "command": ["b"], "execution": {"batch_rows": 9}, "budget": 6}
    assert manifest_differences(a, b) == ["budget: 5 → 6"]


def test_results_have_intervals_and_paired_deltas(tmp_path):
    out = run(config(tmp_path / "r"))
    by_id = {m["id"]: m for m in out.results["methods"]}
    assert out.results["reference"] == "Vanilla"
    maj = by_id["Majority@9"]
    assert maj["accuracy"]["low"] <= maj["accuracy"]["value"] <= maj["accuracy"]["high"]
    assert maj["delta_vs_reference"]["problems"] == 8
    assert maj["pool"]["size"] == 9.0
    assert "pool" not in by_id["Vanilla"] and "delta_vs_reference" not in by_id["Vanilla"]
    assert by_id["Oracle@9"]["ceiling"] is True
    assert maj["passes_per_problem"] == maj["planned_passes"] == 144  # 9 × 16 of a 144 budget
    board = (out.path / "leaderboard.md").read_text()
    assert "Ceilings" in board and board.index("Ceilings") < board.index("Oracle@9")


def test_compute_json_keeps_every_invocation(tmp_path):
    seen = []

    def stop(record):
        seen.append(record)
        if len(seen) == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        run(config(tmp_path / "r"), on_record=stop)
    run(config(tmp_path / "r"))
    compute = json.loads((tmp_path / "r" / "compute.json").read_text())
    assert [i["records_written"] for i in compute["invocations"]] == [8 * len(METHODS) - 5]
    run(config(tmp_path / "r"))
    compute = json.loads((tmp_path / "r" / "compute.json").read_text())
    assert [i["records_written"] for i in compute["invocations"]] == [8 * len(METHODS) - 5, 0]


def test_damage_before_the_last_line_is_an_error_not_a_silent_cut(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    samples = tmp_path / "r" / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    lines[2] = "{not json\n"
    samples.write_text("".join(lines))
    with pytest.raises(UserError, match="line 3 is damaged"):
        run(config(tmp_path / "r", methods=["vanilla"]))
    assert samples.read_text() == "".join(lines)  # nothing was cut


def test_summary_settings_may_change_on_resume(tmp_path):
    run(config(tmp_path / "r"))
    again = run(config(tmp_path / "r", reference="Majority@9", resamples=200))
    assert again.written == 0 and again.results["reference"] == "Majority@9"


def test_scorers_that_ask_for_the_backbone_share_it(tmp_path):
    from dllmbench.runner import prepare

    cfg = config(tmp_path / "r")
    _, _, _, backbone, scorers, _, _ = prepare(cfg)
    assert scorers["prm"].backbone is backbone and scorers["orm"].backbone is backbone
    out = run(cfg)
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert "backbone" not in manifest["scorers"]["prm"]["config"]
