"""Independent sampling: n trajectories from fully masked canvases, no guidance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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

    Config = IndependentConfig
    cost_formula: ClassVar[str] = "denoise: n·T"
    contract_configs: ClassVar[list[dict]] = [{"n": 1}, {"n": 5}]
    prefix_field: ClassVar[str | None] = "n"
    scorers: tuple[str, ...] = ()

    def __init__(self, **config: int):
        self.config = IndependentConfig(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.config.n * total_steps}

    def evidence(self) -> Evidence:
        return Evidence(nested="n", plain=True)

    def pool_size(self) -> int:
        return self.config.n

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        rows = ops.start(problem, copies=self.config.n)
        rows = await ops.denoise(rows, steps=ops.T)
        return ops.pool(rows)


@hookimpl
def dllmbench_register_strategies(register):
    register("independent", Independent)
