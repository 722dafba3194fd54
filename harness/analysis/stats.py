"""Statistics: bootstrap intervals over problems, paired differences, pool diversity.

All resampling draws one index matrix per (seed, number of problems), so every method of a
run is resampled on the same problems and differences are paired. Vectorised over resamples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from dllmbench.core.keys import numpy_rng
from dllmbench.core.schema import IntervalEntry

# The confidence level and the bootstrap resamples of every interval unless a caller asks
# for others: their one source.
CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def as_dict(self, digits: int = 6) -> IntervalEntry:
        """The interval as results.json holds it, rounded to `digits`."""
        return IntervalEntry(
            value=round(self.value, digits),
            low=round(self.low, digits),
            high=round(self.high, digits),
        )


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """A [resamples, n] matrix of problem indices drawn with replacement."""
    return numpy_rng("bootstrap", seed, n, resamples).integers(0, n, size=(resamples, n))


def _interval(values: np.ndarray, draws: np.ndarray, level: float) -> Interval:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return Interval(float(values.mean()), float(low), float(high))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """Mean of `values` (e.g. 0/1 correctness per problem) with a percentile bootstrap CI."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    idx = resample_indices(x.size, resamples, seed)
    return _interval(x, x[idx].mean(axis=1), level)


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """mean(a − b) over the same problems, with a paired bootstrap CI."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape:
        raise ValueError("paired_difference needs values on the same problems")
    return bootstrap_ci(x - y, resamples=resamples, level=level, seed=seed)


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
