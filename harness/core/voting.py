"""The vote: one implementation, read by the voting selectors and the pooled estimators."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def vote(keys: Sequence[Hashable | None], weights: Sequence[float]) -> int | None:
    """Index of the first candidate of the valid answer key with the largest total weight;
    equal totals go to the key that appears first. Invalid answers (None) never vote; with
    no valid answer, None."""
    totals: dict[Hashable, float] = {}
    first: dict[Hashable, int] = {}
    for i, (key, weight) in enumerate(zip(keys, weights, strict=True)):
        if key is None:
            continue
        totals[key] = totals.get(key, 0.0) + float(weight)
        first.setdefault(key, i)
    if not totals:
        return None
    best = max(totals, key=lambda key: (totals[key], -first[key]))
    return first[best]
