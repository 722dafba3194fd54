"""The scorer controls (`analysis.controls`, `scoring.controls`, `dllmbench diagnose`), each on
constructed states whose answer is known by hand."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_user_error
from sklearn.metrics import roc_auc_score

from dllmbench.analysis import controls as c
from dllmbench.analysis.controls_markdown import markdown, md_removal
from dllmbench.analysis.controls_slicing import risk_entry
from dllmbench.analysis.pooled import argmax_at_k
from dllmbench.loading.registry import Registry
from dllmbench.scoring.controls import readout_pairs, reversed_solution, suffix_ablated

BOOT = c.Boot(seed=0, resamples=300)


def _snaps(rows: list[tuple[int, int, int, float, bool]], total: int) -> c.Snapshots:
    """(problem, trajectory, step, mask ratio, label) per state."""
    p, t, s, r, y = zip(*rows, strict=True)
    return c.Snapshots(
        problem=np.array(p),
        trajectory=np.array(t),
        step=np.array(s),
        mask_ratio=np.array(r, float),
        final=np.array(s) == total,
        label=np.array(y, bool),
    )


# -- removal risk ---------------------------------------------------------------------------------


def _risk_case() -> tuple[c.Snapshots, np.ndarray]:
    """Two problems × 4 trajectories, stored at steps 2, 5, 8 and T = 10 (initial 2, middle 5).

    Problem 0: trajectory 3 alone ends correct. Its scores rank it last at step 2, second at
    step 5 and first at T. Problem 1: trajectories 0 and 1 end correct; at step 2 they rank
    3rd and 4th, at step 5 1st and 4th, at T 2nd and 3rd.
    """
    ranks = {  # (problem, step) → score of trajectories 0..3
        (0, 2): [4, 3, 2, 1],
        (0, 5): [4, 1, 2, 3],
        (0, 8): [1, 2, 3, 4],
        (0, 10): [1, 2, 3, 4],
        (1, 2): [2, 1, 4, 3],
        (1, 5): [4, 1, 2, 3],
        (1, 8): [4, 3, 2, 1],
        (1, 10): [3, 2, 1, 4],
    }
    correct = {0: [False, False, False, True], 1: [True, True, False, False]}
    rows, scores = [], []
    for (p, step), values in ranks.items():
        for t, value in enumerate(values):
            rows.append((p, t, step, 1 - step / 10, correct[p][t]))
            scores.append(float(value))
    return _snaps(rows, 10), np.array(scores)


def test_stored_states_are_the_first_the_nearest_the_middle_and_T():
    assert c.stored_state([8, 2, 5, 10], 10, "initial") == 2
    assert c.stored_state([8, 2, 5, 10], 10, "middle") == 5
    assert c.stored_state([4, 6, 10], 10, "middle") == 4  # a tie goes to the earlier
    assert c.stored_state([8, 2, 5, 10], 10, "final") == 10
    with pytest.raises(ValueError, match="state must be one of"):
        c.stored_state([1], 10, "late")


def test_removal_risk_counts_the_groups_a_cut_empties_of_correct_lineages():
    snaps, scores = _risk_case()
    risks = {(r.state, r.keep): r for r in c.removal_risk(snaps, scores, 10, BOOT, width=4)}
    # keep 1: step 2 keeps 0 (p0, wrong) and 2 (p1, wrong): both lost. Step 5 keeps 0 and 0:
    # p0 lost, p1 kept. T keeps 3 and 3: p0 kept, p1 lost.
    # keep 2: step 2 keeps {0, 1} and {2, 3}: both lost; step 5 {0, 3} and {0, 3}: none;
    # T {3, 2} and {3, 0}: none
    expected = {
        ("initial", 1): 2,
        ("middle", 1): 1,
        ("final", 1): 1,
        ("initial", 2): 2,
        ("middle", 2): 0,
        ("final", 2): 0,
    }
    assert set(risks) == set(expected)  # M = 4 is no cut of a group of 4
    for key, lost in expected.items():
        r = risks[key]
        assert (r.groups, r.at_risk, r.lost) == (2, 2, lost), key
        assert r.rate.value == pytest.approx(lost / 2)
        assert r.rate.low <= r.rate.value <= r.rate.high
    assert risks[("initial", 1)].step == 2 and risks[("middle", 1)].step == 5
    assert risks[("final", 1)].mask_ratio == 0.0


def test_removal_risk_is_over_the_groups_at_risk_and_over_all_groups_beside_it():
    """30 problems × one group of 8, as the demo run of issue 35: 26 groups hold a trajectory
    that ends correct, and the top-1 cut at T keeps a wrong one in 6 of them."""
    rows, scores = [], []
    for p in range(30):
        correct = {7} if p < 26 else set()  # trajectory 7 alone ends correct, in 26 problems
        best = 0 if p < 6 else 7  # the score ranks it first except in problems 0..5
        for t in range(8):
            rows.append((p, t, 4, 0.0, t in correct))
            scores.append(1.0 if t == best else 0.0)
    snaps = _snaps(rows, 4)
    [r] = c.removal_risk(snaps, np.array(scores), 4, BOOT, width=8, keeps=(1,), states=("final",))
    assert (r.groups, r.at_risk, r.lost) == (30, 26, 6)
    assert r.rate.value == 6 / 26  # 23.1%: the project's reading, over the groups at risk
    assert r.rate_all_groups.value == 6 / 30  # 20.0%: over all groups
    assert r.rate_all_groups.low <= 0.2 <= r.rate_all_groups.high
    entry = risk_entry("prm", r)  # as controls.json holds it
    assert entry["rate_all_groups"]["value"] == 0.2 and entry["rate"]["value"] == 0.230769
    text = "\n".join(md_removal({"width": 8, "slicing": "paper", "removal_risk": [entry]}))
    assert "the project's reading of the paper's denominator" in text
    assert "23.1 [" in text and "(6/26); all groups 20.0 [" in text and "(6/30)" in text


def test_removal_risk_splits_a_pool_into_whole_groups():
    snaps, scores = _risk_case()
    risks = c.removal_risk(snaps, scores, 10, BOOT, width=3, keeps=(1,), states=("final",))
    # groups {0, 1, 2} of each problem; trajectory 3 left out. p0's group holds no correct
    # trajectory; p1's keeps 0 (score 3): correct
    (r,) = risks
    assert (r.groups, r.at_risk, r.lost) == (2, 1, 0)


def test_removal_risk_agrees_with_brute_force_on_random_states():
    rng = np.random.default_rng(3)
    rows, scores = [], []
    for p, t, step in itertools.product(range(12), range(8), (3, 6, 12)):
        rows.append((p, t, step, 1 - step / 12, bool(rng.random() < 0.3 + 0.04 * t)))
        scores.append(float(rng.integers(0, 5)))  # ties are common
    labels = {(p, t): y for p, t, _, _, y in rows}
    # a trajectory's label is its own, whatever the step
    rows = [(p, t, s, r, labels[(p, t)]) for p, t, s, r, _ in rows]
    snaps, scores = _snaps(rows, 12), np.array(scores)
    for r in c.removal_risk(snaps, scores, 12, BOOT, width=4):
        at_risk = lost = 0
        for p, g in itertools.product(range(12), range(2)):
            idx = [i for i, row in enumerate(rows) if row[0] == p and row[2] == r.step]
            idx = [i for i in idx if g * 4 <= rows[i][1] < g * 4 + 4]
            if any(rows[i][4] for i in idx):
                at_risk += 1
                kept = sorted(idx, key=lambda i: (-scores[i], rows[i][1]))[: r.keep]
                lost += not any(rows[i][4] for i in kept)
        assert (r.at_risk, r.lost) == (at_risk, lost)


# -- AUC by mask, with fully decoded states apart -------------------------------------------------


def test_auc_by_mask_split_keeps_fully_decoded_states_apart():
    rng = np.random.default_rng(0)
    rows, scores = [], []
    for p, t in itertools.product(range(10), range(4)):
        y = bool(rng.random() < 0.5)
        for step, ratio in ((1, 0.95), (5, 0.05), (10, 0.0)):
            rows.append((p, t, step, ratio, y))
            scores.append(float(rng.normal()) + (y if step == 10 else 0.0))
    snaps, scores = _snaps(rows, 10), np.array(scores)
    curve = c.auc_by_mask(snaps, scores, BOOT, c.SPLIT)
    final = snaps.final
    assert curve.final.n == 40 and (curve.final.low, curve.final.high) == (0.0, 0.0)
    assert curve.final.auc == pytest.approx(roc_auc_score(snaps.label[final], scores[final]))
    low = (snaps.mask_ratio < 0.1) & ~final
    assert curve.buckets[0].n == 10 * 4  # only the partial states of ratio 0.05
    assert curve.buckets[0].auc == pytest.approx(roc_auc_score(snaps.label[low], scores[low]))
    assert curve.buckets[9].n == 40
    assert [b.n for b in curve.buckets[1:9]] == [0] * 8
    assert all(b.auc is None for b in curve.buckets[1:9])


def test_auc_change_is_zero_for_the_same_scores_and_paired():
    rng = np.random.default_rng(1)
    rows = [(p, t, 4, 0.0, bool(rng.random() < 0.5)) for p in range(15) for t in range(4)]
    snaps = _snaps(rows, 4)
    a = rng.normal(size=60) + snaps.label
    same = c.auc_change(snaps, a, a.copy(), BOOT)
    assert same.change.value == 0 and same.change.low == 0 and same.change.high == 0
    flipped = c.auc_change(snaps, a, -a, BOOT)
    assert flipped.b.value == pytest.approx(1 - flipped.a.value)
    assert flipped.change.value == pytest.approx(1 - 2 * flipped.a.value)
    assert flipped.a.value == pytest.approx(roc_auc_score(snaps.label, a))


# -- reranking ------------------------------------------------------------------------------------


def test_reranker_is_best_of_n_against_a_uniform_pick():
    rows, scores = [], []
    outcomes = {0: [True, False, False, False], 1: [False, True, True, False]}
    values = {0: [0.1, 0.9, 0.2, 0.3], 1: [0.8, 0.7, 0.1, 0.0]}
    for p in (0, 1):
        for t in range(4):
            rows.append((p, t, 3, 0.0, outcomes[p][t]))
            scores.append(values[p][t])
    snaps, scores = _snaps(rows, 3), np.array(scores)
    ranked = c.reranker(snaps, scores, BOOT)
    assert [p.n for p in ranked.points] == [1, 2, 4]
    for point in ranked.points:
        expected = np.mean([argmax_at_k(values[p], outcomes[p], point.n) for p in (0, 1)])
        assert point.scorer.value == pytest.approx(expected)
        assert point.random.value == pytest.approx((1 / 4 + 2 / 4) / 2)
        assert point.difference.value == pytest.approx(expected - 3 / 8)
    # at N = 4 the argmax of p0 is trajectory 1 (wrong), of p1 trajectory 0 (wrong)
    assert ranked.points[-1].scorer.value == 0.0
    assert ranked.mean_correct == pytest.approx((0.1 + 0.7 + 0.1) / 3)
    assert ranked.mean_incorrect == pytest.approx((0.9 + 0.2 + 0.3 + 0.8 + 0.0) / 5)
    # p0: 0.1 − 0.467 < 0; p1: 0.4 − 0.4 = 0: neither separated
    assert ranked.separated == 0.0 and ranked.mixed == 2


def test_pool_sizes_double_up_to_the_pool():
    assert c.pool_sizes(1) == [1]
    assert c.pool_sizes(8) == [1, 2, 4, 8]
    assert c.pool_sizes(6) == [1, 2, 4, 6]


# -- the inputs the controls change ---------------------------------------------------------------


def test_suffix_ablation_masks_the_right_half_of_the_generated_region():
    tokens = torch.tensor([7, 7, 1, 2, 3, 4, 5])  # prompt of 2, five generated
    assert suffix_ablated(tokens, 2, 0).tolist() == [7, 7, 1, 2, 3, 0, 0]
    assert suffix_ablated(tokens[:6], 2, 0).tolist() == [7, 7, 1, 2, 0, 0]
    assert tokens.tolist() == [7, 7, 1, 2, 3, 4, 5]  # the input is left alone


def test_reversed_input_reverses_the_solution_and_keeps_what_follows():
    tokens = torch.tensor([7, 7, 1, 2, 3, 9, 9])  # 9: a stop token
    assert reversed_solution(tokens, 2, {9}).tolist() == [7, 7, 3, 2, 1, 9, 9]
    assert reversed_solution(tokens, 2, set()).tolist() == [7, 7, 9, 9, 3, 2, 1]


def test_readout_pairs_differ_only_in_pooling():
    settings = {
        "bi": {"attention": "bidirectional", "pooling": "mean", "lora_r": 8},
        "causal": {"attention": "causal", "pooling": "mean", "lora_r": 8},
        "causal_last": {"attention": "causal", "pooling": "last", "lora_r": 8},
        "causal_last_r4": {"attention": "causal", "pooling": "last", "lora_r": 4},
        "plain": {},
    }
    assert readout_pairs(settings) == [("causal", "causal_last")]


# -- the command, end to end ----------------------------------------------------------------------


def _collect(cli, out: Path) -> None:
    result = cli(
        "collect",
        "--task",
        "arith:min_steps=2,max_steps=3",
        "--split",
        "test",
        "--backbone",
        "tiny",
        "--n",
        "4",
        "--snapshots",
        "4",
        "--steps",
        "24",
        "--gen-length",
        "32",
        "--prompt",
        "fewshot",
        "--limit",
        "3",
        "--out",
        str(out),
    )
    assert result.code == 0, result.err


@pytest.mark.slow
def test_diagnose_runs_every_control_on_the_demo_scorers(cli, tmp_path):
    collection = tmp_path / "collection"
    _collect(cli, collection)
    result = cli("diagnose", str(collection), "--width", "4", "--json")
    assert result.code == 0, result.err
    data = json.loads((collection / "controls" / "controls.json").read_text())
    scorers = set(data["scorers"])
    assert {"prm", "orm"} <= scorers
    # 3 problems × 4 trajectories × (the all-mask canvas and steps 6, 12, 18, T = 24)
    assert data["collection"]["problems"] == 3 and data["collection"]["states"] == 3 * 4 * 5
    prm = next(r for r in data["auc_by_mask"] if r["scorer"] == "prm")
    assert prm["final"]["n"] == 12 and len(prm["buckets"]) == c.BUCKETS
    assert data["slicing"] == "paper" and sum(b["n"] for b in prm["buckets"]) == 60
    assert prm["buckets"][9]["n"] >= 12 and prm["buckets"][0]["n"] >= 12  # canvas; decoded
    split = next(r for r in data["alternative"]["auc_by_mask"] if r["scorer"] == "prm")
    assert sum(b["n"] for b in split["buckets"]) == 36  # steps 6, 12 and 18
    assert not any(r["scorer"] == "orm" for r in data["auc_by_mask"])  # reads final states
    risks = [r for r in data["removal_risk"] if r["scorer"] == "prm"]
    assert {(r["state"], r["keep"]) for r in risks} == {(s, m) for s in c.STATES for m in (1, 2)}
    initial = next(r for r in risks if r["state"] == "initial")
    assert (initial["step"], initial["mask_ratio"], initial["groups"]) == (0, 1.0, 3)
    assert [r["scorer"] for r in data["suffix_ablation"]] == [
        name for name in data["scorers"] if name != "orm"
    ]
    if {"prm_causal", "prm_causal_last"} <= scorers:  # the demo ships its causal PRMs
        assert [(r["mean"], r["last"]) for r in data["readout"]] == [
            ("prm_causal", "prm_causal_last")
        ]
        assert {r["scorer"] for r in data["reversed_input"]} == {"prm_causal", "prm_causal_last"}
        reference = {r["scorer"]: r["reference"] for r in data["reversed_input"]}
        # the bidirectional PRM of the same settings is the mean-pooled causal PRM's reference;
        # no shipped bidirectional scorer reads the last token
        assert reference["prm_causal"]["scorer"] == "prm"
        assert reference["prm_causal_last"] is None
    assert {r["scorer"] for r in data["reranker"]} == scorers
    assert set(data["scorer_swap"]["accuracy"]) == scorers | {"random"}
    text = (collection / "controls" / "controls.md").read_text()
    assert text == markdown(data)
    for title in ("Removal risk", "Readout", "Suffix ablation", "Reversed-input", "rerankers"):
        assert title in text


def test_diagnose_refuses_a_collection_of_one_outcome_before_scoring(cli, tmp_path, monkeypatch):
    """Trajectories that all end wrong (four steps of four tokens) have no AUC: one line,
    before any scorer loads."""
    collection = tmp_path / "collection"
    argv = ["collect", "--task", "arith", "--backbone", "tiny", "--limit", "2", "--steps", "4"]
    argv += ["--gen-length", "4", "--prompt", "fewshot", "--n", "2", "--snapshots", "2"]
    assert cli(*argv, "--out", str(collection)).code == 0
    monkeypatch.setattr(Registry, "scorer", lambda *a, **k: pytest.fail("a scorer was built"))
    result = cli("diagnose", str(collection))
    assert_user_error(result, "ends wrong", "--limit")
    # a --width over the collection's n is said, not cut to n (the default 8 is)
    wide = cli("diagnose", str(collection), "--width", "3")
    assert_user_error(wide, "--width 3 is more than the 2 trajectories per problem")


def test_collect_samples_a_shipped_model_as_it_was_trained_and_refuses_what_it_cannot_hold(
    cli, tmp_path
):
    """`collect --backbone tiny` samples at the tiny model's own protocol (T = 24, 32 tokens,
    few-shot), as `run` does; a canvas or prompt beyond its 256 positions is one line before
    any forward (it wrote trajectories of empty text, exit status 0), and so is a snapshot
    count over T (it was cut to T without a word)."""
    out = tmp_path / "collection"
    argv = ["collect", "--task", "arith", "--split", "test", "--backbone", "tiny", "--limit", "1"]
    assert cli(*argv, "--n", "2", "--snapshots", "2", "--out", out).code == 0
    meta = json.loads((out / "collect.json").read_text())
    assert (meta["snapshot_steps"], meta["sampling"]["gen_length"]) == ([0, 12, 24], 32)
    assert meta["sampling"]["prompt_style"] == "fewshot"
    refused = tmp_path / "refused"
    long = cli(*argv, "--gen-length", "512", "--out", refused)
    assert_user_error(long, "--gen-length 512 does not fit backbone 'tiny'")
    shots = cli(*argv[:2], "gsm8k", *argv[3:], "--out", refused)
    assert_user_error(shots, "problem 'test-0'", "do not fit the backbone's 256 positions")
    many = cli(*argv, "--steps", "4", "--snapshots", "5", "--out", refused)
    assert_user_error(many, "--snapshots 5 is more than --steps 4")
    assert not list(refused.glob("*.safetensors"))


def test_diagnose_refuses_what_is_not_a_collection(cli, tmp_path):
    result = cli("diagnose", str(tmp_path))
    assert result.code == 2
    err = result.err.strip()
    assert "is not a collection" in err and len(err.splitlines()) == 1
