"""Voting over extracted answers: plain majority and weighted majority.

Invalid answers (extraction failed) never vote by default. Ties go to the answer that appears
first; the chosen candidate is the first one holding the winning answer. With no valid answer
the selector returns None, which counts as wrong.

`majority:invalid=vote` counts the invalid answers as one more answer, as the paper's scripts
did (`Counter(answers).most_common(1)` over extracted strings, a failed extraction being the
string "None"): they vote as one bloc, ties still go to the answer seen first, and when the
bloc wins the selector returns None (wrong). The default, `invalid=drop`, keeps them out: a
failed extraction is not an answer the model gave, and counting it lets a pile of unparseable
outputs outvote a real answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from scipy.special import expit

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.types import Candidate
from dllmbench.core.voting import Invalid
from dllmbench.core.voting import vote as vote_keys


def vote(
    candidates: Sequence[Candidate], weights: Sequence[float], invalid: Invalid = "drop"
) -> int | None:
    """Index of the first candidate of the answer with the largest total weight."""
    return vote_keys([c.answer_key for c in candidates], weights, invalid)


@dataclass(frozen=True)
class MajorityConfig:
    # "drop": invalid answers (extraction failed) never vote; "vote": they vote as one bloc,
    # which can win, and then the choice is None (wrong), as the paper's scripts counted them
    invalid: Literal["drop", "vote"] = "drop"


class Majority:
    """The most frequent valid answer (with invalid=vote: the most frequent answer, a failed
    extraction counting as one answer that is never correct)."""

    Config = MajorityConfig
    contract_configs: ClassVar[list[dict]] = [{}, {"invalid": "vote"}]
    needs: tuple[str, ...] = ()
    ceiling = False

    def __init__(self, **config):
        self.config = MajorityConfig(**config)

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        return vote(candidates, [1.0] * len(candidates), self.config.invalid)


@dataclass(frozen=True)
class WeightedMajorityConfig:
    # a scorer name (each vote weighs sigmoid(score)), or "weight" for the pool's own
    # weights (SMC's importance weights)
    by: str = "orm"


class WeightedMajority:
    """The valid answer with the largest summed weight."""

    Config = WeightedMajorityConfig
    contract_configs: ClassVar[list[dict]] = [{"by": "orm"}, {"by": "weight"}]
    ceiling = False

    def __init__(self, **config):
        self.config = WeightedMajorityConfig(**config)
        self.needs = () if self.config.by == "weight" else (self.config.by,)

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        if self.config.by == "weight":
            if any(c.weight is None for c in candidates):
                raise ValueError("weighted_majority by=weight needs a pool with weights (smc)")
            weights = [c.weight for c in candidates]
        else:
            weights = expit(np.array([c.scores[self.config.by] for c in candidates], np.float64))
        return vote(candidates, list(weights))


@hookimpl
def dllmbench_register_selectors(register):
    register("majority", Majority)
    register("weighted_majority", WeightedMajority)
