"""The paper's scorer controls over collected trajectories: pure functions over scores.

Every function reads `Snapshots` (the stored states of independent trajectories, flattened:
problem, trajectory, step, mask ratio, whether fully decoded, and the trajectory's final
correctness as the label) and one array of scores per scorer or per variant of a scorer
(the suffix ablation, the reversed input). Intervals are percentile bootstraps clustered by
problem: one draw of problems shared by every figure of one call, so differences are paired.

- `auc_by_mask`: ROC-AUC in each mask-ratio bucket and on the fully decoded states alone
  (the paper's Figure A), under one of two slicings of the stored states (`SLICINGS`):
  `paper`, the paper's: every stored state in the buckets, from the all-mask canvas (step 0)
  to the fully decoded state (mask ratio 0, in [0, 0.1)); `split`, the project's earlier
  one: the states at steps 0 < s < T in the buckets, the fully decoded ones only apart.
- `removal_risk`: the offline counterfactual: at the initial, middle and final stored states
  (`initial`: the all-mask canvas with `paper`, the first stored step after it with
  `split`), a top-M cut by score within each group of K trajectories of a problem; how often
  it removes every trajectory that reaches a correct answer, among the groups holding one
  (the project's reading of the paper's denominator), and over all groups.
- `auc_change`: the AUC of one scorer on two inputs (original against suffix-ablated, or a
  causal scorer's forward, reversed and averaged inputs), with the paired change.
- `reranker`: best-of-N by the scorer against a uniform pick at N = 1, 2, 4, …, and the sign
  check (mean score of correct against incorrect final states, per-problem separation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dllmbench.analysis.diagnostics import (
    BUCKETS,
    BucketAUC,
    KendallSummary,
    ScoredState,
    auc_by_mask_bucket,
    clustered_auc,
    problem_counts,
    within_problem_kendall,
)
from dllmbench.analysis.pooled import argmax_at_k, random_at_k
from dllmbench.analysis.stats import (
    CONFIDENCE,
    RESAMPLES,
    Interval,
    bootstrap_ci,
    paired_difference,
    percentile_interval,
)

STATES = ("initial", "middle", "final")
CUTS = (1, 2, 4)
PAPER, SPLIT = "paper", "split"
SLICINGS = (PAPER, SPLIT)  # the paper's slicing of the stored states first, the default


@dataclass(frozen=True)
class Snapshots:
    """The stored states of a collection, one entry per state (arrays of equal length)."""

    problem: np.ndarray  # int: index of the problem
    trajectory: np.ndarray  # int: index of the trajectory within its problem
    step: np.ndarray  # int: the step the state was stored at (0: all-mask; T: fully decoded)
    mask_ratio: np.ndarray  # float: the share of generated positions still masked
    final: np.ndarray  # bool: the fully decoded state (step T)
    label: np.ndarray  # bool: the trajectory's final answer is correct

    @property
    def problems(self) -> int:
        return int(self.problem.max()) + 1 if self.problem.size else 0


@dataclass(frozen=True)
class Boot:
    """The bootstrap settings of one set of controls."""

    seed: int = 0
    resamples: int = RESAMPLES
    level: float = CONFIDENCE


def _states(snaps: Snapshots, scores: np.ndarray, where: np.ndarray) -> list[ScoredState]:
    return [
        ScoredState(int(p), float(s), bool(y), float(r))
        for p, s, y, r in zip(
            snaps.problem[where],
            scores[where],
            snaps.label[where],
            snaps.mask_ratio[where],
            strict=True,
        )
    ]


# -- ROC-AUC by mask ratio ----------------------------------------------------------------------


def _check(slicing: str) -> None:
    if slicing not in SLICINGS:
        raise ValueError(f"slicing must be one of {', '.join(SLICINGS)}, got {slicing!r}")


def bucketed(snaps: Snapshots, slicing: str = PAPER) -> np.ndarray:
    """The states a slicing puts in the mask-ratio buckets: `paper` every stored state (the
    all-mask canvas in [0.9, 1.0], the fully decoded state in [0, 0.1)); `split` the states
    stored at steps 0 < s < T."""
    _check(slicing)
    if slicing == PAPER:
        return np.ones(snaps.step.size, bool)
    return ~snaps.final & (snaps.step > 0)


@dataclass(frozen=True)
class MaskCurve:
    """One scorer's ROC-AUC by mask bucket over the states its slicing buckets, and on the
    fully decoded states alone (`final`: a bucket of mask ratio 0 whose low and high are 0)."""

    buckets: list[BucketAUC]
    final: BucketAUC


def auc_by_mask(
    snaps: Snapshots, scores: np.ndarray, boot: Boot, slicing: str = PAPER
) -> MaskCurve:
    """ROC-AUC in each of the ten mask-ratio buckets over the states `slicing` buckets
    (`bucketed`), and on the fully decoded ones alone, each with a bootstrap interval
    clustered by problem."""
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    buckets = auc_by_mask_bucket(_states(snaps, scores, bucketed(snaps, slicing)), **opts)
    decoded = auc_by_mask_bucket(_states(snaps, scores, snaps.final), **opts)[0]
    final = BucketAUC(0.0, 0.0, decoded.n, decoded.positives, decoded.auc, decoded.interval)
    return MaskCurve(buckets, final)


def kendall_final(snaps: Snapshots, scores: np.ndarray) -> KendallSummary:
    """Within-problem Kendall τ between score and correctness on the fully decoded states."""
    return within_problem_kendall(_states(snaps, scores, snaps.final))


# -- AUC of one scorer on two inputs -------------------------------------------------------------


@dataclass(frozen=True)
class AUCChange:
    """ROC-AUC on input a and on input b over the same states, and b − a (paired)."""

    a: Interval
    b: Interval
    change: Interval
    n: int


def auc_change(
    snaps: Snapshots, a: np.ndarray, b: np.ndarray, boot: Boot, where: np.ndarray | None = None
) -> AUCChange:
    """ROC-AUC of scores `a` and `b` over the states `where` (default: all) and the change
    b − a, each with a bootstrap interval clustered by problem (one draw for all three)."""
    where = np.ones(snaps.label.size, bool) if where is None else where
    labels, problem = snaps.label[where], snaps.problem[where]
    counts = problem_counts(snaps.problems, boot.resamples, boot.seed)
    values, draws = [], []
    for scores in (a[where], b[where]):
        values.append(
            float(clustered_auc(scores, labels, problem, np.ones((1, counts.shape[1])))[0])
        )
        draws.append(clustered_auc(scores, labels, problem, counts))
    change = values[1] - values[0]
    intervals = [percentile_interval(d, v, boot.level) for d, v in zip(draws, values, strict=True)]
    diff = percentile_interval(draws[1] - draws[0], change, boot.level)
    if any(i is None for i in (*intervals, diff)):
        raise ValueError("the states need both correct and incorrect labels")
    return AUCChange(intervals[0], intervals[1], diff, int(where.sum()))


# -- the removal-risk counterfactual -------------------------------------------------------------


def stored_state(steps: Sequence[int], total: int, which: str, slicing: str = PAPER) -> int:
    """The stored step of a state: `initial` the first (with `paper` the all-mask canvas,
    step 0, where it was stored; with `split` the first after step 0), `middle` the one
    nearest T/2 (the earlier on a tie), `final` T."""
    _check(slicing)
    ordered = sorted({int(s) for s in steps if slicing == PAPER or int(s) > 0})
    if which == "initial":
        return ordered[0]
    if which == "final":
        return total
    if which == "middle":
        return min(ordered, key=lambda s: (abs(s - total / 2), s))
    raise ValueError(f"state must be one of {', '.join(STATES)}, got {which!r}")


@dataclass(frozen=True)
class RemovalRisk:
    """A top-M cut at one stored state: groups of K trajectories, those holding a trajectory
    that reaches a correct answer (`at_risk`), those whose cut removed every such trajectory
    (`lost`), the rate lost / at_risk (the project's reading of the paper's denominator) and
    the rate over all groups lost / groups, each with a bootstrap interval clustered by
    problem."""

    state: str
    step: int
    mask_ratio: float  # the mean mask ratio of the scored states
    keep: int  # M
    width: int  # K
    groups: int
    at_risk: int
    lost: int
    rate: Interval | None
    rate_all_groups: Interval | None


def _ratio(lost: np.ndarray, den: np.ndarray, counts: np.ndarray, level: float) -> Interval | None:
    """Σ lost / Σ den over problems, with the interval of its resamples (`counts`: how often
    each problem is drawn); None when nothing is in the denominator."""
    if den.sum() == 0:
        return None
    num, draws_den = counts @ lost, counts @ den
    draws = np.where(draws_den > 0, num / np.where(draws_den > 0, draws_den, 1), np.nan)
    return percentile_interval(draws, float(lost.sum() / den.sum()), level)


def _groups(traj: np.ndarray, width: int) -> np.ndarray:
    """The group of each trajectory index: consecutive blocks of `width`; −1 for the
    trajectories past the last whole block."""
    n = int(traj.max()) + 1 if traj.size else 0
    whole = (n // width) * width
    return np.where(traj < whole, traj // width, -1)


def removal_risk(
    snaps: Snapshots,
    scores: np.ndarray,
    total: int,
    boot: Boot,
    *,
    width: int,
    keeps: Sequence[int] = CUTS,
    states: Sequence[str] = STATES,
    slicing: str = PAPER,
) -> list[RemovalRisk]:
    """The paper's offline counterfactual. Each problem's trajectories are split into groups
    of `width` (0, …, K−1; K, …; a last partial group is left out). At each stored state
    (`stored_state` under `slicing`) and for each M < K, every group keeps its M best-scored
    states (ties to the lower trajectory index); the group is at risk when one of its
    trajectories ends correct, and lost when the cut kept none of those. The rate is lost
    over the groups at risk (the project's reading: the paper does not say which groups it
    divides by) and, beside it, lost over all whole groups."""
    counts = problem_counts(snaps.problems, boot.resamples, boot.seed)
    out = []
    for which in states:
        step = stored_state(snaps.step, total, which, slicing)
        at = np.flatnonzero(snaps.step == step)
        group = _groups(snaps.trajectory[at], width)
        members: dict[tuple[int, int], list[int]] = {}
        for i, g in zip(at, group, strict=True):
            if g >= 0:
                members.setdefault((int(snaps.problem[i]), int(g)), []).append(int(i))
        whole = np.zeros(snaps.problems)  # whole groups of each problem
        for (problem, _), idx in members.items():
            whole[problem] += len(idx) == width
        for keep in (m for m in keeps if m < width):
            lost = np.zeros(snaps.problems)
            risky = np.zeros(snaps.problems)
            for (problem, _), idx in members.items():
                if len(idx) != width or not snaps.label[idx].any():
                    continue
                order = sorted(idx, key=lambda i: (-scores[i], snaps.trajectory[i]))
                risky[problem] += 1
                lost[problem] += not snaps.label[order[:keep]].any()
            out.append(
                RemovalRisk(
                    state=which,
                    step=step,
                    mask_ratio=float(snaps.mask_ratio[at].mean()) if at.size else 0.0,
                    keep=keep,
                    width=width,
                    groups=int(whole.sum()),
                    at_risk=int(risky.sum()),
                    lost=int(lost.sum()),
                    rate=_ratio(lost, risky, counts, boot.level),
                    rate_all_groups=_ratio(lost, whole, counts, boot.level),
                )
            )
    return out


# -- best-of-N reranking -------------------------------------------------------------------------


@dataclass(frozen=True)
class RerankPoint:
    """Best-of-N by a scorer at one N (the expected accuracy over uniform N-subsets of each
    problem's trajectories), a uniform pick at the same N, and their paired difference."""

    n: int
    scorer: Interval
    random: Interval
    difference: Interval


@dataclass(frozen=True)
class Reranker:
    """A scorer as a best-of-N reranker of the fully decoded states, with the paper's sign
    check: mean score of correct and of incorrect states, and the share of problems holding
    both whose mean correct score exceeds their mean incorrect score."""

    points: list[RerankPoint]
    mean_correct: float | None
    mean_incorrect: float | None
    separated: float | None  # share of mixed problems with a positive separation
    mixed: int  # problems holding correct and incorrect final states


def pool_sizes(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


def final_pools(snaps: Snapshots, scores: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(scores, correct) of each problem's fully decoded states, in trajectory order."""
    out = []
    for p in range(snaps.problems):
        idx = np.flatnonzero(snaps.final & (snaps.problem == p))
        idx = idx[np.argsort(snaps.trajectory[idx], kind="stable")]
        out.append((scores[idx], snaps.label[idx]))
    return out


def reranker(snaps: Snapshots, scores: np.ndarray, boot: Boot) -> Reranker:
    """Best-of-N reranking by `scores` against a uniform pick at each N of `pool_sizes`."""
    pools = [p for p in final_pools(snaps, scores) if p[0].size]
    n = min(p[0].size for p in pools)
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    points = []
    for k in pool_sizes(n):
        best = [argmax_at_k(s[:n], c[:n], k) for s, c in pools]
        uniform = [random_at_k(c[:n], k) for _, c in pools]
        points.append(
            RerankPoint(
                k,
                bootstrap_ci(best, **opts),
                bootstrap_ci(uniform, **opts),
                paired_difference(best, uniform, **opts),
            )
        )
    final = snaps.final
    right, wrong = scores[final & snaps.label], scores[final & ~snaps.label]
    gaps = [s[c].mean() - s[~c].mean() for s, c in pools if 0 < c.sum() < c.size]
    return Reranker(
        points=points,
        mean_correct=float(right.mean()) if right.size else None,
        mean_incorrect=float(wrong.mean()) if wrong.size else None,
        separated=float(np.mean([g > 0 for g in gaps])) if gaps else None,
        mixed=len(gaps),
    )


def scorer_pools(
    snaps: Snapshots, scores: Mapping[str, np.ndarray]
) -> list[list[tuple[dict[str, float], bool]]]:
    """Each problem's fully decoded states as ({scorer: score}, correct), in trajectory
    order: the shared pool every scorer reranks in the scorer swap."""
    per = {name: final_pools(snaps, s) for name, s in scores.items()}
    out = []
    for p in range(snaps.problems):
        correct = next(iter(per.values()))[p][1]
        out.append(
            [
                ({name: float(per[name][p][0][i]) for name in scores}, bool(correct[i]))
                for i in range(correct.size)
            ]
        )
    return out


__all__ = [
    "BUCKETS",
    "CUTS",
    "PAPER",
    "SLICINGS",
    "SPLIT",
    "STATES",
    "AUCChange",
    "Boot",
    "MaskCurve",
    "RemovalRisk",
    "RerankPoint",
    "Reranker",
    "Snapshots",
    "auc_by_mask",
    "auc_change",
    "bucketed",
    "final_pools",
    "kendall_final",
    "pool_sizes",
    "removal_risk",
    "reranker",
    "scorer_pools",
    "stored_state",
]
