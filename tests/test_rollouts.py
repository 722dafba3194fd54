"""Rollout values: `collect --rollouts R` (R continuations of every snapshot state, graded by
the task, charged by the ledger) and `train-scorer --labels rollout` (fractional BCE targets)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dllmbench.cli import main
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Rows
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.loading.registry import registry
from dllmbench.scoring.collect import (
    CollectConfig,
    Snapshot,
    Trajectories,
    collection_manifest,
    load,
    rollout_counts,
    rollout_rows,
    run_collection,
)
from dllmbench.scoring.training import TrainConfig, TrainData, TrainState, targets, train_step
from dllmbench.testing.doubles import ToyBackbone, ToySum

T, GEN = 8, 5
STEPS = [2, 5, T]  # two states before T get rollouts; the final one keeps its own label


def _collect(tmp_path, r: int, problems: int = 4, n: int = 3, **backbone) -> tuple[dict, list]:
    """A toy collection with R rollouts per state, and its trajectories' index lines."""
    task, toy = ToySum(size=problems), ToyBackbone(**backbone)
    sampling = Sampling(T, GEN, "fewshot", 0)
    meta = collection_manifest(
        "toy_sum", task, "test", "toy", toy, sampling, n, STEPS, problems, rollouts=r
    )
    cfg = CollectConfig(
        task,
        toy,
        meta,
        task.problems("test"),
        n,
        STEPS,
        sampling,
        Capacity(batch_rows=16),
        shard_problems=3,
        rollouts=r,
    )
    counts = run_collection(cfg, registry(), tmp_path)
    assert counts["trajectories"] == problems * n
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    return json.loads((tmp_path / "collect.json").read_text()), lines


def _counts(tmp_path) -> list[list[int]]:
    """Each trajectory's rollout counts, one per snapshot, in step order."""
    out = []
    for line in (tmp_path / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        shard = load_file(str(tmp_path / f"snapshots-{t['shard']:05d}.safetensors"))
        rows = range(t["row"], t["row"] + t["snapshots"])
        assert [int(shard["steps"][j]) for j in rows] == STEPS
        out.append([int(shard["rollouts"][j]) for j in rows])
    return out


def test_rollout_counts_lie_in_0_to_r_and_a_final_state_keeps_its_own_label(tmp_path):
    r = 4
    meta, lines = _collect(tmp_path, r)
    assert meta["rollouts"] == r
    counts = _counts(tmp_path)
    assert all(0 <= c <= r for row in counts for c in row)
    for line, row in zip(lines, counts, strict=True):
        assert row[-1] == (r if line["correct"] else 0)
    # each rollout draws its own noise: some state has rollouts that disagree
    assert any(0 < c < r for row in counts for c in row[:-1]), counts
    _, snapshots = load(tmp_path)
    assert [s.value for s in snapshots[: len(STEPS)]] == [c / r for c in counts[0]]
    assert all(s.value == float(s.correct) for s in snapshots if s.final)


def test_forced_rollouts_give_a_known_label(tmp_path):
    # every committed character right: every rollout from every state is correct
    _collect(tmp_path / "right", 3, p_correct=1.0)
    assert _counts(tmp_path / "right") == [[3, 3, 3]] * 12
    # one fixed noise key for every row (a sampler at temperature 0): a rollout from a state
    # retraces the trajectory's own continuation, so each state's label is R·(final correct)
    _, lines = _collect(tmp_path / "fixed", 3, deterministic=True, p_correct=0.5)
    counts = _counts(tmp_path / "fixed")
    assert counts == [[3 * line["correct"]] * 3 for line in lines]
    assert {line["correct"] for line in lines} == {True, False}  # both labels occur


def test_rollouts_are_declared_and_charged_like_any_step():
    n, r = 3, 4
    plain, rolled = Trajectories(n, STEPS), Trajectories(n, STEPS, rollouts=r)
    assert plain.cost(T) == {"denoise": n * T}
    # n·T for the trajectories, then R continuations of each of n rows from steps 2 and 5
    assert rolled.cost(T) == {"denoise": n * T + n * r * ((T - 2) + (T - 5))}
    assert rolled.pool_size() == n  # the pool stays the n trajectories
    # the engine checks every problem's spending against this declaration (CostMismatch)
    task, toy = ToySum(size=2), ToyBackbone()
    from dllmbench.execution.method import Method, MethodSpec

    method = Method("collect", MethodSpec("collect"), rolled, registry().selector("first"))
    engine = Engine(
        backbone=toy,
        scorers={},
        task=task,
        methods=[method],
        sampling=Sampling(T, GEN, "fewshot", 0),
    )
    records = engine.run(task.problems("test"))
    for record in records:
        assert len(record["candidates"]) == n
        assert record["ledger"]["passes"]["denoise"] == rolled.cost(T)["denoise"]


def test_rollout_rows_each_draw_their_own_noise():
    problem = Problem("p", "1+1=", 2)
    states = []
    for step in (2, 5):
        tokens = torch.zeros((2, 6), dtype=torch.long)
        states.append(
            Rows(
                problem, 0, "collect", 1, tokens, (step,) * 2, ((0,), (1,)), (("m",),) * 2, (T,) * 2
            )
        )
    rows = rollout_rows(states, 3)
    assert len(rows) == 2 * 2 * 3
    assert rows.lineage[:3] == ((0, 0, 0), (0, 0, 1), (0, 0, 2))  # state 0, row 0, r = 0..2
    assert rows.lineage[6] == (0, 1, 0)  # state 1, row 0
    assert rows.steps == (2,) * 6 + (5,) * 6
    keys = set(rows.rng_keys) | set(states[0].rng_keys)
    assert len(keys) == 12 + 2  # no rollout shares a key with another or with a trajectory


def test_rollout_counts_sum_each_states_rollouts():
    # n = 2 rows, 2 states, R = 3, in rollout_rows order [state][row][r]
    labels = [1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0]
    assert rollout_counts([bool(x) for x in labels], 2, 2, 3).tolist() == [[2, 3], [0, 1]]
    with pytest.raises(ValueError):
        rollout_counts([True], 2, 2, 3)


def _snap(problem: str, correct: bool, value: float | None, final: bool = False) -> Snapshot:
    return Snapshot(problem, torch.tensor([1, 2, 3]), 1, 4, correct, final, value)


def test_targets_are_final_correctness_or_the_rollouts_share():
    data = [_snap("a", True, 0.25), _snap("a", True, 1.0, final=True), _snap("b", False, 0.75)]
    assert targets(data, "final").tolist() == [1.0, 1.0, 0.0]
    assert targets(data, "rollout").tolist() == [0.25, 1.0, 0.75]
    with pytest.raises(UserError, match="--rollouts"):
        targets([_snap("a", True, None)], "rollout")
    with pytest.raises(ValueError):
        TrainConfig(kind="prm", labels="fractional")


class _Lookup:
    """A trainable scorer whose logit for a snapshot is a weight times its first token."""

    def __init__(self):
        self.w = torch.nn.Parameter(torch.tensor(1.0))

    def trainable(self):
        return [self.w]

    def logits(self, tokens, prompt_lens):
        return self.w * torch.stack([t[0].float() for t in tokens])

    def train_mode(self, flag):
        pass


@pytest.mark.parametrize("labels", ["final", "rollout"])
def test_train_step_fits_the_chosen_targets(labels):
    data = [
        Snapshot(f"p{i}", torch.tensor([i - 2, 0]), 1, 4, i % 2 == 0, False, i / 4)
        for i in range(5)
    ]
    scorer = _Lookup()
    opt = torch.optim.SGD(scorer.trainable(), lr=0.0)
    state = TrainState(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0))
    cfg = TrainConfig(kind="prm", batch=5, labels=labels)
    loss = train_step(
        scorer, scorer.trainable(), state, TrainData(data, [], np.zeros(0), 0, ""), cfg
    )
    z = torch.tensor([i - 2.0 for i in range(5)])
    y = torch.tensor([i / 4 for i in range(5)] if labels == "rollout" else [1.0, 0, 1, 0, 1])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
    assert math.isclose(loss, float(expected), rel_tol=1e-6)


