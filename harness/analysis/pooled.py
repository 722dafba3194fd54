"""Exact pooled estimators: expected accuracy of a selector on a random k-subset of a pool.

A pool is the ordered list of n candidates one method produced for one problem. For every
k ≤ n, the pooled estimate of a selector is the expected correctness of that selector applied
to a k-subset of the pool drawn uniformly among all C(n, k) of them, the subset kept in the
pool's order. The estimate at k = n is the selector run on the whole pool, exactly.

Selectors and their estimators:

- ``oracle``: pass@k, 1 − C(n−c, k)/C(n, k) with c correct candidates (the unbiased
  estimator of Chen et al. 2021). Exact.
- ``random``: a uniform pick from the subset; c/n for every k. Exact.
- ``argmax:<scorer>``: the highest score in the subset, ties to the earliest position (as
  ``np.argmax``). Sort the pool by (score descending, position ascending) into a strict
  order; the candidate of rank r (0-based) is chosen iff it is in the subset and none of the
  r better ones is, with probability C(n−1−r, k−1)/C(n, k). Exact.
- ``majority`` and ``weighted_majority:<scorer>`` (vote weight sigmoid(score)) and
  ``weighted_majority:weight`` (the candidates' own weights, when every candidate has one):
  invalid candidates (key None) never vote; each key totals its weights; the winning key
  maximises (total, −first position in the subset); the chosen candidate is the first one
  holding it; no valid candidate means wrong. ``majority:invalid=vote`` (the selector
  ``majority:invalid=vote``, the paper's scripts' count) differs only in the invalid
  candidates, which vote as one more answer that is never correct: when that bloc wins, or
  ties with an answer and appears first in the subset, the vote is wrong. Exact by
  enumerating every k-subset when C(n, k) ≤ ``exact_limit`` (and always at k = n, where one
  subset exists). Plain majority (either treatment of invalid answers) is otherwise still
  exact when the vectors of per-answer counts number at most ``count_limit`` (see
  `majority_by_counts`). Otherwise a Monte-Carlo mean over ``samples`` uniform k-subsets
  drawn from a generator keyed by (seed, problem index, k), reported with its standard
  error. All voting selectors see the same subsets (common random numbers).

Bootstrap intervals resample problems with replacement from one index matrix per
(seed, number of problems, resamples), so every curve is resampled on the same problems and
differences between curves are paired.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import expit

from dllmbench.analysis import stats
from dllmbench.analysis.stats import CONFIDENCE, Interval, bootstrap_ci
from dllmbench.core.voting import Invalid, vote

EXACT_LIMIT = 20_000
COUNT_LIMIT = 20_000
SAMPLES = 10_000
RESAMPLES = 10_000
# the pooled name of `majority:invalid=vote`; "majority" is the default, invalid=drop
MAJORITY_INVALID_VOTE = "majority:invalid=vote"


@dataclass(frozen=True)
class PooledCandidate:
    """One candidate of a pool.

    key: the extracted answer key, None when extraction failed (invalid; never votes).
    correct: whether this candidate counts as correct (an invalid one is wrong).
    scores: scorer name → score, read by argmax and by weighted majority (sigmoid(score)).
    weight: an already-transformed vote weight (e.g. SMC's importance weight), or None.
    """

    key: Hashable | None
    correct: bool
    scores: Mapping[str, float] = field(default_factory=dict)
    weight: float | None = None


Pool = Sequence[PooledCandidate]


@dataclass(frozen=True)
class Estimate:
    """Expected correctness on one problem, with its Monte-Carlo standard error (0 if exact)."""

    value: float
    stderr: float
    exact: bool


@dataclass(frozen=True)
class PooledPoint:
    """One selector at one k: the mean over problems and what it is made of.

    stderr is the Monte-Carlo standard error of `mean`, sqrt(Σ se_i²)/P over the P problems
    (0 when every problem is exact); it does not include sampling variation of the problems,
    which the bootstrap intervals measure.
    """

    selector: str
    k: int
    mean: float
    per_problem: tuple[float, ...]
    per_problem_stderr: tuple[float, ...]
    exact: bool
    stderr: float


def keyed_rng(*parts: object) -> np.random.Generator:
    """A numpy generator seeded by a hash of any tuple of labels (never global state)."""
    digest = hashlib.blake2b(repr(("pooled", *parts)).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n}, got {k}")


def oracle_at_k(correct: Sequence[bool], k: int) -> float:
    """pass@k: 1 − C(n−c, k)/C(n, k), the chance a uniform k-subset holds a correct one."""
    n, c = len(correct), int(sum(bool(x) for x in correct))
    _check_k(n, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def random_at_k(correct: Sequence[bool], k: int) -> float:
    """A uniform pick from a uniform k-subset is a uniform pick from the pool: c/n."""
    n = len(correct)
    _check_k(n, k)
    return sum(bool(x) for x in correct) / n


def argmax_order(scores: Sequence[float]) -> list[int]:
    """Positions sorted by (score descending, position ascending): the argmax preference."""
    values = [float(s) for s in scores]
    if any(math.isnan(v) for v in values):
        raise ValueError("scores must not be NaN")
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


def argmax_at_k(scores: Sequence[float], correct: Sequence[bool], k: int) -> float:
    """Σ_r correct_r · C(n−1−r, k−1)/C(n, k) over ranks r of the argmax preference order."""
    n = len(correct)
    _check_k(n, k)
    order = argmax_order(scores)
    ways = sum(math.comb(n - 1 - r, k - 1) for r, i in enumerate(order) if correct[i])
    return ways / math.comb(n, k)


vote_index = vote  # the one vote (dllmbench.core.voting), over answer keys


def key_ids(keys: Sequence[Hashable | None]) -> np.ndarray:
    """Each key's index by first appearance in the pool; −1 for invalid (None)."""
    ids: dict[Hashable, int] = {}
    return np.array([-1 if k is None else ids.setdefault(k, len(ids)) for k in keys], np.int64)


def subsets(
    n: int, k: int, rng: np.random.Generator | None, *, exact_limit: int, samples: int
) -> tuple[np.ndarray, bool]:
    """Sorted k-subsets as rows of positions: all of them when C(n, k) ≤ exact_limit or k = n
    (exact), else `samples` uniform draws from `rng` (Monte-Carlo)."""
    _check_k(n, k)
    if k == n or math.comb(n, k) <= exact_limit:
        rows = np.array(list(itertools.combinations(range(n), k)), np.int64).reshape(-1, k)
        return rows, True
    if rng is None:
        raise ValueError("a Monte-Carlo path needs a generator")
    rows = np.argsort(rng.random((samples, n)), axis=1)[:, :k]
    return np.sort(rows, axis=1), False


def vote_outcomes(
    rows: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    correct: np.ndarray,
    invalid: Invalid = "drop",
) -> np.ndarray:
    """Correctness (0/1) of the vote on each subset row, with `vote_index`'s tie rules.

    Totals are accumulated in subset order (bincount adds in input order), as `vote_index`
    does, so float ties match. The pick is the earliest candidate whose key is among the
    keys of largest total: the first holder of the tied key that appears first. With
    invalid="vote" the invalid candidates (id −1) are one more key, and a pick of one of them
    is wrong.
    """
    valid = ids >= 0
    if invalid == "vote":
        ids = np.where(valid, ids, int(ids.max(initial=-1)) + 1)
        correct = correct & valid
    m = rows.shape[0]
    u = int(ids.max()) + 1 if ids.size else 0
    if u == 0:
        return np.zeros(m)
    kid = ids[rows]
    ok = kid >= 0
    cell = (np.arange(m)[:, None] * u + kid)[ok]
    totals = np.bincount(cell, weights=weights[rows][ok], minlength=m * u).reshape(m, u)
    seen = np.bincount(cell, minlength=m * u).reshape(m, u) > 0
    totals = np.where(seen, totals, -np.inf)
    tied = seen & (totals == totals.max(axis=1, keepdims=True))
    holds = ok & np.take_along_axis(tied, np.where(ok, kid, 0), axis=1)
    chosen = rows[np.arange(m), holds.argmax(axis=1)]
    return (holds.any(axis=1) & correct[chosen]).astype(np.float64)


def _estimate(outcomes: np.ndarray, exact: bool) -> Estimate:
    if exact or outcomes.size < 2:
        return Estimate(float(outcomes.mean()), 0.0, exact)
    se = float(outcomes.std(ddof=1) / math.sqrt(outcomes.size))
    return Estimate(float(outcomes.mean()), se, False)


def key_groups(
    keys: Sequence[Hashable | None], invalid: Invalid = "drop"
) -> tuple[list[list[int]], int]:
    """Positions of each valid key (keys by first appearance) and the number of invalid ones
    left out of the vote: all of them with invalid="drop"; with invalid="vote" none, the
    invalid positions being one more group (in its place by first appearance)."""
    groups: dict[Hashable, list[int]] = {}
    bloc = object()  # the invalid answers' one key when they vote
    for i, key in enumerate(keys):
        if key is not None or invalid == "vote":
            groups.setdefault(bloc if key is None else key, []).append(i)
    left_out = 0 if invalid == "vote" else sum(key is None for key in keys)
    return list(groups.values()), left_out


def count_vectors(sizes: Sequence[int], k: int) -> int:
    """How many vectors (c_g) with 0 ≤ c_g ≤ sizes[g] sum to k."""
    ways = [1] + [0] * k
    for size in sizes:
        ways = [sum(ways[j - c] for c in range(min(size, j) + 1)) for j in range(k + 1)]
    return ways[k]


def _vectors(sizes: Sequence[int], k: int) -> Iterator[tuple[int, ...]]:
    if not sizes:
        if k == 0:
            yield ()
        return
    rest = sum(sizes[1:])
    for c in range(max(0, k - rest), min(sizes[0], k) + 1):
        for tail in _vectors(sizes[1:], k - c):
            yield (c, *tail)


def _first_correct(
    groups: Sequence[Sequence[int]], counts: Sequence[int], correct: Sequence[bool]
) -> float:
    """P(the vote is correct) given how many candidates of each key the subset holds.

    Each key's chosen positions are a uniform c-subset of its positions, independently. The
    winners are the keys with the largest count; among them the one whose first chosen position
    is earliest wins, and that position's candidate is the pick. P(min = i-th position of a
    key) = C(m−1−i, c−1)/C(m, c); P(min > p) = C(#positions after p, c)/C(m, c).
    """
    top = max(counts, default=0)
    if top == 0:
        return 0.0
    tied = [g for g, c in enumerate(counts) if c == top]
    total = 0.0
    for a in tied:
        m_a = len(groups[a])
        for i, p in enumerate(groups[a]):
            if not correct[p] or m_a - 1 - i < top - 1:
                continue
            prob = math.comb(m_a - 1 - i, top - 1) / math.comb(m_a, top)
            for b in tied:
                if b != a:
                    after = len(groups[b]) - bisect_right(groups[b], p)
                    prob *= math.comb(after, top) / math.comb(len(groups[b]), top)
            total += prob
    return total


def majority_by_counts(
    keys: Sequence[Hashable | None],
    correct: Sequence[bool],
    k: int,
    *,
    limit: int = COUNT_LIMIT,
    invalid: Invalid = "drop",
) -> float | None:
    """Exact Majority@k by enumerating how many candidates of each answer the subset holds:
    Σ over count vectors of Π_g C(m_g, c_g)/C(n, k) · P(correct | counts). None when there
    are more than `limit` count vectors (invalid candidates count as one more group, which
    votes with invalid="vote" and whose candidates are then never correct)."""
    n = len(keys)
    _check_k(n, k)
    groups, left_out = key_groups(keys, invalid)
    correct = [bool(c) and key is not None for c, key in zip(correct, keys, strict=True)]
    sizes = [left_out, *(len(g) for g in groups)]
    if count_vectors(sizes, k) > limit:
        return None
    acc = 0.0
    for counts in _vectors(sizes, k):
        ways = math.prod(math.comb(m, c) for m, c in zip(sizes, counts, strict=True))
        acc += ways * _first_correct(groups, counts[1:], correct)
    return acc / math.comb(n, k)


def shared_scorers(pools: Sequence[Pool]) -> list[str]:
    """Scorer names every candidate of every pool carries, sorted."""
    names: set[str] | None = None
    for pool in pools:
        for cand in pool:
            names = set(cand.scores) if names is None else names & set(cand.scores)
    return sorted(names or ())


def vote_weights(pool: Pool, scorers: Sequence[str]) -> dict[str, np.ndarray]:
    """Vote weights per voting selector: 1 for majority, sigmoid(score) per scorer, and the
    candidates' own weights (``weighted_majority:weight``) when every candidate has one."""
    out = {"majority": np.ones(len(pool))}
    for name in scorers:
        scores = np.array([c.scores[name] for c in pool], np.float64)
        out[f"weighted_majority:{name}"] = expit(scores)
    if all(c.weight is not None for c in pool):
        out["weighted_majority:weight"] = np.array([c.weight for c in pool], np.float64)
    return out


def problem_estimates(
    pool: Pool,
    ks: Sequence[int],
    scorers: Sequence[str],
    rng_for: Callable[[int], np.random.Generator],
    *,
    exact_limit: int = EXACT_LIMIT,
    count_limit: int = COUNT_LIMIT,
    samples: int = SAMPLES,
    invalid_votes: bool = False,
) -> dict[str, list[Estimate]]:
    """Every selector's estimate at every k for one pool. `rng_for(k)` gives the keyed
    generator of the Monte-Carlo subsets at k (shared by the voting selectors).
    `invalid_votes` adds ``majority:invalid=vote``."""
    correct = [bool(c.correct) for c in pool]
    correct_arr = np.array(correct, bool)
    keys = [c.key for c in pool]
    ids = key_ids(keys)
    out: dict[str, list[Estimate]] = {"oracle": [], "random": []}
    for k in ks:
        out["oracle"].append(Estimate(oracle_at_k(correct, k), 0.0, True))
        out["random"].append(Estimate(random_at_k(correct, k), 0.0, True))
    for name in scorers:
        scores = [c.scores[name] for c in pool]
        out[f"argmax:{name}"] = [Estimate(argmax_at_k(scores, correct, k), 0.0, True) for k in ks]
    weights = vote_weights(pool, scorers)
    votes: dict[str, tuple[np.ndarray, Invalid]] = {n: (w, "drop") for n, w in weights.items()}
    if invalid_votes:
        votes[MAJORITY_INVALID_VOTE] = (weights["majority"], "vote")
    counted = {"majority": "drop", MAJORITY_INVALID_VOTE: "vote"}
    for name in votes:
        out[name] = []
    for k in ks:
        rows, exact = subsets(len(pool), k, rng_for(k), exact_limit=exact_limit, samples=samples)
        for name, (w, invalid) in votes.items():
            outcomes = vote_outcomes(rows, ids, w, correct_arr, invalid)
            out[name].append(_estimate(outcomes, exact))
        if exact or count_limit <= 0:
            continue
        for name, invalid in counted.items():
            if name in votes:
                value = majority_by_counts(keys, correct, k, limit=count_limit, invalid=invalid)
                if value is not None:
                    out[name][-1] = Estimate(value, 0.0, True)
    return out


def _point(selector: str, k: int, estimates: Sequence[Estimate]) -> PooledPoint:
    values = tuple(e.value for e in estimates)
    errors = tuple(e.stderr for e in estimates)
    stderr = math.sqrt(sum(se * se for se in errors)) / len(estimates)
    return PooledPoint(
        selector=selector,
        k=k,
        mean=float(np.mean(values)),
        per_problem=values,
        per_problem_stderr=errors,
        exact=all(e.exact for e in estimates),
        stderr=stderr,
    )


def pooled_curves(
    pools: Sequence[Pool],
    ks: Sequence[int] | None = None,
    seed: int = 0,
    *,
    scorers: Sequence[str] | None = None,
    exact_limit: int = EXACT_LIMIT,
    count_limit: int = COUNT_LIMIT,
    samples: int = SAMPLES,
    invalid_votes: bool = False,
) -> dict[str, list[PooledPoint]]:
    """Pooled curves of every selector: name → one point per k (default 1..smallest pool).

    Selectors: "oracle", "random", "argmax:<s>" and "weighted_majority:<s>" for each scorer s
    (default: those every candidate carries), "majority", "majority:invalid=vote" when
    `invalid_votes`, and "weighted_majority:weight" when every candidate of every pool has a
    weight. Monte-Carlo subsets of problem i at k come from a generator keyed by (seed, i, k).
    """
    if not pools or any(len(p) == 0 for p in pools):
        raise ValueError("pooled_curves needs at least one problem and no empty pool")
    n_min = min(len(p) for p in pools)
    ks = list(range(1, n_min + 1)) if ks is None else [int(k) for k in ks]
    for k in ks:
        _check_k(n_min, k)
    names = shared_scorers(pools) if scorers is None else list(scorers)
    per_problem = [
        problem_estimates(
            pool,
            ks,
            names,
            lambda k, i=i: keyed_rng("subsets", int(seed), i, k),
            exact_limit=exact_limit,
            count_limit=count_limit,
            samples=samples,
            invalid_votes=invalid_votes,
        )
        for i, pool in enumerate(pools)
    ]
    selectors = [s for s in per_problem[0] if all(s in est for est in per_problem)]
    return {
        s: [_point(s, k, [est[s][j] for est in per_problem]) for j, k in enumerate(ks)]
        for s in selectors
    }


def bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """Mean of per-problem values with a percentile bootstrap interval over problems
    (`stats.bootstrap_ci`, with this module's number of resamples)."""
    return bootstrap_ci(values, resamples=resamples, level=level, seed=seed)


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """mean(a − b) over the same problems, with a paired percentile bootstrap interval."""
    return stats.paired_difference(a, b, resamples=resamples, level=level, seed=seed)


def curve_intervals(
    points: Sequence[PooledPoint],
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> list[Interval]:
    """A bootstrap interval over problems for each point of one curve."""
    return [
        bootstrap_interval(p.per_problem, resamples=resamples, level=level, seed=seed)
        for p in points
    ]


def curve_difference(
    a: Sequence[PooledPoint],
    b: Sequence[PooledPoint],
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> list[Interval]:
    """Paired differences a − b at each shared k (points matched by k, in a's order)."""
    by_k = {p.k: p for p in b}
    return [
        paired_difference(
            p.per_problem, by_k[p.k].per_problem, resamples=resamples, level=level, seed=seed
        )
        for p in a
        if p.k in by_k
    ]
