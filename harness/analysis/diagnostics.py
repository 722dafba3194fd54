"""Diagnostics of scorers, pools, pruning and SMC: pure functions over plain data.

Every interval is a percentile bootstrap over problems (the unit that is sampled), drawn from
a generator keyed by (seed, number of problems, resamples), so the same seed gives the same
interval and intervals over the same problems are paired.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.stats import kendalltau

from dllmbench.analysis.pooled import (
    RESAMPLES,
    Interval,
    PooledCandidate,
    argmax_order,
    bootstrap_interval,
    paired_difference,
)
from dllmbench.analysis.stats import (
    CONFIDENCE,
    entropy_bits,
    percentile_interval,
    resample_indices,
)

BUCKETS = 10


@dataclass(frozen=True)
class ScoredState:
    """A scored (partial or final) state: its problem, score, label (the final answer's
    correctness) and mask ratio (the fraction of generated positions still masked)."""

    problem_id: Hashable
    score: float
    label: bool
    mask_ratio: float = 0.0


@dataclass(frozen=True)
class BucketAUC:
    """ROC-AUC of the states whose mask ratio lies in [low, high) ([0.9, 1.0] for the last).

    auc is None when the bucket holds one class (or nothing); the interval is None then too,
    or when no bootstrap resample holds both classes.
    """

    low: float
    high: float
    n: int
    positives: int
    auc: float | None
    interval: Interval | None


def mask_buckets(ratios: np.ndarray | Sequence[float]) -> np.ndarray:
    """Bucket index of each mask ratio: [i/10, (i+1)/10) for i < 9, and [0.9, 1.0] is 9.

    The edges are the float64 values i/10, so a ratio computed in float64 as masked /
    generated from integer counts falls in bucket ⌊10·masked / generated⌋ exactly (capped at
    9): a correctly rounded division gives the edge itself when the fraction equals it (14/20
    is 0.7, bucket 7), and a fraction short of an edge by 1/(10·generated) or more never
    rounds up to it. A float32 ratio carries no such promise (14/20 in float32 lies below
    0.7)."""
    ratios = np.asarray(ratios, np.float64)
    outside = ~((ratios >= 0.0) & (ratios <= 1.0))  # NaN included
    if outside.any():
        raise ValueError(f"mask ratio must be in [0, 1], got {ratios[outside][0]}")
    edges = np.arange(BUCKETS + 1) / BUCKETS
    return np.minimum(np.searchsorted(edges, ratios, side="right") - 1, BUCKETS - 1)


def mask_bucket(ratio: float) -> int:
    """Bucket index of one mask ratio (see `mask_buckets`)."""
    return int(mask_buckets([ratio])[0])


def _auc_tables(
    scores: np.ndarray, labels: np.ndarray, cluster: np.ndarray, n_clusters: int
) -> tuple[csr_matrix, csr_matrix]:
    """Sparse [clusters, distinct scores ascending] counts of positives and of negatives."""
    _, inverse = np.unique(scores, return_inverse=True)
    shape = (n_clusters, int(inverse.max()) + 1 if inverse.size else 0)
    pos = csr_matrix((labels.astype(np.float64), (cluster, inverse)), shape=shape)
    neg = csr_matrix(((~labels).astype(np.float64), (cluster, inverse)), shape=shape)
    return pos, neg


def _auc_rows(pos: csr_matrix, neg: csr_matrix, weights: np.ndarray) -> np.ndarray:
    """AUC for each row of a [R, clusters] weight matrix (see `weighted_auc`)."""
    p = np.asarray((pos.T @ weights.T).T)
    q = np.asarray((neg.T @ weights.T).T)
    below = np.cumsum(q, axis=1) - q
    num = (p * (below + 0.5 * q)).sum(axis=1)
    den = p.sum(axis=1) * q.sum(axis=1)
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, np.nan)


def weighted_auc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC-AUC for each row of a [R, N] weight matrix over N states: the weighted
    Mann-Whitney P(score⁺ > score⁻) + ½·P(score⁺ = score⁻), equal to the area under the
    weighted ROC curve. NaN for a row whose positives or negatives weigh nothing."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    pos, neg = _auc_tables(scores, labels, np.arange(scores.size), scores.size)
    return _auc_rows(pos, neg, np.atleast_2d(np.asarray(weights, np.float64)))


def clustered_auc(
    scores: np.ndarray,
    labels: np.ndarray,
    problem: np.ndarray,
    counts: np.ndarray,
) -> np.ndarray:
    """AUC per resample: each state weighs how often its problem was drawn."""
    pos, neg = _auc_tables(scores, labels, problem, counts.shape[1])
    chunk = 500
    parts = [
        _auc_rows(pos, neg, counts[i : i + chunk].astype(np.float64))
        for i in range(0, counts.shape[0], chunk)
    ]
    return np.concatenate(parts)


def problem_counts(n_problems: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n_problems]: how often each problem is drawn in each resample."""
    idx = resample_indices(n_problems, resamples, seed)
    flat = idx + n_problems * np.arange(resamples)[:, None]
    return np.bincount(flat.ravel(), minlength=resamples * n_problems).reshape(resamples, -1)


