"""Statistics: bootstrap intervals over problems, paired differences, pool diversity.

For 0/1 outcomes (a problem solved or not) the bootstrap distribution has a closed form: a
mean's is binomial, a paired difference's depends only on the counts of discordant and tied
problems (trinomial), so their percentile intervals are computed exactly, with no resampling
noise, and a paired difference carries the exact McNemar p-value. Other values are resampled:
one index matrix per (seed, number of problems), so every method of a run is resampled on the
same problems and differences are paired; those intervals carry their Monte-Carlo error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dllmbench.core.keys import numpy_rng
from dllmbench.core.schema import IntervalEntry

# The confidence level and the bootstrap resamples of every interval unless a caller asks
# for others: their one source.
CONFIDENCE = 0.95
RESAMPLES = 2000


_log_factorial_table = np.zeros(1)  # log(0!)


def _log_factorials(n: int) -> np.ndarray:
    """log(i!) for i = 0..n at least, each from the C library's log-gamma (`math.lgamma`),
    not a running sum of logs (whose rounding grows with n); one table, grown by doubling."""
    global _log_factorial_table
    have = len(_log_factorial_table)
    if have <= n:
        more = [math.lgamma(i + 1) for i in range(have, max(int(n) + 1, 2 * have))]
        _log_factorial_table = np.concatenate([_log_factorial_table, more])
    return _log_factorial_table


def binomial_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    """P(X = k) for X ~ Binomial(n, p) at whole k in 0..n, from log-factorials (scipy.stats'
    `binom.pmf` to 2e-11 relative up to n = 5000); exact 0 and 1 at p = 0 and p = 1. The
    standard library's log-gamma instead of scipy's: importing scipy.special costs every
    command that reads results about 0.17 s, a third of `merge`'s start."""
    k = np.asarray(k, dtype=np.int64)
    lf = _log_factorials(n)
    log_choose = lf[n] - lf[k] - lf[n - k]
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) where p is 0 or 1
        heads = np.where(k == 0, 0.0, k * math.log(p) if p > 0 else -np.inf)
        tails = np.where(k == n, 0.0, (n - k) * math.log1p(-p) if p < 1 else -np.inf)
    return np.exp(log_choose + heads + tails)


def binomial_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly: the sum of binomial coefficients over 2^n
    in whole numbers, rounded once. Each coefficient from the one before it."""
    total = term = 1  # C(n, 0)
    for i in range(k):
        term = term * (n - i) // (i + 1)  # C(n, i + 1), exact: i + 1 divides the product
        total += term
    return total / 2**n


@dataclass(frozen=True)
class Interval:
    """A mean over problems and its percentile interval. `exact`: the interval's ends are
    the quantiles of the exact bootstrap distribution (0/1 values); otherwise they come from
    resampling and `mc_error` is the Monte-Carlo error of the ends (see `mc_error`)."""

    value: float
    low: float
    high: float
    exact: bool = False
    mc_error: float | None = None

    def as_dict(self, digits: int = 6) -> IntervalEntry:
        """The interval as results.json holds it, rounded to `digits`."""
        out = IntervalEntry(
            value=round(self.value, digits),
            low=round(self.low, digits),
            high=round(self.high, digits),
            exact=self.exact,
        )
        if self.mc_error is not None:
            out["mc_error"] = round(self.mc_error, digits)
        return out


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """A [resamples, n] matrix of problem indices drawn with replacement."""
    return numpy_rng("bootstrap", seed, n, resamples).integers(0, n, size=(resamples, n))


def binary(values: np.ndarray) -> bool:
    """True when every value is 0 or 1 (correctness per problem)."""
    return bool(np.isin(values, (0.0, 1.0)).all())


def tail_fraction(level: float) -> Fraction:
    """The probability below each end of a `level` interval, exactly: (1 − level)/2 with
    `level` read as the decimal it is written as (0.95 → 1/40), not as its binary float
    (whose (1 − 0.95)/2 is 0.025000000000000022)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return (1 - Fraction(repr(float(level)))) / 2


def _tails(level: float) -> tuple[float, float]:
    tail = tail_fraction(level)
    return float(tail), float(1 - tail)


