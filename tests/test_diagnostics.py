"""Diagnostics on constructed cases whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dllmbench.analysis.diagnostics import (
    PruningEvent,
    ScoredState,
    SMCCheckpoint,
    answer_entropy_bits,
    auc_by_mask_bucket,
    checkpoint_stats,
    mask_bucket,
    mask_buckets,
    pool_diversity,
    removal_risk,
    scorer_swap,
    smc_diagnostics,
    weighted_auc,
    within_problem_kendall,
)
from dllmbench.analysis.pooled import PooledCandidate
from dllmbench.analysis.stats import resample_indices


def test_mask_buckets_edges():
    cases = {0.0: 0, 0.0999: 0, 0.1: 1, 0.3: 3, 0.7: 7, 0.8999: 8, 0.9: 9, 0.95: 9, 1.0: 9}
    assert {r: mask_bucket(r) for r in cases} == cases
    assert [mask_bucket(i / 10) for i in range(10)] == list(range(10))
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError):
            mask_bucket(bad)


def test_mask_buckets_of_ratios_from_integer_counts_are_exact():
    """Every masked / generated fraction, generated up to 1024, in float64: its bucket is
    ⌊10·masked / generated⌋ (9 for 1), compared in integers."""
    generated = np.repeat(np.arange(1, 1025), np.arange(2, 1026))
    masked = np.concatenate([np.arange(g + 1) for g in range(1, 1025)])
    expected = np.minimum(10 * masked // generated, 9)
    assert np.array_equal(mask_buckets(masked / generated), expected)
    # the same fractions in float32 miss some edges: 7/10 lies below 0.7
    assert mask_buckets([np.float32(7) / np.float32(10)])[0] == 6


def test_weighted_auc_equals_sklearn():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 80).astype(float)  # many ties
    labels = rng.random(80) < 0.4
    weights = rng.integers(0, 4, size=(5, 80)).astype(float)
    got = weighted_auc(scores, labels, np.vstack([np.ones(80), weights]))
    expected = [roc_auc_score(labels, scores)]
    expected += [roc_auc_score(labels, scores, sample_weight=w) for w in weights]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert np.isnan(weighted_auc(scores, np.ones(80, bool), np.ones(80)))[0]


def _separable_rows(reverse: bool = False) -> list[ScoredState]:
    """Six problems; buckets 0..7 hold both labels, bucket 8 only positives, 9 nothing."""
    rng = np.random.default_rng(1)
    rows = []
    for pid in range(6):
        for i in range(40):
            bucket = i % 9
            label = bool(i % 2) if bucket < 8 else True
            score = (1.0 if label else -1.0) + rng.uniform(-0.9, 0.9)
            ratio = (bucket + rng.uniform(0, 0.999)) / 10
            rows.append(ScoredState(f"p{pid}", -score if reverse else score, label, ratio))
    return rows


@pytest.mark.parametrize(("reverse", "auc"), [(False, 1.0), (True, 0.0)])
def test_auc_by_mask_bucket_separating_scores(reverse, auc):
    rows = _separable_rows(reverse)
    buckets = auc_by_mask_bucket(rows, resamples=500, seed=3)
    assert [(b.low, b.high) for b in buckets] == [(i / 10, (i + 1) / 10) for i in range(10)]
    for b in buckets[:8]:
        assert b.auc == auc
        assert (b.interval.low, b.interval.high) == (auc, auc)
    assert buckets[8].auc is None and buckets[8].interval is None
    assert buckets[8].n == buckets[8].positives > 0
    assert (buckets[9].n, buckets[9].positives, buckets[9].auc) == (0, 0, None)
    assert sum(b.n for b in buckets) == len(rows)


def test_auc_bootstrap_resamples_problems():
    rng = np.random.default_rng(5)
    rows = [
        ScoredState(f"q{int(rng.integers(0, 12))}", float(rng.normal()), bool(rng.random() < 0.5))
        for _ in range(150)
    ]
    resamples, seed = 300, 9
    (bucket, *_) = auc_by_mask_bucket(rows, resamples=resamples, seed=seed)
    problems = list(dict.fromkeys(r.problem_id for r in rows))
    draws = []
    for idx in resample_indices(len(problems), resamples, seed):
        chosen = [r for i in idx for r in rows if r.problem_id == problems[i]]
        labels = [r.label for r in chosen]
        if 0 < sum(labels) < len(labels):
            draws.append(roc_auc_score(labels, [r.score for r in chosen]))
    low, high = np.quantile(draws, [0.025, 0.975], method="inverted_cdf")
    assert bucket.interval.low == pytest.approx(low, abs=1e-12)
    assert bucket.interval.high == pytest.approx(high, abs=1e-12)
    assert bucket.interval.low <= bucket.auc <= bucket.interval.high
    assert auc_by_mask_bucket(rows, resamples=resamples, seed=seed)[0] == bucket


def _kendall_rows(pid, scores, labels):
    return [ScoredState(pid, s, y) for s, y in zip(scores, labels, strict=True)]


def test_within_problem_kendall():
    rows = _kendall_rows("ordered", [0, 0, 1, 1, 1], [False, False, True, True, True])
    rows += _kendall_rows("reversed", [2, 1, 1], [False, True, True])
    rows += _kendall_rows("one_class", [0, 1, 2], [True, True, True])
    rows += _kendall_rows("flat", [3, 3, 3, 3], [True, False, True, False])
    # distinct scores, perfectly separated: τ-b = sqrt(pos·neg / C(n, 2)) = sqrt(2·2/6)
    rows += _kendall_rows("distinct", [0.1, 0.2, 0.3, 0.4], [False, False, True, True])
    summary = within_problem_kendall(rows)
    assert summary.problems == 4 and summary.undefined == 1
    assert summary.per_problem["ordered"] == pytest.approx(1.0)
    assert summary.per_problem["reversed"] == pytest.approx(-1.0)
    assert summary.per_problem["distinct"] == pytest.approx(math.sqrt(4 / 6))
    assert math.isnan(summary.per_problem["flat"]) and "one_class" not in summary.per_problem
    assert summary.mean == pytest.approx(math.sqrt(4 / 6) / 3)
    assert within_problem_kendall(_kendall_rows("x", [1, 2], [True, True])).mean is None


def _pool(keys, correct=None):
    correct = correct or [False] * len(keys)
    return [PooledCandidate(k, c) for k, c in zip(keys, correct, strict=True)]


def test_pool_diversity():
    four = _pool(["a", "b", "c", "d", "a", "b", "c", "d", None], [True] + [False] * 8)
    one = _pool(["x", "x", None])
    none_valid = _pool([None, None])
    summary = pool_diversity([four, one, none_valid])
    first, second, third = summary.per_problem
    assert (first.n, first.valid, first.unique_valid, first.oracle) == (9, 8, 4, 1.0)
    assert first.entropy_bits == pytest.approx(2.0, abs=1e-15)
    assert (second.unique_valid, second.entropy_bits, second.oracle) == (1, 0.0, 0.0)
    assert (third.valid, third.unique_valid, third.entropy_bits) == (0, 0, 0.0)
    assert summary.oracle == pytest.approx(1 / 3)
    assert summary.unique_valid == pytest.approx(5 / 3)
    assert summary.entropy_bits == pytest.approx(2 / 3)
    # p = (1/2, 1/4, 1/4): 1.5 bits
    assert answer_entropy_bits(["a", "a", "b", "c"]) == pytest.approx(1.5)


def _event(kept, removed, good):
    lineages = set(kept) | set(removed)
    return PruningEvent(frozenset(kept), frozenset(removed), {x: x in good for x in lineages})


def test_removal_risk():
    events = [
        _event({"a"}, {"b"}, {"a"}),  # at risk, a correct lineage kept
        _event({"a"}, {"b", "c"}, {"b", "c"}),  # every correct lineage removed
        _event({"a"}, {"b"}, set()),  # nothing could reach a correct answer: not at risk
        _event({"a"}, {"b"}, {"a", "b"}),  # one of two kept
        _event({(0, 1)}, {(0, 2), (1,)}, {(1,)}),  # tuple lineages, the only correct removed
    ]
    risk = removal_risk(events)
    assert (risk.events, risk.at_risk, risk.lost) == (5, 4, 2)
    assert risk.rate == pytest.approx(0.5)
    assert removal_risk([]).rate is None
    with pytest.raises(ValueError):
        removal_risk([PruningEvent(frozenset("a"), frozenset("a"), {"a": True})])
    with pytest.raises(ValueError):
        removal_risk([PruningEvent(frozenset("a"), frozenset("b"), {"a": True})])


def test_smc_checkpoint_stats():
    uniform = checkpoint_stats(SMCCheckpoint([1 / 8] * 8, False, 0.5))
    assert uniform.ess_before == pytest.approx(8) and uniform.ess_after == pytest.approx(8)
    assert (uniform.distinct_ancestors, uniform.ancestor_perplexity) == (8, pytest.approx(8))
    onehot = checkpoint_stats(SMCCheckpoint([0, 0, 1, 0], True, 1.0, [2, 2, 2, 2]))
    assert onehot.ess_before == pytest.approx(1) and onehot.ess_after == 4.0
    assert (onehot.distinct_ancestors, onehot.ancestor_perplexity) == (1, pytest.approx(1))
    half = checkpoint_stats(SMCCheckpoint([2, 2, 0, 0], True, 2.0, [0, 0, 0, 1]))
    assert half.ess_before == pytest.approx(2)  # unnormalized weights are normalized
    assert half.distinct_ancestors == 2
    assert half.ancestor_perplexity == pytest.approx(
        math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    )
    with pytest.raises(ValueError):
        checkpoint_stats(SMCCheckpoint([0.5, -0.5, 1.0], False, 1.0))


def test_smc_summary():
    checkpoints = [
        SMCCheckpoint([0.25] * 4, False, 0.5),
        SMCCheckpoint([0, 0, 1, 0], True, 1.0, [2, 2, 2, 2]),
        SMCCheckpoint([0.5, 0.5, 0, 0], True, 2.5, [0, 1, 0, 1]),
    ]
    summary = smc_diagnostics(checkpoints)
    assert summary.mean_ess_before == pytest.approx((4 + 1 + 2) / 3)
    assert summary.mean_ess_after == pytest.approx((4 + 4 + 4) / 3)
    assert summary.resample_rate == pytest.approx(2 / 3)
    assert (summary.beta_min, summary.beta_max) == (0.5, 2.5)
    assert summary.beta_mean == pytest.approx(4 / 3)
    assert summary.mean_distinct_ancestors == pytest.approx(1.5)
    assert summary.mean_ancestor_perplexity == pytest.approx(1.5)
    assert smc_diagnostics(checkpoints[:1]).mean_distinct_ancestors is None


def test_scorer_swap():
    def cand(correct, orm, prm):
        return PooledCandidate("k", correct, {"orm": orm, "prm": prm})

    pools = [
        # orm right; prm tied everywhere → the earliest, which is wrong
        [cand(False, 0.1, 0.5), cand(True, 0.9, 0.5), cand(False, 0.2, 0.5)],
        [cand(True, 0.7, 0.0), cand(False, 0.7, 0.3), cand(False, 0.1, 0.1), cand(True, 0.2, 0.2)],
        [cand(False, 0.3, 1.0), cand(True, 0.4, 0.0)],
    ]
    swap = scorer_swap(pools, ["orm", "prm"], resamples=1_000, seed=4)
    assert swap.per_problem["orm"] == (1.0, 1.0, 1.0)
    assert swap.per_problem["prm"] == (0.0, 0.0, 0.0)
    assert swap.per_problem["random"] == pytest.approx((1 / 3, 1 / 2, 1 / 2))
    assert set(swap.differences) == {("orm", "prm"), ("orm", "random"), ("prm", "random")}
    d = swap.differences[("orm", "prm")]
    assert (d.value, d.low, d.high) == (1.0, 1.0, 1.0)
    d = swap.differences[("prm", "random")]
    assert d.value == pytest.approx(-4 / 9) and d.low <= d.value <= d.high
    assert swap.accuracy["random"].value == pytest.approx(4 / 9)
    assert scorer_swap(pools, ["orm", "prm"], resamples=1_000, seed=4) == swap


def test_kendall_reports_the_median_the_paper_headlines_beside_the_mean():
    """By hand: a problem ranked backwards (τ = −1) and two ranked slightly right, each with
    one correct of four where one wrong candidate outscores it: C = 2, D = 1, τ-b =
    (2 − 1) / sqrt(6 · 3). The median is positive, the mean negative."""
    rows = [ScoredState("a", 0.0, True, 0.0), ScoredState("a", 1.0, False, 0.0)]
    for pid in ("b", "c"):
        for score, label in ((2.0, True), (3.0, False), (1.0, False), (0.0, False)):
            rows.append(ScoredState(pid, score, label, 0.0))
    tau = within_problem_kendall(rows)
    small = 1 / math.sqrt(18)
    assert tau.median == pytest.approx(small)
    assert tau.mean == pytest.approx((2 * small - 1) / 3)
    assert tau.median > 0 > tau.mean and tau.problems == 3 and tau.undefined == 0
