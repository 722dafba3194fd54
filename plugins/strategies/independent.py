"""Independent sampling: n trajectories from fully masked canvases, no guidance.

`Independent` is also the shape of every strategy that draws n samples, each with sampler
settings of its own (HEX's block lengths, an ensemble's temperatures): such a strategy only
says, in `settings(ops)`, what row i sets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.types import Pool, Problem


@dataclass(frozen=True)
class IndependentConfig:
    n: int = 1  # number of independent trajectories

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


class Independent:
    """N samples, each T steps. Pools nest: the pool of n is the first n of any larger pool."""

    Config: ClassVar[type] = IndependentConfig
    cost_formula: ClassVar[str] = "denoise: n·T"
    contract_configs: ClassVar[list[dict]] = [{"n": 1}, {"n": 5}]
    prefix_field: ClassVar[str | None] = "n"
    scorers: tuple[str, ...] = ()

    def __init__(self, **config):
        self.config = self.Config(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.config.n * total_steps}

    def evidence(self) -> Evidence:
        return Evidence(nested="n", plain=True)

    def pool_size(self) -> int:
        return self.config.n

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    def settings(self, ops: Ops) -> list[dict[str, Any]] | None:
        """Each row's own sampler settings (None: every row at the backbone's)."""
        return None

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        rows = ops.start(problem, copies=self.config.n, settings=self.settings(ops))
        rows = await ops.denoise(rows)
        return ops.pool(rows)


@hookimpl
def dllmbench_register_strategies(register):
    register("independent", Independent)
