"""Pooled estimators against brute force over every k-subset of small pools."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from scipy.special import expit

from dllmbench.analysis.pooled import (
    PooledCandidate,
    bootstrap_interval,
    curve_difference,
    curve_intervals,
    majority_by_counts,
    pooled_curves,
    vote_index,
)

N = 8
Pool = list[PooledCandidate]
Selector = Callable[[Sequence[PooledCandidate]], float]


def _cand(key, correct, orm, prm, weight=None) -> PooledCandidate:
    return PooledCandidate(key, bool(correct), {"orm": float(orm), "prm": float(prm)}, weight)


def _random_pool(rng: np.random.Generator, *, key_correct: bool) -> Pool:
    """Keys from a few answers (some invalid), integer scores (many ties), random weights."""
    pool = []
    for _ in range(N):
        key = None if rng.random() < 0.2 else int(rng.integers(0, 3))
        correct = key == 0 if key_correct else key is not None and rng.random() < 0.5
        orm, prm = rng.integers(0, 3), rng.integers(-1, 2)
        pool.append(_cand(key, correct, orm, prm, float(rng.choice([0.25, 0.5, 1.0]))))
    return pool


def _hand_pools() -> dict[str, Pool]:
    keys = ["a", "b", "a", None, "b", "c", "a", "b"]
    return {
        "all_correct": [_cand(k, True, 0, i % 2, 1.0) for i, k in enumerate("aabbccdd")],
        "none_correct": [_cand(k, False, i % 3, 0, 0.5) for i, k in enumerate(keys)],
        "all_invalid": [_cand(None, False, i, -i, 1.0) for i in range(N)],
        "all_tied_scores": [_cand(k, k == "b", 1, 1, 1.0) for k in keys],
        "one_answer": [_cand("x", i % 3 == 0, -i, i % 2, 1.0) for i in range(N)],
        "all_distinct": [_cand(i, i in (2, 5), i % 4, 0, 1.0 + i) for i in range(N)],
        # 0.1 + 0.2 > 0.3 in floats, so "a" beats the earlier "b" on weight; 0.15 + 0.15 == 0.3
        "float_ties": [
            _cand(k, k == "a", 0, 0, w)
            for k, w in zip("bbaaccdd", [0.3, 0.0, 0.1, 0.2, 0.15, 0.15, 0.3, 0.0], strict=True)
        ],
    }


def _pools() -> dict[str, Pool]:
    rng = np.random.default_rng(20240613)
    pools = {f"random{i}": _random_pool(rng, key_correct=i % 2 == 0) for i in range(6)}
    return pools | _hand_pools()


POOLS = _pools()


def _ref_vote(subset: Sequence[PooledCandidate], weights: Sequence[float]) -> float:
    totals: dict = {}
    first: dict = {}
    for i, (cand, w) in enumerate(zip(subset, weights, strict=True)):
        if cand.key is not None:
            totals[cand.key] = totals.get(cand.key, 0.0) + float(w)
            first.setdefault(cand.key, i)
    if not totals:
        return 0.0
    best = max(totals, key=lambda key: (totals[key], -first[key]))
    return float(subset[first[best]].correct)


def _selectors() -> dict[str, Selector]:
    def argmax(name: str) -> Selector:
        return lambda s: float(s[int(np.argmax([c.scores[name] for c in s]))].correct)

    def weighted(name: str) -> Selector:
        return lambda s: _ref_vote(s, list(expit(np.array([c.scores[name] for c in s]))))

    return {
        "oracle": lambda s: float(any(c.correct for c in s)),
        "random": lambda s: float(np.mean([c.correct for c in s])),
        "argmax:orm": argmax("orm"),
        "argmax:prm": argmax("prm"),
        "majority": lambda s: _ref_vote(s, [1.0] * len(s)),
        "weighted_majority:orm": weighted("orm"),
        "weighted_majority:prm": weighted("prm"),
        "weighted_majority:weight": lambda s: _ref_vote(s, [c.weight for c in s]),
    }


SELECTORS = _selectors()


def _brute(pool: Pool, k: int, select: Selector) -> float:
    values = [select([pool[i] for i in idx]) for idx in itertools.combinations(range(len(pool)), k)]
    return float(np.mean(values))


BRUTE = {
    name: {s: [_brute(pool, k, f) for k in range(1, N + 1)] for s, f in SELECTORS.items()}
    for name, pool in POOLS.items()
}


def _curves(**kwargs) -> dict:
    return pooled_curves(list(POOLS.values()), **kwargs)


def test_selector_names():
    assert set(_curves()) == set(SELECTORS)
    without_weight = [[PooledCandidate(c.key, c.correct, c.scores) for c in POOLS["random0"]]]
    assert "weighted_majority:weight" not in pooled_curves(without_weight)
    assert set(pooled_curves(without_weight, scorers=["orm"])) == {
        "oracle",
        "random",
        "argmax:orm",
        "majority",
        "weighted_majority:orm",
    }


def test_every_estimator_is_exact_and_matches_brute_force():
    curves = _curves()
    for selector, points in curves.items():
        assert [p.k for p in points] == list(range(1, N + 1))
        for j, point in enumerate(points):
            assert point.exact and point.stderr == 0.0
            expected = [BRUTE[name][selector][j] for name in POOLS]
            np.testing.assert_allclose(point.per_problem, expected, rtol=0, atol=1e-12)
            assert point.mean == pytest.approx(np.mean(expected), abs=1e-12)


@pytest.mark.parametrize("name", list(POOLS))
def test_majority_by_counts_matches_brute_force(name):
    pool = POOLS[name]
    keys, correct = [c.key for c in pool], [c.correct for c in pool]
    for k in range(1, N + 1):
        value = majority_by_counts(keys, correct, k)
        assert value == pytest.approx(BRUTE[name]["majority"][k - 1], abs=1e-12)


def test_majority_by_counts_on_a_larger_pool_and_its_limit():
    rng = np.random.default_rng(7)
    keys = [None if rng.random() < 0.15 else int(rng.integers(0, 3)) for _ in range(13)]
    correct = [key == 1 for key in keys]
    pool = [PooledCandidate(key, ok) for key, ok in zip(keys, correct, strict=True)]
    for k in (1, 4, 7, 12, 13):
        expected = _brute(pool, k, SELECTORS["majority"])
        assert majority_by_counts(keys, correct, k) == pytest.approx(expected, abs=1e-12)
    assert majority_by_counts(keys, correct, 6, limit=3) is None


def test_monte_carlo_paths_within_three_standard_errors():
    curves = _curves(exact_limit=1, count_limit=0, samples=10_000, seed=3)
    sampled = 0
    for selector in ("majority", "weighted_majority:orm", "weighted_majority:weight"):
        for j, point in enumerate(curves[selector][:-1]):
            assert not point.exact
            expected = [BRUTE[name][selector][j] for name in POOLS]
            # the mean over problems at 3 standard errors; each problem at 4 (many comparisons)
            assert abs(point.mean - np.mean(expected)) <= 3 * point.stderr + 1e-12
            for value, se, exp in zip(
                point.per_problem, point.per_problem_stderr, expected, strict=True
            ):
                assert abs(value - exp) <= 4 * se + 1e-12
                sampled += se > 0
    assert sampled > 100
    for selector in ("oracle", "random", "argmax:orm"):
        assert all(p.exact for p in curves[selector])


def test_majority_by_counts_keeps_majority_exact_beyond_the_subset_limit():
    curves = _curves(exact_limit=1)
    assert all(p.exact for p in curves["majority"])
    assert not all(p.exact for p in curves["weighted_majority:orm"])
    for j, point in enumerate(curves["majority"]):
        expected = [BRUTE[name]["majority"][j] for name in POOLS]
        np.testing.assert_allclose(point.per_problem, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("limits", [{}, {"exact_limit": 1, "count_limit": 0}])
def test_k_equals_n_is_the_selector_on_the_whole_pool(limits):
    curves = _curves(**limits)
    for selector, points in curves.items():
        last = points[-1]
        assert last.k == N and last.exact and last.stderr == 0.0
        whole = [SELECTORS[selector](pool) for pool in POOLS.values()]
        assert list(last.per_problem) == pytest.approx(whole, abs=1e-12)
        if selector not in ("random", "oracle", "argmax:orm", "argmax:prm"):
            assert list(last.per_problem) == whole


def test_monte_carlo_is_keyed_by_seed():
    first = _curves(exact_limit=1, count_limit=0, samples=2_000, seed=5)
    again = _curves(exact_limit=1, count_limit=0, samples=2_000, seed=5)
    other = _curves(exact_limit=1, count_limit=0, samples=2_000, seed=6)
    assert first == again
    assert first["majority"] != other["majority"]


def test_the_selectors_and_the_estimators_share_one_vote():
    from dllmbench.core import voting
    from dllmbench.plugins.selectors import voting as selectors

    assert vote_index is voting.vote
    assert selectors.vote_keys is voting.vote

    class _C:
        def __init__(self, key):
            self.answer_key = key

    rng = np.random.default_rng(11)
    for _ in range(200):
        keys = [None if rng.random() < 0.2 else int(rng.integers(0, 3)) for _ in range(6)]
        weights = list(rng.choice([0.1, 0.2, 0.3, 1.0], size=6))
        assert vote_index(keys, weights) == selectors.vote([_C(k) for k in keys], weights)
    assert voting.vote(["a", "b", "b", None], [1, 1, 1, 5]) == 1
    assert voting.vote(["a", "b"], [1, 1]) == 0  # a tie goes to the answer seen first
    assert voting.vote([None, None], [1, 1]) is None


def test_k_out_of_range_is_refused():
    with pytest.raises(ValueError):
        pooled_curves([POOLS["random0"]], ks=[0])
    with pytest.raises(ValueError):
        pooled_curves([POOLS["random0"], POOLS["random1"][:5]], ks=[6])
    with pytest.raises(ValueError):
        pooled_curves([])


def test_bootstrap_intervals():
    curves = _curves()
    points = curves["majority"]
    intervals = curve_intervals(points, resamples=2_000, seed=1)
    for point, interval in zip(points, intervals, strict=True):
        assert interval.value == pytest.approx(point.mean, abs=1e-15)
        assert interval.low <= point.mean <= interval.high
    assert intervals == curve_intervals(points, resamples=2_000, seed=1)
    assert intervals != curve_intervals(points, resamples=2_000, seed=2)
    spread = [i.high - i.low for i in intervals]
    assert max(spread) > 0


def test_paired_difference_of_a_curve_with_itself_is_zero():
    curves = _curves()
    for points in curves.values():
        for diff in curve_difference(points, points, resamples=1_000):
            assert (diff.value, diff.low, diff.high) == (0.0, 0.0, 0.0)


def test_paired_difference_is_paired():
    # b = a − 0.1 on every problem: the paired interval is exactly the shift
    a = np.linspace(0.0, 1.0, 40)
    diff = curve_difference(
        [_point_of(a)],
        [_point_of(a - 0.1)],
        resamples=1_000,
    )[0]
    assert diff.value == pytest.approx(0.1) and diff.low == pytest.approx(0.1)
    assert diff.high == pytest.approx(0.1)
    unpaired = bootstrap_interval(a, resamples=1_000)
    assert unpaired.high - unpaired.low > 0.1


def _point_of(values: np.ndarray):
    from dllmbench.analysis.pooled import PooledPoint

    n = len(values)
    return PooledPoint("x", 1, float(np.mean(values)), tuple(values), (0.0,) * n, True, 0.0)


def test_closed_forms_on_a_known_pool():
    # n = 4, correct at positions 1 and 3; orm prefers position 3, ties 0 and 1
    pool = [_cand("a", False, 1, 0), _cand("b", True, 1, 0), _cand("c", False, 0, 0)]
    pool.append(_cand("b", True, 2, 0))
    curves = pooled_curves([pool])
    assert curves["oracle"][1].mean == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))
    assert [p.mean for p in curves["random"]] == [0.5] * 4
    # k = 1: 1/2; k = 2: position 3 present (3/6) or {0,1} → 0 or {1,2} → 1: 4/6
    assert curves["argmax:orm"][1].mean == pytest.approx(4 / 6)
    assert curves["argmax:orm"][3].mean == 1.0


# -- majority:invalid=vote ------------------------------------------------------------------

INVALID_VOTE = "majority:invalid=vote"


def _ref_invalid_vote(subset: Sequence[PooledCandidate]) -> float:
    """The paper's count, written anew: Counter over the answers with every failed extraction
    one answer, most_common(1) (ties to the first seen); that answer's first candidate, and
    the invalid answer is never correct."""
    from collections import Counter

    bloc = object()
    answers = [bloc if c.key is None else c.key for c in subset]
    if not answers:
        return 0.0
    top = Counter(answers).most_common(1)[0][0]
    return 0.0 if top is bloc else float(subset[answers.index(top)].correct)


BRUTE_INVALID = {
    name: [_brute(pool, k, _ref_invalid_vote) for k in range(1, N + 1)]
    for name, pool in POOLS.items()
}


def test_invalid_vote_curve_only_when_asked_and_majority_unchanged():
    plain, both = _curves(), _curves(invalid_votes=True)
    assert INVALID_VOTE not in plain
    assert set(both) == set(plain) | {INVALID_VOTE}
    assert both["majority"] == plain["majority"]


@pytest.mark.parametrize(
    "limits",
    [{}, {"exact_limit": 1}],  # every k-subset; past the subset limit, by answer counts
)
def test_invalid_vote_is_exact_and_matches_brute_force(limits):
    points = _curves(invalid_votes=True, **limits)[INVALID_VOTE]
    for j, point in enumerate(points):
        assert point.exact and point.stderr == 0.0
        expected = [BRUTE_INVALID[name][j] for name in POOLS]
        np.testing.assert_allclose(point.per_problem, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(POOLS))
def test_majority_by_counts_with_invalid_votes_matches_brute_force(name):
    pool = POOLS[name]
    keys, correct = [c.key for c in pool], [c.correct for c in pool]
    for k in range(1, N + 1):
        value = majority_by_counts(keys, correct, k, invalid="vote")
        assert value == pytest.approx(BRUTE_INVALID[name][k - 1], abs=1e-12)


def test_invalid_vote_monte_carlo_within_three_standard_errors():
    curves = _curves(invalid_votes=True, exact_limit=1, count_limit=0, samples=10_000, seed=3)
    sampled = 0
    for j, point in enumerate(curves[INVALID_VOTE][:-1]):
        assert not point.exact
        expected = [BRUTE_INVALID[name][j] for name in POOLS]
        assert abs(point.mean - np.mean(expected)) <= 3 * point.stderr + 1e-12
        errors = point.per_problem_stderr
        for value, se, exp in zip(point.per_problem, errors, expected, strict=True):
            assert abs(value - exp) <= 4 * se + 1e-12
            sampled += se > 0
    assert sampled > 20
    last = curves[INVALID_VOTE][-1]
    assert last.exact and list(last.per_problem) == [BRUTE_INVALID[n][-1] for n in POOLS]


def test_invalid_vote_by_hand():
    # n = 4: invalid, "a" (correct), invalid, "a" (correct). At k = 2 the six subsets:
    # {0,1} tie, invalid first: wrong; {0,2} invalid: wrong; {0,3} tie, invalid first: wrong;
    # {1,2} tie, "a" first: right; {1,3} "a": right; {2,3} tie, invalid first: wrong → 2/6.
    # Dropping invalid answers, only {0,2} is wrong → 5/6.
    pool = [_cand(None, False, 0, 0), _cand("a", True, 0, 0)]
    pool += [_cand(None, False, 0, 0), _cand("a", True, 0, 0)]
    curves = pooled_curves([pool], invalid_votes=True)
    assert curves[INVALID_VOTE][1].mean == pytest.approx(2 / 6)
    assert curves["majority"][1].mean == pytest.approx(5 / 6)
    # k = 1: right iff the one candidate is valid and correct; k = 4: a 2–2 tie, invalid first
    assert curves[INVALID_VOTE][0].mean == curves["majority"][0].mean == 0.5
    assert curves[INVALID_VOTE][3].mean == 0.0 and curves["majority"][3].mean == 1.0
    keys, correct = [c.key for c in pool], [c.correct for c in pool]
    assert majority_by_counts(keys, correct, 2, invalid="vote") == pytest.approx(2 / 6)


def test_an_invalid_candidate_graded_correct_never_counts_when_the_bloc_wins():
    # a task's grade of an invalid answer is not trusted: the bloc's win is wrong
    pool = [_cand(None, True, 0, 0), _cand(None, True, 0, 0), _cand("a", False, 0, 0)]
    curves = pooled_curves([pool], invalid_votes=True, count_limit=0)
    assert [p.mean for p in curves[INVALID_VOTE]] == [0.0, 0.0, 0.0]
    assert majority_by_counts([None, None, "a"], [True, True, False], 2, invalid="vote") == 0.0
