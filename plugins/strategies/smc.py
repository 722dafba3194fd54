"""Sequential Monte Carlo over denoising trajectories, guided by a PRM.

K particles; at each checkpoint (every `every` steps) h = sigmoid(PRM logit), clipped. At an
intermediate checkpoint the tempering exponent β is the largest value on the grid
{0, step, ..., 1} whose incremental weights keep ESS ≥ `ess_fraction`·K (0.5·K: 4 at K=8, 16
at K=32); the target there is p·h^β, so the incremental weight is h^β / h_prev^β_prev. When
ESS falls below `resample_fraction`·K (0.75·K: 6 at K=8, 24 at K=32) the particles are
resampled systematically and weights reset to uniform. Both thresholds scale with K, so that
SMC tempers and resamples at K=32 as it does at K=8.
The final checkpoint is untempered: w ∝ w_prev · h_final / h_prev[ancestor]^β_prev.
Cost: K·T denoising passes plus K scoring passes per checkpoint.
Each checkpoint's step, mask ratios, β, ESS, weights and resampling go to the pool's `info`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from scipy.special import expit, logsumexp

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem, Rows


@dataclass(frozen=True)
class SMCConfig:
    k: int = 8  # particles
    every: int = 64  # steps between checkpoints
    scorer: str = "prm"
    ess_fraction: float = 0.5  # tempering keeps ESS at least this fraction of k
    resample_fraction: float = 0.75  # resample when ESS falls below this fraction of k
    beta_step: float = 0.05  # grid spacing of the tempering exponent
    clip: float = 1e-6  # h is clipped to [clip, 1 - clip]

    def __post_init__(self) -> None:
        if self.k < 1 or self.every < 1:
            raise ValueError("k and every must be >= 1")
        if not 0 < self.ess_fraction <= 1 or not 0 <= self.resample_fraction <= 1:
            raise ValueError("ess_fraction must be in (0, 1] and resample_fraction in [0, 1]")
        if not 0 < self.beta_step <= 1:
            raise ValueError("beta_step must be in (0, 1]")
        if not 0 < self.clip < 0.5:
            raise ValueError("clip must be in (0, 0.5)")


def ess(log_w: np.ndarray) -> float:
    """Effective sample size of unnormalised log weights."""
    w = np.exp(log_w - logsumexp(log_w))
    return float(1.0 / np.sum(w * w))


def choose_beta(
    log_w: np.ndarray, log_h: np.ndarray, prev: np.ndarray, grid: np.ndarray, target: float
) -> float:
    """The largest β on the grid with ESS(w · h^β / prev) ≥ target (else the smallest)."""
    for beta in grid[::-1]:
        if ess(log_w + beta * log_h - prev) >= target:
            return float(beta)
    return float(grid[0])


def systematic(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Systematic resampling: one uniform offset, K evenly spaced positions."""
    k = len(weights)
    positions = (rng.uniform() + np.arange(k)) / k
    cumulative = np.cumsum(weights)
    cumulative[-1] = 1.0
    return np.searchsorted(cumulative, positions)


INFO_KEYS = ("beta", "ess", "resampled", "step", "mask", "weights", "ancestors")


@dataclass
class CheckpointLog:
    """What each checkpoint leaves for diagnostics, in `Pool.info`: the step, each particle's
    mask ratio, β, ESS and normalized weights before resampling; then (except at the last)
    whether it resampled and each particle's ancestor (itself when it did not)."""

    ops: Ops
    info: dict[str, list] = field(default_factory=lambda: {key: [] for key in INFO_KEYS})

    def checkpoint(self, particles: Rows, beta: float, log_w: np.ndarray) -> float:
        """Record one checkpoint; returns its ESS as recorded (rounded to 6 digits)."""
        self.info["step"].append(int(particles.steps[0]))
        self.info["mask"].append(_rounded(self.ops.mask_ratio(particles)))
        self.info["beta"].append(beta)
        self.info["ess"].append(round(ess(log_w), 6))
        self.info["weights"].append(_rounded(np.exp(log_w)))
        return self.info["ess"][-1]

    def resampling(self, resampled: bool, ancestors: np.ndarray) -> None:
        self.info["resampled"].append(bool(resampled))
        self.info["ancestors"].append([int(a) for a in ancestors])


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]


class SMC:
    """K particles reweighted by a tempered PRM every `every` steps, resampled on low ESS."""

    Config = SMCConfig
    cost_formula: ClassVar[str] = "denoise: k·T; score:<scorer>: k·ceil(T / every)"
    contract_configs: ClassVar[list[dict]] = [
        {"k": 6, "every": 4, "ess_fraction": 0.25, "resample_fraction": 0.9},
        {"k": 4, "every": 64},
    ]
    prefix_field: ClassVar[str | None] = None

    def __init__(self, **config):
        self.config = SMCConfig(**config)
        self.scorers = (self.config.scorer,)
        n = round(1 / self.config.beta_step)
        self._grid = np.round(np.linspace(0.0, 1.0, n + 1), 10)

    @property
    def thresholds(self) -> tuple[float, float]:
        """(ESS the tempering keeps, ESS below which particles are resampled)."""
        c = self.config
        return c.ess_fraction * c.k, c.resample_fraction * c.k

    def cost(self, total_steps: int) -> dict[str, int]:
        c = self.config
        return {
            "denoise": c.k * total_steps,
            f"score:{c.scorer}": c.k * math.ceil(total_steps / c.every),
        }

    def evidence(self) -> Evidence:
        return Evidence(particles=self.config.scorer)

    def pool_size(self) -> int:
        return self.config.k

    def pool_scores(self) -> frozenset[str]:
        return frozenset(self.scorers)

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        c = self.config
        ess_target, resample_below = self.thresholds
        particles = ops.start(problem, copies=c.k)  # K independent samples
        log_w = np.full(c.k, -math.log(c.k))
        prev = np.zeros(c.k)  # log h_prev^β_prev of each particle's ancestor
        log = CheckpointLog(ops)
        segments = ops.segments(c.every)
        for i, steps in enumerate(segments):
            particles = await ops.denoise(particles, steps)
            logits = np.asarray(await ops.score(particles, c.scorer), np.float64)
            if np.isnan(logits).any():
                raise ValueError(f"scorer {c.scorer!r} returned NaN")
            log_h = np.log(np.clip(expit(logits), c.clip, 1 - c.clip))
            last = i == len(segments) - 1
            beta = 1.0 if last else choose_beta(log_w, log_h, prev, self._grid, ess_target)
            log_w = log_w + beta * log_h - prev
            log_w -= logsumexp(log_w)
            ess_now = log.checkpoint(particles, beta, log_w)  # as recorded: rounded
            if last:
                return ops.pool(
                    particles,
                    scores={c.scorer: np.asarray(logits)},
                    weights=np.exp(log_w),
                    info=log.info,
                )
            prev = beta * log_h
            resample = ess_now < resample_below
            ancestors = np.arange(c.k)  # each particle is its own ancestor unless resampled
            if resample:
                ancestors = systematic(np.exp(log_w), ops.rng(f"smc-resample-{i}"))
                particles, prev = particles.take(ancestors), prev[ancestors]
                log_w = np.full(c.k, -math.log(c.k))
            log.resampling(resample, ancestors)
            particles = particles.fork()
        raise AssertionError("unreachable: T >= 1 gives at least one checkpoint")


@hookimpl
def dllmbench_register_strategies(register):
    register("smc", SMC)
