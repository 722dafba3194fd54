"""Confidence-adaptive parallel decoding as a search strategy: n samples under Fast-dLLM's
parallel decoding rule (Wu et al., "Fast-dLLM: Training-free Acceleration of Diffusion LLM by
Enabling KV Cache and Parallel Decoding", arXiv 2505.22618; code NVlabs/Fast-dLLM) or
EB-Sampler's (Ben-Hamu et al., "Accelerated Sampling from Masked Diffusion Models via Entropy
Bounded Unmasking", arXiv 2505.24857), then any selector (the family votes).

Each row carries the sampler setting `threshold` τ (each step also commits every masked
position whose confidence is at least τ), `factor` f (Fast-dLLM's factor rule) or
`entropy_bound` γ (the most confident positions while their entropies, less the largest, sum
to at most γ); the backbone's sampler applies it (docs/backbones.md). A row ends once nothing
is left masked, usually well before its T, and is charged only the steps it took: the cost n·T
is a cap. Row i's setting depends on i alone (`thresholds` cycles over rows), so the pool of n
is the first n of any larger pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.plugins.strategies.independent import Independent

DEFAULT_THRESHOLD = 0.9  # Fast-dLLM's default confidence threshold


@dataclass(frozen=True)
class ThresholdConfig:
    n: int = 8  # samples
    # give one of the four (none: threshold 0.9): every row's confidence threshold τ, every
    # row's Fast-dLLM factor f, "/"-separated thresholds that row i takes cycling, or every
    # row's EB-Sampler entropy bound γ
    threshold: float | None = None
    factor: float | None = None
    thresholds: str = ""
    entropy_bound: float | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        given = [
            self.threshold is not None,
            self.factor is not None,
            bool(self.thresholds),
            self.entropy_bound is not None,
        ]
        if sum(given) > 1:
            raise ValueError("give one of threshold, factor, thresholds or entropy_bound")
        if not any(given):
            object.__setattr__(self, "threshold", DEFAULT_THRESHOLD)
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.thresholds:
            parse_thresholds(self.thresholds)
        if self.factor is not None and self.factor <= 0:
            raise ValueError(f"factor must be > 0, got {self.factor}")
        bound = self.entropy_bound
        number = isinstance(bound, (int, float)) and not isinstance(bound, bool)
        if bound is not None and not (number and 0 < bound < float("inf")):
            raise ValueError(f"entropy_bound must be a finite number > 0, got {bound!r}")


def parse_thresholds(text: str) -> tuple[float, ...]:
    """Thresholds written "0.7/0.8/0.9", each in (0, 1]."""
    try:
        taus = tuple(float(t) for t in str(text).split("/"))
    except ValueError:
        raise ValueError(f"thresholds must be numbers like 0.7/0.9, got {text!r}") from None
    if not all(0 < t <= 1 for t in taus):
        raise ValueError(f"thresholds must each be in (0, 1], got {text!r}")
    return taus


class Threshold(Independent):
    """n samples, each committing in parallel the positions its sampler is confident of."""

    Config = ThresholdConfig
    capped: ClassVar[bool] = True  # rows end early, charged the steps they took
    cost_formula: ClassVar[str] = "denoise: ≤ n·T"
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1},
        {"n": 5, "thresholds": "0.5/0.9"},
        {"n": 3, "factor": 1.0},
        {"n": 2, "entropy_bound": 0.1},
    ]

    def evidence(self) -> Evidence:
        return Evidence(nested="n")  # nested, but not at the run's own sampler settings

    def sets_per_row(self) -> frozenset[str]:
        c = self.config
        if c.factor is not None:
            return frozenset({"factor"})
        return frozenset({"entropy_bound" if c.entropy_bound is not None else "threshold"})

    def settings_by_config(self) -> list[dict[str, Any]]:
        """The settings its rows take in turn (`SettingsByConfig`): its config alone fixes
        them, so a run checks them against the backbone's Config before the model loads."""
        c = self.config
        if c.factor is not None:
            return [{"factor": c.factor}]
        if c.entropy_bound is not None:
            return [{"entropy_bound": c.entropy_bound}]
        if c.thresholds:
            return [{"threshold": tau} for tau in parse_thresholds(c.thresholds)]
        return [{"threshold": c.threshold}]

    def settings(self, ops: Ops) -> list[dict[str, Any]]:
        mix = self.settings_by_config()
        return [mix[i % len(mix)] for i in range(self.config.n)]


@hookimpl
def dllmbench_register_strategies(register):
    register("threshold", Threshold)
