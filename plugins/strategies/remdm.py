"""ReMDM: remasking during sampling (Wang, Schiff, Sahoo, Kuleshov, "Remasking Discrete
Diffusion Models with Inference-Time Scaling", arXiv 2503.00307; code kuleshov-group/remdm).

n independent samples, each over T + `extra` steps (the row's own T: more steps, more
compute, charged). On the grid t_k = 1 − k/T', α_t = 1 − t the fraction decoded, before
step k ≥ 1 every committed generated position is re-masked with probability σ_k (a canvas
edit keyed by the row, so paired across methods), and the sampler decodes it again:

- `cap`: σ_k = min(η, (1 − α_s) / α_t) with t = t_k, s = t_{k+1} (the paper's ReMDM-cap);
- `loop`: σ_k = η while t_k lies in [t_off, t_on], none outside (ReMDM-loop's phase of
  constant-rate remasking; here the loop's extra steps stretch the sampler's own grid,
  which a confidence sampler cannot hold at one noise level).

The last step re-masks nothing, so every candidate ends fully decoded. Pools nest (row i is
the same in any larger pool). Cost: n·(T + extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem

Schedule = Literal["cap", "loop"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)


@dataclass(frozen=True)
class ReMDMConfig:
    n: int = 1  # independent samples
    schedule: Schedule = "cap"
    eta: float = 0.02  # η: the cap on σ (cap), the constant σ (loop)
    extra: int = 0  # steps beyond T each sample takes (the paper's inference-time scaling)
    t_on: float = 0.55  # loop: remask while t ∈ [t_off, t_on]
    t_off: float = 0.05

    def __post_init__(self) -> None:
        if self.n < 1 or self.extra < 0:
            raise ValueError("need n >= 1 and extra >= 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be cap or loop, got {self.schedule!r}")
        if not 0 <= self.eta <= 1:
            raise ValueError(f"eta must be in [0, 1], got {self.eta}")
        if not 0 <= self.t_off <= self.t_on <= 1:
            raise ValueError("need 0 <= t_off <= t_on <= 1")


def sigmas(config: ReMDMConfig, total: int) -> list[float]:
    """σ_k for k = 0 … total−1: the remasking probability before step k (0 at k = 0, where
    nothing is decoded, before the last step, and wherever the schedule does not remask)."""
    out = []
    for k in range(total):
        t, s = 1 - k / total, 1 - (k + 1) / total
        if k in (0, total - 1):
            out.append(0.0)
        elif config.schedule == "cap":
            out.append(min(config.eta, s / (1 - t)))  # (1 − α_s) / α_t
        else:
            out.append(config.eta if config.t_off <= t <= config.t_on else 0.0)
    return out


class ReMDM:
    """n samples that re-mask decoded tokens with probability σ_t during sampling."""

    Config = ReMDMConfig
    cost_formula: ClassVar[str] = "denoise: n·(T + extra)"
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1},
        {"n": 4, "eta": 0.3},
        {"n": 3, "schedule": "loop", "eta": 0.5, "extra": 2},
    ]
    prefix_field: ClassVar[str | None] = "n"
    scorers: tuple[str, ...] = ()

    def __init__(self, **config):
        self.config = ReMDMConfig(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.config.n * (total_steps + self.config.extra)}

    def pool_size(self) -> int:
        return self.config.n

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    def evidence(self) -> Evidence:
        return Evidence(nested="n")

    def sets_per_row(self) -> frozenset[str]:
        return frozenset({"steps"}) if self.config.extra else frozenset()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        total = ops.T + self.config.extra
        settings = {"steps": total} if self.config.extra else None
        rows = ops.start(problem, copies=self.config.n, settings=settings)
        for sigma in sigmas(self.config, total):
            if sigma > 0:
                rows = ops.remask(rows, sigma=sigma, label="remdm")
            rows = await ops.denoise(rows, steps=1)
        return ops.pool(rows)


@hookimpl
def dllmbench_register_strategies(register):
    register("remdm", ReMDM)
