"""Unit tests of dllmbench.analysis.stats (bootstrap, pool diversity) and results.summarize."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import scipy.stats

from dllmbench.analysis.results import summarize
from dllmbench.analysis.stats import (
    Discordant,
    Interval,
    binomial_cdf_half,
    binomial_pmf,
    bootstrap_ci,
    entropy_bits,
    mcnemar_p,
    paired_difference,
    resample_indices,
    trinomial_difference,
    unique_answers,
)

# -- bootstrap_ci -------------------------------------------------------------------------------


def _continuous(n: int = 60, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n)


def test_bootstrap_value_is_the_mean_and_inside_the_interval():
    for seed in range(5):
        x = np.random.default_rng(seed).random(40)
        ci = bootstrap_ci(x, resamples=500, seed=seed)
        assert ci.value == pytest.approx(float(x.mean()), abs=1e-12)
        assert ci.low <= ci.value <= ci.high
        assert ci.low < ci.high


def test_bootstrap_accepts_lists_of_bools():
    ci = bootstrap_ci([True, False, True, True], resamples=200)
    assert ci.value == pytest.approx(0.75)
    assert 0.0 <= ci.low <= ci.high <= 1.0


def test_bootstrap_same_seed_same_interval():
    x = _continuous()
    assert bootstrap_ci(x, resamples=500, seed=3) == bootstrap_ci(x, resamples=500, seed=3)


def test_bootstrap_different_seed_different_bounds():
    x = _continuous()
    bounds = {
        (bootstrap_ci(x, resamples=500, seed=s).low, bootstrap_ci(x, resamples=500, seed=s).high)
        for s in range(4)
    }
    assert len(bounds) > 1


def test_bootstrap_constant_input_has_zero_width():
    ci = bootstrap_ci([0.7] * 25, resamples=300)
    assert ci.low == pytest.approx(0.7) and ci.high == pytest.approx(0.7)
    assert ci.value == pytest.approx(0.7)


def test_bootstrap_lower_level_is_narrower():
    x = _continuous(100)
    wide = bootstrap_ci(x, resamples=1000, level=0.95)
    narrow = bootstrap_ci(x, resamples=1000, level=0.5)
    assert narrow.high - narrow.low < wide.high - wide.low
    assert wide.low <= narrow.low <= narrow.high <= wide.high


def test_bootstrap_empty_input_is_refused():
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_ci([])


def test_bootstrap_agrees_with_scipy_percentile():
    x = (np.random.default_rng(7).random(300) < 0.6).astype(float)
    ours = bootstrap_ci(x, resamples=5000, level=0.95, seed=0)
    ref = scipy.stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=5000,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(123),
    ).confidence_interval
    assert ours.low == pytest.approx(ref.low, abs=0.01)
    assert ours.high == pytest.approx(ref.high, abs=0.01)


def test_interval_as_dict_rounds():
    d = Interval(1 / 3, 0.1234567891, 0.9).as_dict(digits=3)
    assert d == {"value": 0.333, "low": 0.123, "high": 0.9, "exact": False}
    d = Interval(0.5, 0.25, 0.75, True).as_dict()
    assert d == {"value": 0.5, "low": 0.25, "high": 0.75, "exact": True}
    d = Interval(0.5, 0.25, 0.75, False, 0.0123456789).as_dict(digits=4)
    assert d["mc_error"] == 0.0123


# -- exact intervals of 0/1 outcomes --------------------------------------------------------------


def _every_resample(values: np.ndarray) -> np.ndarray:
    """The mean of each of the n^n equally likely resamples of n values."""
    n = values.size
    grid = np.array(list(itertools.product(range(n), repeat=n)))
    return values[grid].mean(axis=1)


def _inverse_cdf(means: np.ndarray, q: float) -> float:
    """The q-quantile of equally likely means, by counting: the smallest mean whose share of
    means at or below it reaches q."""
    for value in np.unique(means):
        if (means <= value + 1e-12).mean() >= q - 1e-12:
            return float(value)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("ones", [0, 1, 3, 5, 6])
@pytest.mark.parametrize("level", [0.95, 0.8, 0.5])
def test_binary_interval_is_the_exact_bootstrap_law(ones, level):
    x = np.array([1.0] * ones + [0.0] * (6 - ones))
    means = _every_resample(x)
    ci = bootstrap_ci(x, level=level)
    tail = (1 - level) / 2
    assert ci.exact and ci.mc_error is None
    assert ci.value == pytest.approx(ones / 6)
    assert ci.low == pytest.approx(_inverse_cdf(means, tail))
    assert ci.high == pytest.approx(_inverse_cdf(means, 1 - tail))


@pytest.mark.parametrize(
    "pairs",
    [
        [(1, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0)],
        [(1, 0), (0, 0), (0, 0), (1, 1), (0, 0), (0, 0)],
        [(0, 1), (0, 1), (0, 1), (0, 1), (1, 0), (1, 1)],
        [(1, 1)] * 6,
    ],
)
@pytest.mark.parametrize("level", [0.95, 0.8])
def test_paired_interval_enumerates_the_trinomial(pairs, level):
    """Every one of the 6^6 resamples of six problems, counted: the paired interval's ends
    are the quantiles of that law, with no resampling noise."""
    a, b = (np.array(side, float) for side in zip(*pairs, strict=True))
    means = _every_resample(a - b)
    diff = paired_difference(a, b, level=level)
    tail = (1 - level) / 2
    assert diff.exact
    assert diff.low == pytest.approx(_inverse_cdf(means, tail))
    assert diff.high == pytest.approx(_inverse_cdf(means, 1 - tail))
    support, probs = trinomial_difference(diff.discordant)
    for value, p in zip(support, probs, strict=True):
        assert p == pytest.approx(np.isclose(means, value).mean(), abs=1e-12)


def test_paired_interval_of_thirty_problems_four_against_one():
    """4 problems solved only by a, 1 only by b, 25 ties: the exact upper end is 7/30 (a
    2,000-resample percentile bootstrap often says 8/30), and McNemar's p is 2·P(X ≤ 1) for
    X ~ Binomial(5, ½) = 12/32."""
    a = [1] * 4 + [0] + [1] * 10 + [0] * 15
    b = [0] * 4 + [1] + [1] * 10 + [0] * 15
    diff = paired_difference(a, b)
    assert diff.value == pytest.approx(3 / 30)
    assert diff.high == pytest.approx(7 / 30)
    assert diff.low == pytest.approx(-1 / 30)
    assert diff.discordant == Discordant(4, 1, 30)
    assert diff.p_value == pytest.approx(0.375)
    assert diff.p_value == pytest.approx(scipy.stats.binomtest(4, 5, 0.5).pvalue)
    entry = diff.as_dict()
    assert (entry["better"], entry["worse"], entry["mcnemar_p"]) == (4, 1, 0.375)


@pytest.mark.parametrize("better,worse", [(0, 0), (3, 0), (7, 7), (12, 30), (40, 1)])
def test_mcnemar_matches_scipy_binomtest(better, worse):
    p = mcnemar_p(Discordant(better, worse, 100))
    expected = 1.0 if better + worse == 0 else scipy.stats.binomtest(better, better + worse).pvalue
    assert p == pytest.approx(expected)


def test_the_exact_mcnemar_sum_is_scipys_binomial_cdf():
    """P(X <= k) for X ~ Binomial(m, 1/2), summed in whole numbers, equals scipy.special's
    `bdtr` to 1e-12 relative for every k at small m and across large m, and keeps a tail as
    small as 2^-1000 exactly."""
    from scipy.special import bdtr

    for m in [*range(1, 41), 200, 1319, 3000]:
        for k in sorted({*range(min(m, 40) + 1), m // 3, m // 2, m}):
            assert binomial_cdf_half(k, m) == pytest.approx(bdtr(k, m, 0.5), rel=1e-12), (k, m)
    assert binomial_cdf_half(0, 1000) == 2.0**-1000 > 0


@pytest.mark.parametrize("n", [1, 7, 100, 1319])
def test_the_binomial_law_is_scipys(n):
    """The intervals' binomial law, computed without scipy.stats, equals scipy.stats' to 1e-9
    relative wherever it is above 1e-300, for every share of ones, p = 0 and p = 1 included."""
    k = np.arange(n + 1)
    for c in range(n + 1):
        want = scipy.stats.binom.pmf(k, n, c / n)
        got = binomial_pmf(k, n, c / n)
        assert got.sum() == pytest.approx(1.0)
        assert np.allclose(got, want, rtol=1e-9, atol=1e-300), (n, c)


def test_trinomial_law_of_many_problems_agrees_with_resampling():
    """At n = 1319 (GSM8K's test set) the exact law sums to one, has the right mean and
    variance, and a 20,000-resample bootstrap lands within its Monte-Carlo error."""
    d = Discordant(300, 250, 1319)
    support, probs = trinomial_difference(d)
    assert probs.sum() == pytest.approx(1.0)
    mean = (d.better - d.worse) / d.problems
    second = (d.better + d.worse) / d.problems
    assert (support * probs).sum() == pytest.approx(mean)
    assert ((support - mean) ** 2 * probs).sum() == pytest.approx((second - mean**2) / d.problems)
    a = np.array([1] * 300 + [0] * 250 + [1] * 400 + [0] * 369, float)
    b = np.array([0] * 300 + [1] * 250 + [1] * 400 + [0] * 369, float)
    exact = paired_difference(a, b)
    resampled = bootstrap_ci(a - b + 1e-9, resamples=20_000)  # not 0/1: resampled
    assert not resampled.exact and resampled.mc_error > 0
    for end in ("low", "high"):
        gap = abs(getattr(exact, end) + 1e-9 - getattr(resampled, end))
        assert gap <= 3 * resampled.mc_error + 1 / 1319


def test_resampled_ends_are_means_a_resample_gave():
    x = np.random.default_rng(11).random(30)
    ci = bootstrap_ci(x, resamples=400, seed=2)
    means = x[resample_indices(30, 400, 2)].mean(axis=1)
    assert ci.low in means and ci.high in means
    assert ci.mc_error > 0
    assert bootstrap_ci(x, resamples=20_000, seed=2).mc_error < ci.mc_error


# -- paired_difference --------------------------------------------------------------------------


def test_paired_difference_value_is_mean_of_differences():
    rng = np.random.default_rng(1)
    a, b = rng.random(50), rng.random(50)
    diff = paired_difference(a, b, resamples=500)
    assert diff.value == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert diff.low <= diff.value <= diff.high


def test_paired_difference_identical_inputs_is_zero():
    a = np.random.default_rng(2).random(30)
    diff = paired_difference(a, a.copy(), resamples=500)
    assert (diff.value, diff.low, diff.high) == (0.0, 0.0, 0.0)


def test_paired_difference_dominating_vector_excludes_zero():
    rng = np.random.default_rng(3)
    b = rng.random(40)
    a = b + rng.uniform(0.1, 1.0, size=40)
    diff = paired_difference(a, b, resamples=1000)
    assert diff.low > 0
    assert paired_difference(b, a, resamples=1000).high < 0


def test_paired_difference_is_paired_not_independent():
    # a and b vary a lot between problems but a − b is almost constant: a paired interval is
    # narrow, far narrower than the spread of either vector's own interval.
    rng = np.random.default_rng(4)
    b = rng.normal(0, 5, size=80)
    a = b + 1.0 + rng.normal(0, 0.01, size=80)
    diff = paired_difference(a, b, resamples=1000)
    alone = bootstrap_ci(a, resamples=1000)
    assert diff.high - diff.low < 0.1 * (alone.high - alone.low)
    assert diff.low > 0.9 and diff.high < 1.1


def test_paired_difference_shape_mismatch_raises():
    with pytest.raises(ValueError):
        paired_difference([1.0, 0.0, 1.0], [1.0, 0.0])


# -- resample_indices ---------------------------------------------------------------------------


def test_resample_indices_shape_range_and_reproducible():
    idx = resample_indices(17, 300, seed=5)
    assert idx.shape == (300, 17)
    assert idx.min() >= 0 and idx.max() < 17
    assert np.issubdtype(idx.dtype, np.integer)
    assert set(np.unique(idx)) == set(range(17))  # 5100 draws reach every index
    np.testing.assert_array_equal(idx, resample_indices(17, 300, seed=5))
    assert not np.array_equal(idx, resample_indices(17, 300, seed=6))


# -- entropy_bits and unique_answers ------------------------------------------------------------


def test_entropy_uniform_over_four_is_two_bits():
    assert entropy_bits(["a", "b", "c", "d"]) == pytest.approx(2.0)
    assert entropy_bits([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(2.0)


def test_entropy_excludes_invalid_answers():
    assert entropy_bits(["a", None, "b", None, "c", "d", None]) == pytest.approx(2.0)
    assert entropy_bits(["a", "a", None, None, None]) == 0.0


def test_entropy_known_skewed_value():
    # p = (1/2, 1/4, 1/4): 1.5 bits
    assert entropy_bits(["x", "x", "y", "z"]) == pytest.approx(1.5)


def test_entropy_single_answer_and_empty_are_zero():
    assert entropy_bits(["a", "a", "a"]) == 0.0
    assert math.copysign(1.0, entropy_bits(["a"])) == 1.0  # not −0.0
    assert entropy_bits([None, None]) == 0.0
    assert entropy_bits([]) == 0.0


def test_unique_answers_counts_valid_distinct_keys():
    assert unique_answers(["a", "b", "a", None, "c", None]) == 3
    assert unique_answers([None, None]) == 0
    assert unique_answers([]) == 0
    assert unique_answers([3, 3, 3]) == 1


# -- results.summarize --------------------------------------------------------------------------


def _cand(key: str | None, correct: bool) -> dict:
    return {"key": key, "valid": key is not None, "correct": correct}


def _rec(problem: str, method: str, correct: bool, candidates: list[dict], passes: int) -> dict:
    return {
        "problem": problem,
        "method": method,
        "correct": correct,
        "ceiling": False,
        "candidates": candidates,
        "ledger": {"total_passes": passes},
    }


PROBLEMS = ["p0", "p1", "p2", "p3"]
METHODS = [
    {
        "id": "Vanilla",
        "spec": "independent:n=1+first",
        "ceiling": False,
        "cost": {"denoise": 12},
        "family": "vanilla",
    },
    {
        "id": "Maj",
        "spec": "independent:n=3+majority",
        "ceiling": False,
        "cost": {"denoise": 36},
        "family": "vote",
    },
]


def _records() -> list[dict]:
    vanilla = [
        _rec("p0", "Vanilla", True, [_cand("1", True)], 12),
        _rec("p1", "Vanilla", False, [_cand("2", False)], 12),
        _rec("p2", "Vanilla", False, [_cand(None, False)], 12),
        # no Vanilla record on p3: the difference is paired over p0..p2 only
    ]
    maj = [
        # keys a,a,b: 2 unique, H = 0.918 bits; oracle yes
        _rec("p0", "Maj", True, [_cand("a", True), _cand("a", True), _cand("b", False)], 36),
        # keys c,d,e: 3 unique, H = log2 3; oracle yes
        _rec("p1", "Maj", True, [_cand("c", False), _cand("d", True), _cand("e", False)], 36),
        # keys f,None,None: 1 unique, H = 0; oracle no
        _rec("p2", "Maj", False, [_cand("f", False), _cand(None, False), _cand(None, False)], 36),
        # keys g,g,g: 1 unique, H = 0; oracle no
        _rec("p3", "Maj", False, [_cand("g", False), _cand("g", False), _cand("g", False)], 36),
        # a problem outside the run is ignored
        _rec("zz", "Maj", True, [_cand("a", True), _cand("a", True), _cand("a", True)], 36),
    ]
    return vanilla + maj


def _summary(records: list[dict], **kw) -> dict:
    return summarize(records, METHODS, PROBLEMS, budget=100, resamples=500, **kw)


def test_summarize_accuracy_and_costs():
    out = _summary(_records())
    assert out["reference"] == "Vanilla"
    vanilla, maj = out["methods"]
    assert vanilla["id"] == "Vanilla" and maj["id"] == "Maj"
    assert vanilla["problems"] == 3 and maj["problems"] == 4
    assert vanilla["accuracy"]["value"] == pytest.approx(1 / 3, abs=1e-6)
    assert maj["accuracy"]["value"] == pytest.approx(0.5)
    assert maj["accuracy"]["low"] <= 0.5 <= maj["accuracy"]["high"]
    assert maj["passes_per_problem"] == 36.0
    assert maj["planned_passes"] == 36 and maj["share_of_budget"] == pytest.approx(0.36)
    assert maj["family"] == "vote"


def test_summarize_pool_diagnostics():
    maj = _summary(_records())["methods"][1]
    pool = maj["pool"]
    assert pool["size"] == 3.0
    assert pool["oracle"]["value"] == pytest.approx(0.5)
    assert pool["unique_answers"] == pytest.approx((2 + 3 + 1 + 1) / 4)
    h_aab = -(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3)
    assert pool["entropy_bits"] == pytest.approx((h_aab + math.log2(3)) / 4, abs=1e-6)


def test_summarize_method_without_pool_has_no_pool_key():
    vanilla = _summary(_records())["methods"][0]
    assert "pool" not in vanilla
    assert "delta_vs_reference" not in vanilla  # the reference is not compared with itself


def test_summarize_delta_is_paired_over_common_problems():
    maj = _summary(_records())["methods"][1]
    delta = maj["delta_vs_reference"]
    assert delta["problems"] == 3
    # on p0..p2: Maj (1, 1, 0) vs Vanilla (1, 0, 0)
    assert delta["value"] == pytest.approx(1 / 3, abs=1e-6)
    expected = paired_difference([1, 1, 0], [1, 0, 0], resamples=500).as_dict()
    assert {k: v for k, v in delta.items() if k != "problems"} == expected
    assert (delta["better"], delta["worse"], delta["mcnemar_p"]) == (1, 0, 1.0)


def test_summarize_explicit_reference():
    out = _summary(_records(), reference="Maj")
    assert out["reference"] == "Maj"
    vanilla, maj = out["methods"]
    assert "delta_vs_reference" not in maj
    assert vanilla["delta_vs_reference"]["value"] == pytest.approx(-1 / 3, abs=1e-6)


def test_summarize_does_not_depend_on_record_order():
    records = _records()
    base = _summary(records)
    for seed in range(3):
        shuffled = list(records)
        random.Random(seed).shuffle(shuffled)
        assert _summary(shuffled) == base
    assert _summary(list(reversed(records))) == base


def test_a_tiny_mcnemar_p_keeps_its_significant_digits():
    a = [1] * 27 + [0] * 3
    b = [0] * 27 + [0] * 3
    entry = paired_difference(a, b).as_dict()
    assert entry["mcnemar_p"] == pytest.approx(2 / 2**27, rel=1e-5)
    assert entry["mcnemar_p"] > 0
