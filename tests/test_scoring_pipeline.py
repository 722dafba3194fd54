"""collect → train-scorer → run, end to end on a few problems, through the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from dllmbench.cli import main
from dllmbench.core.errors import UserError

BACKBONE = "dream:model=random"
COMMON = ["--steps", "6", "--gen-length", "8", "--prompt", "fewshot", "--seed", "1"]


def collect_argv(out, n: int, snapshots: int, limit: int) -> list[str]:
    return [
        "collect",
        "--task",
        "arith:max_steps=1",
        "--backbone",
        BACKBONE,
        "--n",
        str(n),
        "--snapshots",
        str(snapshots),
        "--limit",
        str(limit),
        "--out",
        str(out),
        "--json",
        *COMMON,
    ]


def test_collect_train_and_run(tmp_path, capsys):
    data = tmp_path / "collection"
    argv = collect_argv(data, n=3, snapshots=3, limit=6)
    assert main(argv) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts == {"problems": 6, "skipped": 0, "trajectories": 18}
    lines = [json.loads(x) for x in (data / "trajectories.jsonl").read_text().splitlines()]
    # the all-mask canvas (step 0), then 3 snapshots over 1..T
    assert len(lines) == 18 and {line["snapshots"] for line in lines} == {4}
    shard = load_file(str(data / "snapshots-00000.safetensors"))
    assert shard["tokens"].shape[0] == 18 * 4
    assert sorted(set(shard["steps"].tolist())) == [0, 2, 4, 6]
    # resuming a finished collection writes nothing more
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 6

    for kind in ("prm", "orm"):
        out = tmp_path / kind
        assert (
            main(
                [
                    "train-scorer",
                    "--kind",
                    kind,
                    "--data",
                    str(data),
                    "--steps",
                    "4",
                    "--batch",
                    "4",
                    "--val-every",
                    "2",
                    "--val-fraction",
                    "0.34",
                    "--lr",
                    "1e-3",
                    "--out",
                    str(out),
                    "--json",
                ]
            )
            == 0
        )
        record = json.loads(capsys.readouterr().out)
        assert record["best"]["step"] in (2, 4)
        assert set(record["best"]["by_mask_ratio"]) if kind == "prm" else True
        assert (out / "best" / "adapter.safetensors").exists()
        assert (out / "latest" / "state.pt").exists()
        snapshots_used = record["train"] + record["validation"]
        assert snapshots_used == (72 if kind == "prm" else 18)

    run = [
        "run",
        "--task",
        "arith:max_steps=1",
        "--backbone",
        BACKBONE,
        "--limit",
        "3",
        "--scorer",
        f"prm=prm:checkpoint={tmp_path / 'prm' / 'best'}",
        "--scorer",
        f"orm=orm:checkpoint={tmp_path / 'orm' / 'best'}",
        "--methods",
        "vanilla,orm_rerank,prm_guided,smc_vote",
        "--budget",
        "64",
        "--out",
        str(tmp_path / "run"),
        "--json",
        *COMMON,
    ]
    assert main(run) == 0
    results = json.loads(capsys.readouterr().out)
    ids = [m["id"] for m in results["methods"]]
    assert ids == ["Vanilla", "ORM Rerank@9", "PRM Guided K=8 b=3", "SMC K=8 b=3 (weighted vote)"]
    assert all(m["passes_per_problem"] == m["planned_passes"] for m in results["methods"])


class Stop(Exception):
    pass


def test_training_resumes_exactly(tmp_path, capsys):
    from dllmbench.loading.registry import registry
    from dllmbench.scoring.collect import load
    from dllmbench.scoring.training import TrainConfig, train

    data = tmp_path / "collection"
    assert main(collect_argv(data, n=2, snapshots=2, limit=4)) == 0
    _, snapshots = load(data)
    cfg = TrainConfig(kind="prm", steps=6, batch=4, lr=1e-3, val_every=2, val_fraction=0.5)

    def fresh():
        backbone = registry().backbone("dream", model="random")
        return backbone, registry().scorer("prm", shared={"backbone": backbone})

    backbone, scorer = fresh()
    whole = train(scorer, snapshots, cfg, tmp_path / "whole", backbone.mask_id, log=str)
    backbone, scorer = fresh()
    seen = []

    def interrupt(n):
        seen.append(n)
        if len(seen) == 3:  # after the step-2 checkpoint, during step 3's bookkeeping
            raise Stop

    with pytest.raises(Stop):
        train(
            scorer, snapshots, cfg, tmp_path / "cut", backbone.mask_id, log=str, advance=interrupt
        )
    backbone, scorer = fresh()
    begun, steps = [], []
    resumed = train(
        scorer,
        snapshots,
        cfg,
        tmp_path / "cut",
        backbone.mask_id,
        log=str,
        advance=steps.append,
        started=begun.append,
    )
    # the progress starts at the step-2 checkpoint and counts the 4 steps left: 6 of 6 at the end
    assert begun == [2] and steps == [1] * 4
    assert resumed["history"] == whole["history"]
    assert resumed["best"] == whole["best"]
    # a training directory is never resumed on other trajectories
    relabelled = [replace(s, correct=not s.correct) for s in snapshots]
    backbone, scorer = fresh()
    with pytest.raises(UserError, match="other trajectories"):
        train(scorer, relabelled, cfg, tmp_path / "cut", backbone.mask_id, log=str)
    # nor under another configuration: the line names what differs
    backbone, scorer = fresh()
    with pytest.raises(UserError, match=r"another configuration \(steps: 6 → 8\); choose"):
        train(scorer, snapshots, replace(cfg, steps=8), tmp_path / "cut", backbone.mask_id, log=str)


def test_best_of_n_ranks_each_problems_final_states():
    import numpy as np
    import torch

    from dllmbench.scoring.collect import Snapshot
    from dllmbench.scoring.training import balance, mixed_problems, rerank

    def snap(problem, correct, final=True):
        return Snapshot(problem, torch.zeros(3, dtype=torch.long), 1, 4, correct, final)

    data = [
        snap("a", False), snap("a", True), snap("a", True, final=False),
        snap("b", False), snap("b", False), snap("c", True),  # c: one final, not ranked
    ]  # fmt: skip
    scores = np.array([0.1, 0.9, -5.0, 0.3, 0.2, 0.0])
    assert rerank(data, scores) == {"problems": 2, "top1_accuracy": 0.5, "mean_accuracy": 0.25}
    assert rerank(data, -scores)["top1_accuracy"] == 0.0
    assert mixed_problems(data) == {"a"}
    # balance: a problem's trajectories, as many ending correct as ending wrong, whole
    trajectories = [
        [snap("p", True, final=False), snap("p", True)],
        [snap("p", False, final=False), snap("p", False)],
        [snap("p", False, final=False), snap("p", False)],
    ]
    kept = balance([s for t in trajectories for s in t], seed=0)
    assert [s.correct for s in kept].count(True) == [s.correct for s in kept].count(False) == 2
    assert [s.final for s in kept] == [False, True, False, True]


def test_data_selection_holds_out_problems_and_keeps_what_each_kind_learns_from():
    import torch

    from dllmbench.scoring.collect import Snapshot
    from dllmbench.scoring.training import TrainConfig, select_data

    mask = 9
    data = [
        Snapshot(f"p{i}", torch.tensor([1, mask, 2]), 1, step, i % 2 == 0, final)
        for i in range(10)
        for step, final in ((4, False), (8, True))
    ]
    prm = select_data(data, TrainConfig(kind="prm", val_fraction=0.2, seed=3), mask)
    train_ids = {s.problem for s in prm.train}
    val_ids = {s.problem for s in prm.validation}
    assert len(val_ids) == prm.validation_problems == 2 and not train_ids & val_ids
    assert len(prm.train) == 16 and not all(s.final for s in prm.train)
    assert list(prm.validation_ratios) == [0.5] * 4  # one of the two answer tokens is masked
    orm = select_data(data, TrainConfig(kind="orm", val_fraction=0.2, seed=3), mask)
    assert all(s.final for s in orm.train + orm.validation) and len(orm.train) == 8
    assert select_data(data, TrainConfig(kind="prm", seed=4), mask).digest != prm.digest
    with pytest.raises(UserError, match="mixed outcomes"):  # no problem has both outcomes
        select_data(data, TrainConfig(kind="orm", groups="mixed"), mask)


@pytest.mark.parametrize(
    ("masked", "generated", "bucket"), [(14, 20, 7), (18, 20, 9), (21, 30, 7), (7, 10, 7)]
)
def test_a_state_exactly_at_a_bucket_edge_falls_in_the_bucket_it_opens(masked, generated, bucket):
    """14 of 20 generated positions masked is 0.7 exactly: [0.7, 0.8), not [0.6, 0.7) as a
    float32 share (0.69999999) put it when the generated length is not a power of two."""
    import torch

    from dllmbench.analysis.diagnostics import mask_bucket
    from dllmbench.scoring.collect import Snapshot, mask_ratios

    mask = 9
    tokens = torch.tensor([1, 2, 3] + [mask] * masked + [4] * (generated - masked))
    [ratio] = mask_ratios([Snapshot("p", tokens, 3, 1, True, False)], mask)
    assert ratio == masked / generated and mask_bucket(ratio) == bucket