def test_cli_collect_rollouts_train_and_refusal(tmp_path, capsys):
    common = ["--steps", "4", "--gen-length", "8", "--seed", "1", "--json"]
    collect = ["collect", "--task", "arith:max_steps=1", "--n", "2", "--snapshots", "2"]
    collect += ["--limit", "4", *common]
    rolled, plain = tmp_path / "rolled", tmp_path / "plain"
    assert main([*collect, "--backbone", "tiny", "--rollouts", "3", "--out", str(rolled)]) == 0
    assert json.loads(capsys.readouterr().out)["trajectories"] == 8
    assert json.loads((rolled / "collect.json").read_text())["rollouts"] == 3
    _, snapshots = load(rolled)
    # 4 problems × 2 trajectories × 3 snapshots: the all-mask canvas, steps 2 and 4
    assert len(snapshots) == 24 and all(s.value in (0, 1 / 3, 2 / 3, 1) for s in snapshots)
    # deterministic sampling: a state's rollouts retrace its trajectory's own continuation
    forced = tmp_path / "forced"
    tiny0 = "tiny:temperature=0,alg_temp=0"
    assert main([*collect, "--backbone", tiny0, "--rollouts", "2", "--out", str(forced)]) == 0
    capsys.readouterr()
    _, snapshots = load(forced)
    assert all(s.value == float(s.correct) for s in snapshots)

    train = ["train-scorer", "--kind", "prm", "--steps", "2", "--batch", "4", "--val-every"]
    train += ["2", "--val-fraction", "0.5", "--json"]
    assert (
        main([*train, "--data", str(rolled), "--labels", "rollout", "--out", str(tmp_path / "s")])
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["config"]["labels"] == "rollout"
    assert record["best"]["auc"] is None or 0 <= record["best"]["auc"] <= 1
    assert record["best"]["rollout_bce"] > 0 and "rollout_bce" in record["history"][-1]

    assert main([*collect, "--backbone", "tiny", "--out", str(plain)]) == 0
    capsys.readouterr()
    code = main([*train, "--data", str(plain), "--labels", "rollout", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no rollouts" in err and "--rollouts" in err
    assert not (tmp_path / "x").exists()