def auc_by_mask_bucket(
    rows: Sequence[ScoredState],
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> list[BucketAUC]:
    """ROC-AUC (sklearn's roc_auc_score) of score against label in each of the ten mask-ratio
    buckets, with a clustered bootstrap interval: problems are resampled with replacement
    (one draw shared by all buckets) and each state weighs its problem's draw count; the
    percentile interval is over the resamples whose bucket holds both classes."""
    from sklearn.metrics import roc_auc_score  # scikit-learn loads only when asked

    problems = {r.problem_id: None for r in rows}
    index = {p: i for i, p in enumerate(problems)}
    counts = problem_counts(len(index), resamples, seed) if rows else None
    buckets = mask_buckets([r.mask_ratio for r in rows])
    out = []
    for b in range(BUCKETS):
        members = [r for r, rb in zip(rows, buckets, strict=True) if rb == b]
        scores = np.array([float(r.score) for r in members], np.float64)
        labels = np.array([bool(r.label) for r in members], bool)
        auc, interval = None, None
        if 0 < labels.sum() < labels.size:
            auc = float(roc_auc_score(labels, scores))
            problem = np.array([index[r.problem_id] for r in members], np.int64)
            draws = clustered_auc(scores, labels, problem, counts)
            interval = percentile_interval(draws, auc, level)
        low, high = b / BUCKETS, (b + 1) / BUCKETS
        out.append(BucketAUC(low, high, labels.size, int(labels.sum()), auc, interval))
    return out


@dataclass(frozen=True)
class KendallSummary:
    """Within-problem Kendall τ-b between score and correctness.

    problems: how many problems have both correct and incorrect candidates. per_problem holds
    τ for each of them; where every score of a problem is equal τ is undefined (NaN): those
    are counted in `undefined` and left out of `median` and `mean`, which are None when
    nothing is left. The paper's headline is the median (0.44; its mean is 0.397): with τ
    bounded and skewed over problems the two can differ, even in sign.
    τ-b reaches 1 only when scores are tied within each label; with distinct scores a
    perfect separation of p correct and q incorrect gives sqrt(p·q / C(p + q, 2)).
    """

    median: float | None
    mean: float | None
    problems: int
    undefined: int
    per_problem: Mapping[Hashable, float]


def within_problem_kendall(rows: Sequence[ScoredState]) -> KendallSummary:
    """scipy's kendalltau (τ-b) of score against label within each problem holding both
    labels; the median and the mean over those problems with a defined τ."""
    by_problem: dict[Hashable, list[ScoredState]] = {}
    for r in rows:
        by_problem.setdefault(r.problem_id, []).append(r)
    taus: dict[Hashable, float] = {}
    for pid, members in by_problem.items():
        labels = [int(bool(r.label)) for r in members]
        if 0 < sum(labels) < len(labels):
            tau = kendalltau([float(r.score) for r in members], labels).statistic
            taus[pid] = float(tau)
    defined = [t for t in taus.values() if not math.isnan(t)]
    median = float(np.median(defined)) if defined else None
    mean = float(np.mean(defined)) if defined else None
    return KendallSummary(median, mean, len(taus), len(taus) - len(defined), taus)


@dataclass(frozen=True)
class PoolDiversity:
    """One pool: its size, valid candidates, distinct valid answers, the entropy in bits of
    the valid answers' empirical distribution (0 for one answer, and 0 when no answer is
    valid), and Oracle@K (1.0 when any candidate is correct)."""

    n: int
    valid: int
    unique_valid: int
    entropy_bits: float
    oracle: float


@dataclass(frozen=True)
class DiversitySummary:
    """Per-pool diversity and its means over problems (pools with no valid answer count as
    0 unique answers and 0 bits)."""

    per_problem: tuple[PoolDiversity, ...]
    oracle: float
    unique_valid: float
    entropy_bits: float


def answer_entropy_bits(keys: Sequence[Hashable | None]) -> float:
    """H = −Σ p_a log2 p_a over the valid answers' frequencies p_a; 0 with no valid answer."""
    return entropy_bits(keys)


def pool_diversity(pools: Sequence[Sequence[PooledCandidate]]) -> DiversitySummary:
    """Oracle@K, unique valid answers and answer entropy of each pool, and their means."""
    if not pools:
        raise ValueError("pool_diversity needs at least one pool")
    per = []
    for pool in pools:
        keys = [c.key for c in pool]
        valid = [k for k in keys if k is not None]
        oracle = float(any(c.correct for c in pool))
        per.append(
            PoolDiversity(len(pool), len(valid), len(set(valid)), answer_entropy_bits(keys), oracle)
        )
    return DiversitySummary(
        per_problem=tuple(per),
        oracle=float(np.mean([p.oracle for p in per])),
        unique_valid=float(np.mean([p.unique_valid for p in per])),
        entropy_bits=float(np.mean([p.entropy_bits for p in per])),
    )


@dataclass(frozen=True)
class PruningEvent:
    """One cut: the lineages it kept and removed, and for each lineage whether it could reach
    a correct final answer (some descendant final candidate is correct)."""

    kept: frozenset[Hashable]
    removed: frozenset[Hashable]
    reaches_correct: Mapping[Hashable, bool]


@dataclass(frozen=True)
class RemovalRisk:
    """events: all cuts. at_risk: cuts before which at least one lineage (kept or removed)
    could reach a correct answer. lost: those of them that removed every such lineage.
    rate = lost / at_risk, None when no cut is at risk."""

    events: int
    at_risk: int
    lost: int
    rate: float | None


def removal_risk(events: Sequence[PruningEvent]) -> RemovalRisk:
    """How often a cut removes every lineage that could still reach a correct answer, among
    the cuts where some lineage could."""
    at_risk = lost = 0
    for event in events:
        if event.kept & event.removed:
            raise ValueError("a lineage cannot be both kept and removed")
        lineages = event.kept | event.removed
        missing = lineages - set(event.reaches_correct)
        if missing:
            raise ValueError(f"no reaches_correct for lineages {sorted(map(repr, missing))}")
        good = {lin for lin in lineages if event.reaches_correct[lin]}
        if good:
            at_risk += 1
            lost += good <= event.removed
    return RemovalRisk(len(events), at_risk, lost, lost / at_risk if at_risk else None)


@dataclass(frozen=True)
class SMCCheckpoint:
    """One SMC checkpoint: the normalized weights before resampling, whether it resampled,
    the β (inverse temperature) it used, and the ancestor index of each particle after
    resampling (None when it did not resample: each particle is its own ancestor)."""

    weights: Sequence[float]
    resampled: bool
    beta: float
    ancestors: Sequence[int] | None = None


@dataclass(frozen=True)
class CheckpointStats:
    """ESS before = 1/Σ w_i² (weights renormalized to sum 1); ESS after = n when the
    checkpoint resampled (weights reset to uniform), else ESS before. distinct_ancestors:
    the number of distinct ancestor indices; ancestor_perplexity: exp(−Σ f_a ln f_a) with
    f_a the fraction of particles descending from ancestor a (n and n without resampling)."""

    n: int
    ess_before: float
    ess_after: float
    resampled: bool
    beta: float
    distinct_ancestors: int
    ancestor_perplexity: float


def checkpoint_stats(cp: SMCCheckpoint) -> CheckpointStats:
    """The diagnostics of one checkpoint (see CheckpointStats)."""
    w = np.asarray(cp.weights, np.float64)
    if w.size == 0 or (w < 0).any() or not w.sum() > 0:
        raise ValueError("weights must be non-negative with a positive sum")
    w = w / w.sum()
    n = w.size
    ess = float(1.0 / np.sum(w * w))
    ancestors = np.arange(n) if cp.ancestors is None or not cp.resampled else cp.ancestors
    counts = np.array(list(Counter(int(a) for a in ancestors).values()), np.float64)
    f = counts / counts.sum()
    perplexity = float(np.exp(-(f * np.log(f)).sum()))
    ess_after = float(n) if cp.resampled else ess
    return CheckpointStats(n, ess, ess_after, cp.resampled, float(cp.beta), counts.size, perplexity)


@dataclass(frozen=True)
class SMCSummary:
    """Checkpoint diagnostics and their summary: means of ESS before and after over all
    checkpoints, the fraction of checkpoints that resampled, β's mean, min and max, and the
    mean distinct ancestors and ancestor perplexity over the checkpoints that resampled
    (None when none did)."""

    checkpoints: tuple[CheckpointStats, ...]
    mean_ess_before: float
    mean_ess_after: float
    resample_rate: float
    beta_mean: float
    beta_min: float
    beta_max: float
    mean_distinct_ancestors: float | None
    mean_ancestor_perplexity: float | None


def smc_diagnostics(checkpoints: Sequence[SMCCheckpoint]) -> SMCSummary:
    """Diagnostics of every checkpoint (of one or many SMC runs) and their summary."""
    if not checkpoints:
        raise ValueError("smc_diagnostics needs at least one checkpoint")
    stats = tuple(checkpoint_stats(cp) for cp in checkpoints)
    betas = [s.beta for s in stats]
    resampled = [s for s in stats if s.resampled]
    return SMCSummary(
        checkpoints=stats,
        mean_ess_before=float(np.mean([s.ess_before for s in stats])),
        mean_ess_after=float(np.mean([s.ess_after for s in stats])),
        resample_rate=len(resampled) / len(stats),
        beta_mean=float(np.mean(betas)),
        beta_min=float(min(betas)),
        beta_max=float(max(betas)),
        mean_distinct_ancestors=(
            float(np.mean([s.distinct_ancestors for s in resampled])) if resampled else None
        ),
        mean_ancestor_perplexity=(
            float(np.mean([s.ancestor_perplexity for s in resampled])) if resampled else None
        ),
    )


@dataclass(frozen=True)
class ScorerSwap:
    """The same pools reranked by each scorer (argmax over the whole pool, ties to the
    earliest) and by a uniform pick ("random", its expected correctness c/n).

    per_problem: selector → correctness per problem; accuracy: bootstrap interval of each;
    differences: (a, b) → paired bootstrap interval of a − b, for every pair in order.
    """

    per_problem: Mapping[str, tuple[float, ...]]
    accuracy: Mapping[str, Interval]
    differences: Mapping[tuple[str, str], Interval]


def scorer_swap(
    pools: Sequence[Sequence[PooledCandidate]],
    scorers: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> ScorerSwap:
    """Rerank every pool with each scorer and at random; paired differences over problems."""
    if not pools or any(len(p) == 0 for p in pools):
        raise ValueError("scorer_swap needs at least one problem and no empty pool")
    per: dict[str, tuple[float, ...]] = {}
    for name in scorers:
        per[name] = tuple(
            float(pool[argmax_order([c.scores[name] for c in pool])[0]].correct) for pool in pools
        )
    per["random"] = tuple(float(np.mean([c.correct for c in pool])) for pool in pools)
    opts = {"resamples": resamples, "level": level, "seed": seed}
    accuracy = {name: bootstrap_interval(v, **opts) for name, v in per.items()}
    names = list(per)
    differences = {
        (a, b): paired_difference(per[a], per[b], **opts)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    return ScorerSwap(per, accuracy, differences)
