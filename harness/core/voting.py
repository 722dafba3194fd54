"""The vote: one implementation, read by the voting selectors and the pooled estimators."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

Invalid = Literal["drop", "vote"]
INVALID_CHOICES: tuple[Invalid, ...] = ("drop", "vote")

# the key the invalid answers vote under with invalid="vote": one bloc, never a real answer
_INVALID = object()


def vote(
    keys: Sequence[Hashable | None], weights: Sequence[float], invalid: Invalid = "drop"
) -> int | None:
    """Index of the first candidate of the answer key with the largest total weight; equal
    totals go to the key that appears first.

    Invalid answers (key None): with invalid="drop" (the default) they never vote, and with
    no valid answer the vote is None. With invalid="vote" they vote together as one bloc, as
    if "no answer" were an answer, which is how `Counter(answers).most_common(1)` over
    extracted strings counts a failed extraction; when that bloc wins the vote is None (an
    invalid answer is never correct)."""
    if invalid not in INVALID_CHOICES:
        raise ValueError(f"invalid must be one of {INVALID_CHOICES}, got {invalid!r}")
    totals: dict[Hashable, float] = {}
    first: dict[Hashable, int] = {}
    for i, (key, weight) in enumerate(zip(keys, weights, strict=True)):
        if key is None:
            if invalid == "drop":
                continue
            key = _INVALID
        totals[key] = totals.get(key, 0.0) + float(weight)
        first.setdefault(key, i)
    if not totals:
        return None
    best = max(totals, key=lambda key: (totals[key], -first[key]))
    return None if best is _INVALID else first[best]