def order_ranks(count: int, level: float) -> tuple[int, int]:
    """The 1-based ranks, among `count` ascending draws, of a `level` percentile interval's
    ends: the inverted-CDF quantile at q is the draw of rank ⌈count·q⌉ (at least 1), taken in
    integer arithmetic (2,000 draws at 95%: ranks 50 and 1950)."""
    tail = tail_fraction(level)
    ranks = []
    for q in (tail, 1 - tail):
        scaled = count * q
        ranks.append(min(max(-(-scaled.numerator // scaled.denominator), 1), count))
    return ranks[0], ranks[1]


def exact_quantile(support: np.ndarray, probs: np.ndarray, q: float) -> float:
    """The q-quantile (inverse CDF: the smallest value whose CDF reaches q) of the discrete
    law with ascending `support` and probabilities `probs`."""
    cdf = np.cumsum(probs)
    return float(support[min(int(np.searchsorted(cdf, q - 1e-12)), support.size - 1)])


def mc_error(draws: np.ndarray, level: float) -> float:
    """Monte-Carlo error of a percentile interval's ends from R resamples: for each end,
    half the distance between the order statistics at ranks R·q ± sqrt(R·q·(1 − q)) (one
    binomial standard deviation of the rank), the larger of the two ends."""
    ordered = np.sort(draws)
    r = ordered.size
    out = 0.0
    for q in _tails(level):
        spread = np.sqrt(r * q * (1.0 - q))
        lo = ordered[max(int(np.floor(r * q - spread)), 0)]
        hi = ordered[min(int(np.ceil(r * q + spread)), r - 1)]
        out = max(out, float(hi - lo) / 2.0)
    return out


def percentile_interval(draws: np.ndarray, value: float, level: float) -> Interval | None:
    """The percentile interval around `value` of resampled statistics `draws` (NaN draws, a
    resample where the statistic is undefined, left out): the inverted-CDF quantiles, the
    draws of ranks `order_ranks` (the 50th and the 1950th of 2,000 at 95%), so each end is a
    value some resample gave (no interpolation), with their Monte-Carlo error; None when no
    draw is defined."""
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return None
    ordered = np.sort(draws)
    low, high = (ordered[rank - 1] for rank in order_ranks(ordered.size, level))
    return Interval(value, float(low), float(high), False, mc_error(draws, level))


def _resampled(values: np.ndarray, draws: np.ndarray, level: float) -> Interval:
    """Percentile interval of resampled means of `values`."""
    interval = percentile_interval(draws, float(values.mean()), level)
    assert interval is not None  # a mean of at least one value is always defined
    return interval


def _binomial_interval(x: np.ndarray, level: float) -> Interval:
    """The exact bootstrap interval of the mean of n 0/1 values with c ones: a resample's
    count of ones is Binomial(n, c/n)."""
    n, c = x.size, int(x.sum())
    counts = np.arange(n + 1)
    probs = binomial_pmf(counts, n, c / n)
    low, high = (exact_quantile(counts, probs, q) / n for q in _tails(level))
    return Interval(c / n, low, high, True)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """Mean of `values` over problems with its percentile bootstrap interval: exact for 0/1
    values (`_binomial_interval`), else from `resamples` resamples of the problems."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if binary(x):
        return _binomial_interval(x, level)
    idx = resample_indices(x.size, resamples, seed)
    return _resampled(x, x[idx].mean(axis=1), level)


def median_interval(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval | None:
    """The median of per-problem values with the percentile interval of the medians of
    `resamples` resamples of the problems (`resample_indices`); None without a value."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    draws = np.median(x[resample_indices(x.size, resamples, seed)], axis=1)
    return percentile_interval(draws, float(np.median(x)), level)


def ratio_interval(
    numerators: Sequence[float] | np.ndarray,
    denominators: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval | None:
    """Σ numerators / Σ denominators over problems (a count of each per problem) with the
    percentile interval of the same ratio over `resamples` resamples of the problems, a
    resample whose denominators sum to 0 left out; None when they sum to 0."""
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape:
        raise ValueError("ratio_interval needs one numerator and one denominator per problem")
    if not den.sum() > 0:
        return None
    idx = resample_indices(num.size, resamples, seed)
    tops, bottoms = num[idx].sum(axis=1), den[idx].sum(axis=1)
    draws = np.where(bottoms > 0, tops / np.where(bottoms > 0, bottoms, 1.0), np.nan)
    return percentile_interval(draws, float(num.sum() / den.sum()), level)


@dataclass(frozen=True)
class Discordant:
    """The problems where two 0/1 outcomes differ: `better` (a right, b wrong), `worse`
    (a wrong, b right), out of `problems`."""

    better: int
    worse: int
    problems: int


def trinomial_difference(d: Discordant) -> tuple[np.ndarray, np.ndarray]:
    """The exact bootstrap law of mean(a − b) for 0/1 outcomes, as (support ascending,
    probabilities). Resampling n problems draws (B, W, n − B − W) ~ Multinomial(n; better/n,
    worse/n, ties/n) and the mean difference is (B − W)/n. Summed as the trinomial factors:
    the discordant draws M = B + W ~ Binomial(n, (better + worse)/n) and, given M = m,
    B ~ Binomial(m, better/(better + worse)); values of M whose probability is below 1e-18
    are left out (their total cannot move a quantile)."""
    n, m_all = d.problems, d.better + d.worse
    support = (np.arange(2 * n + 1) - n) / n
    probs = np.zeros(2 * n + 1)
    if m_all == 0:
        probs[n] = 1.0
        return support, probs
    ms = np.arange(n + 1)
    p_m = binomial_pmf(ms, n, m_all / n)
    share = d.better / m_all
    for m in ms[p_m > 1e-18]:
        b = np.arange(m + 1)
        probs[2 * b - m + n] += p_m[m] * binomial_pmf(b, m, share)
    return support, probs / probs.sum()


def mcnemar_p(d: Discordant) -> float:
    """The exact McNemar test: two-sided binomial test of `better` among the discordant
    problems against 1/2; 1.0 without a discordant problem."""
    m = d.better + d.worse
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf_half(min(d.better, d.worse), m))


def tests_agree(low: float, high: float, p_value: float, level: float) -> bool:
    """Whether a paired interval and McNemar's test say the same at `level`: the interval
    excludes 0 exactly when p < 1 − level. They can disagree: the interval is the percentile
    bootstrap of every problem's difference, McNemar's test conditions on the discordant
    problems alone (4 better and 0 worse: the interval excludes 0 at any number of problems,
    p = 0.125)."""
    excludes_zero = low > 0 or high < 0
    return excludes_zero == (p_value < float(2 * tail_fraction(level)))


@dataclass(frozen=True)
class PairedInterval(Interval):
    """A paired difference; for 0/1 outcomes also its discordant counts, McNemar p and
    whether the two agree (`tests_agree`)."""

    discordant: Discordant | None = None
    p_value: float | None = None
    agrees: bool | None = None

    def as_dict(self, digits: int = 6) -> IntervalEntry:
        out = super().as_dict(digits)
        if self.discordant is not None:
            out["better"] = self.discordant.better
            out["worse"] = self.discordant.worse
            # significant digits: a p-value of 1.5e-08 is not 0
            out["mcnemar_p"] = float(f"{float(self.p_value):.{digits}g}")
            out["mcnemar_agrees"] = bool(self.agrees)
        return out


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> PairedInterval:
    """mean(a − b) over the same problems with its paired bootstrap interval: for 0/1
    outcomes exact (`trinomial_difference`) with the exact McNemar p-value, else from
    `resamples` resamples of the problems."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape:
        raise ValueError("paired_difference needs values on the same problems")
    if x.size == 0:
        raise ValueError("paired_difference needs at least one problem")
    if binary(x) and binary(y):
        d = Discordant(int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum()), x.size)
        support, probs = trinomial_difference(d)
        low, high = (exact_quantile(support, probs, q) for q in _tails(level))
        value, p = (d.better - d.worse) / d.problems, mcnemar_p(d)
        agrees = tests_agree(low, high, p, level)
        return PairedInterval(value, low, high, True, None, d, p, agrees)
    diff = x - y
    idx = resample_indices(diff.size, resamples, seed)
    ci = _resampled(diff, diff[idx].mean(axis=1), level)
    return PairedInterval(ci.value, ci.low, ci.high, False, ci.mc_error)


def entropy_bits(keys: Sequence[Hashable | None]) -> float:
    """Shannon entropy, in bits, of the valid answers of one pool (invalid ones left out)."""
    counts = np.array(list(Counter(k for k in keys if k is not None).values()), np.float64)
    if counts.size == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum() + 0.0)


def unique_answers(keys: Sequence[Hashable | None]) -> int:
    """Distinct valid answers in one pool."""
    return len({k for k in keys if k is not None})
