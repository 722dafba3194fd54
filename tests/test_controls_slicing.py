"""The snapshot slicings of the scorer controls (`analysis.controls_slicing`): the paper's by
default (the all-mask canvas collected as the first snapshot, the fully decoded state in the
lowest mask bucket), the project's split slicing on request (`report --slicing split`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_user_error

from dllmbench.analysis import controls as c
from dllmbench.analysis.controls_markdown import markdown
from dllmbench.analysis.controls_slicing import select_slicing, slicing_entries
from dllmbench.core.errors import UserError
from dllmbench.execution.engine import Capacity, Sampling
from dllmbench.loading.registry import registry
from dllmbench.scoring.collect import (
    CollectConfig,
    collection_manifest,
    load,
    mask_ratios,
    run_collection,
    snapshot_steps,
)
from dllmbench.testing.doubles import MASK, ToyBackbone, ToySum

BOOT = c.Boot(seed=0, resamples=200)


# -- the all-mask canvas is the first snapshot ------------------------------------------------


def test_snapshot_steps_start_at_the_all_mask_canvas():
    assert snapshot_steps(8, 2) == [0, 4, 8]
    assert snapshot_steps(24, 12) == list(range(0, 25, 2))
    assert snapshot_steps(5, 5) == [0, 1, 2, 3, 4, 5]  # every step
    with pytest.raises(UserError, match="--snapshots 9 is more than --steps 5"):
        snapshot_steps(5, 9)  # was cut to each step once, without a word


def _toy_collection(out: Path, steps: list[int]) -> None:
    task, toy = ToySum(size=2), ToyBackbone()
    sampling = Sampling(8, 5, "fewshot", 0)
    meta = collection_manifest("toy_sum", task, "test", "toy", toy, sampling, 3, steps, 2)
    cfg = CollectConfig(
        task, toy, meta, task.problems("test"), 3, steps, sampling, Capacity(batch_rows=8)
    )
    run_collection(cfg, registry(), out)


def test_collect_stores_the_all_mask_canvas_as_each_trajectorys_first_snapshot(tmp_path):
    _toy_collection(tmp_path, snapshot_steps(8, 2))
    meta, states = load(tmp_path)
    assert meta["snapshot_steps"] == [0, 4, 8] and meta["format"] == 2
    assert len(states) == 2 * 3 * 3  # problems × trajectories × (canvas, step 4, T)
    assert [s.step for s in states[:3]] == [0, 4, 8]
    canvases = [s for s in states if s.step == 0]
    assert len(canvases) == 6
    assert all((s.tokens[s.prompt_len :] == MASK).all() for s in canvases)
    assert all(r == 1.0 for r in mask_ratios(canvases, MASK))
    assert not any(s.final for s in canvases)


def test_a_collection_without_the_canvas_is_refused_in_one_line(tmp_path):
    _toy_collection(tmp_path, snapshot_steps(8, 2))
    meta_path = tmp_path / "collect.json"
    old = json.loads(meta_path.read_text())
    del old["format"]  # as collect.json was written before the canvas was stored
    meta_path.write_text(json.dumps(old))
    for call in (lambda: load(tmp_path), lambda: _toy_collection(tmp_path, [4, 8])):
        with pytest.raises(UserError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message and "format 1" in message and "collect again" in message


# -- ROC-AUC by mask and the initial state under each slicing ---------------------------------


def _case() -> tuple[c.Snapshots, np.ndarray]:
    """Two problems × two trajectories (trajectory 0 ends correct, 1 wrong), stored at step
    0 (the all-mask canvas: every score tied), 5 (mask 0.5), 9 (mask 0.05) and T = 10."""
    scores = {  # step → scores of (p0 t0, p0 t1, p1 t0, p1 t1)
        0: [0.0, 0.0, 0.0, 0.0],
        5: [0.2, 0.4, 0.6, 0.1],
        9: [0.1, 0.3, 0.2, 0.0],
        10: [0.9, 0.3, 0.8, 0.7],
    }
    ratio = {0: 1.0, 5: 0.5, 9: 0.05, 10: 0.0}
    rows = [
        (p, t, step, score)
        for step, values in scores.items()
        for (p, t), score in zip([(0, 0), (0, 1), (1, 0), (1, 1)], values, strict=True)
    ]
    p, t, s, v = (np.array(x) for x in zip(*rows, strict=True))
    snaps = c.Snapshots(
        problem=p,
        trajectory=t,
        step=s,
        mask_ratio=np.array([ratio[int(x)] for x in s]),
        final=s == 10,
        label=t == 0,
    )
    return snaps, v.astype(float)


def test_the_paper_slicing_buckets_every_state_the_split_one_the_partial_ones():
    snaps, scores = _case()
    paper = c.auc_by_mask(snaps, scores, BOOT)  # the default
    split = c.auc_by_mask(snaps, scores, BOOT, c.SPLIT)
    # [0, 0.1): the paper's holds step 9 and T: positives {0.1, 0.2, 0.9, 0.8} against
    # {0.3, 0.0, 0.3, 0.7}: 1 + 1 + 4 + 4 of 16 pairs; the split one step 9 only: 2 of 4
    assert (paper.buckets[0].n, paper.buckets[0].auc) == (8, 10 / 16)
    assert (split.buckets[0].n, split.buckets[0].auc) == (4, 0.5)
    # [0.9, 1.0]: the all-mask canvas, every score tied, in the paper's slicing only
    assert (paper.buckets[9].n, paper.buckets[9].auc) == (4, 0.5)
    assert (split.buckets[9].n, split.buckets[9].auc) == (0, None)
    # [0.5, 0.6): step 5 in both, {0.2, 0.6} against {0.4, 0.1}: 3 of 4
    assert paper.buckets[5].auc == split.buckets[5].auc == 0.75
    # the fully decoded states alone, in both: {0.9, 0.8} above {0.3, 0.7}
    assert paper.final == split.final and (paper.final.n, paper.final.auc) == (4, 1.0)
    assert c.bucketed(snaps).all() and c.bucketed(snaps, c.SPLIT).sum() == 8
    with pytest.raises(ValueError, match="slicing must be one of paper, split"):
        c.auc_by_mask(snaps, scores, BOOT, "both")


def test_the_paper_initial_state_is_the_all_mask_canvas():
    snaps, scores = _case()
    assert c.stored_state([10, 5, 0, 9], 10, "initial") == 0
    assert c.stored_state([10, 5, 0, 9], 10, "initial", c.SPLIT) == 5
    assert c.stored_state([10, 5, 0, 9], 10, "middle", c.SPLIT) == 5
    paper = c.removal_risk(snaps, scores, 10, BOOT, width=2, keeps=(1,), states=("initial",))
    split = c.removal_risk(
        snaps, scores, 10, BOOT, width=2, keeps=(1,), states=("initial",), slicing=c.SPLIT
    )
    # step 0: every score tied, the cut keeps trajectory 0 of each problem, which ends
    # correct; step 5: p0 keeps trajectory 1 (0.4 > 0.2, wrong), p1 trajectory 0 (right)
    assert (paper[0].step, paper[0].mask_ratio, paper[0].lost, paper[0].at_risk) == (0, 1, 0, 2)
    assert (split[0].step, split[0].mask_ratio, split[0].lost, split[0].at_risk) == (5, 0.5, 1, 2)


# -- controls.json holds both; the report puts one in front ----------------------------------


def _controls() -> dict:
    snaps, scores = _case()
    return {"schema_version": 2, **slicing_entries(snaps, {"prm": scores}, 10, BOOT, width=2)}


def test_controls_hold_the_paper_slicing_in_front_and_the_split_one_beside_it():
    data = _controls()
    assert data["slicing"] == "paper" and data["alternative"]["slicing"] == "split"
    [front] = data["auc_by_mask"]
    [other] = data["alternative"]["auc_by_mask"]
    assert [b["n"] for b in front["buckets"]] == [8, 0, 0, 0, 0, 4, 0, 0, 0, 4]
    assert [b["n"] for b in other["buckets"]] == [4, 0, 0, 0, 0, 4, 0, 0, 0, 0]
    assert front["final"] == other["final"]
    steps = {r["state"]: r["step"] for r in data["removal_risk"]}
    assert steps == {"initial": 0, "middle": 5, "final": 10}
    assert {r["state"]: r["step"] for r in data["alternative"]["removal_risk"]}["initial"] == 5


def test_select_slicing_swaps_the_two_and_refuses_controls_of_one_slicing():
    data = _controls()
    assert select_slicing(data, "paper", "c") is data
    split = select_slicing(data, "split", "c")
    assert split["slicing"] == "split" and split["alternative"]["slicing"] == "paper"
    assert split["auc_by_mask"] == data["alternative"]["auc_by_mask"]
    assert split["alternative"]["removal_risk"] == data["removal_risk"]
    assert select_slicing(split, "paper", "c") == data
    old = {k: v for k, v in data.items() if k not in ("slicing", "alternative")}
    old["schema_version"] = 1
    for controls, slicing, needle in (
        (old, "paper", "the controls in c hold one snapshot slicing only"),
        (data, "mixed", "--slicing must be one of paper, split"),
    ):
        with pytest.raises(UserError, match=needle) as err:
            select_slicing(controls, slicing, "c")
        assert "\n" not in str(err.value)


def test_the_controls_markdown_names_its_slicing():
    data = {
        **_controls(),
        "width": 2,
        "kendall_tau": [],
        "readout": [],
        "suffix_ablation": [],
        "reversed_input": [],
        "reranker": [],
        "scorer_swap": {"size": 2, "accuracy": {}, "differences": []},
        "collection": {
            "path": "c",
            "task": {"name": "t", "split": "test"},
            "problems": 2,
            "n": 2,
            "states": 16,
            "snapshot_steps": [0, 5, 9, 10],
            "sampling": {"total_steps": 10},
            "correct": 0.5,
        },
    }
    paper = markdown(data)
    assert "under the paper's slicing: every stored state, from the all-mask canvas" in paper
    assert "--slicing split` shows the project's split slicing" in paper
    assert "at the initial (the all-mask canvas, step 0)" in paper
    assert "initial (step 0, mask 1.00)" in paper
    split = markdown(select_slicing(data, "split", "c"))
    assert "under the project's split slicing" in split and "--slicing paper` shows" in split
    assert "initial (step 5, mask 0.50)" in split


# -- the command line ---------------------------------------------------------------------------


def test_report_shows_the_paper_slicing_unless_asked_for_the_split_one(cli, tmp_path, finished_run):
    collection, folder = tmp_path / "collection", tmp_path / "controls"
    argv = ["collect", "--task", "toy_sum:size=4", "--split", "test", "--backbone", "toy"]
    argv += ["--steps", "8", "--gen-length", "5", "--n", "4", "--snapshots", "4"]
    assert cli(*argv, "--out", collection).code == 0
    scorers = ["--scorer", "prm=toy", "--scorer", "orm=toy:partial=false"]
    assert cli("diagnose", collection, *scorers, "--width", "4", "--out", folder).code == 0
    saved = json.loads((folder / "controls.json").read_text())
    states = 4 * 4 * 5  # problems × trajectories × (canvas, steps 2, 4, 6, T = 8)
    [prm] = saved["auc_by_mask"]
    assert saved["slicing"] == "paper" and sum(b["n"] for b in prm["buckets"]) == states
    [alt] = saved["alternative"]["auc_by_mask"]
    assert sum(b["n"] for b in alt["buckets"]) == 4 * 4 * 3  # steps 2, 4 and 6

    out = {s: tmp_path / f"report-{s}" for s in ("paper", "split")}
    assert cli("report", finished_run, "--controls", folder, "--out", out["paper"]).code == 0
    result = cli(
        "report", finished_run, "--controls", folder, "--slicing", "split", "--out", out["split"]
    )
    assert result.code == 0, result.err
    paper, split = (json.loads((out[s] / "report.json").read_text())["controls"] for s in out)
    assert paper == saved
    assert split["slicing"] == "split" and split["auc_by_mask"] == [alt]
    assert split["alternative"]["auc_by_mask"] == [prm]
    assert "under the project's split slicing" in (out["split"] / "report.md").read_text()

    del saved["alternative"]  # controls.json of one slicing, as diagnose wrote it before
    (folder / "controls.json").write_text(json.dumps(saved))
    result = cli("report", finished_run, "--controls", folder, "--out", tmp_path / "old")
    assert_user_error(result, "hold one snapshot slicing only", "dllmbench diagnose")
