"""Sampler ensembles: a pool whose rows mix sampler settings (temperatures and commit
orders), then any selector. Row i takes the i-th combination of temperature × order,
cycling, so the pool of n is the first n of any larger pool; all rows share one forward
per step. Cost: n·T, what Majority@n costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.core.errors import UserError
from dllmbench.plugins.strategies.independent import Independent


def _split(text: str) -> tuple[str, ...]:
    return tuple(part for part in str(text).split("/") if part)


@dataclass(frozen=True)
class EnsembleConfig:
    n: int = 6  # samples
    temperatures: str = "0.3/0.5/0.8"  # "/"-separated; "" keeps the backbone's
    # commit orders, "/"-separated values of the setting that picks the backbone's order
    # (Dream: `alg`; LLaDA, block: `remasking`); "auto": every order the backbone offers to
    # mix (`ops.commit_orders`); "none": the backbone's own
    orders: str = "auto"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for t in _split(self.temperatures):
            if float(t) < 0:
                raise ValueError(f"temperatures must be >= 0, got {t}")


class Ensemble(Independent):
    """n samples mixing temperatures and commit orders, one setting combination per row."""

    Config = EnsembleConfig
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1, "orders": "none"},
        {"n": 5, "temperatures": "0.5/1.0", "orders": "none"},
    ]

    def evidence(self) -> Evidence:
        return Evidence(nested="n")  # nested, but not the plain samples

    def sets_per_row(self) -> frozenset[str]:
        """Its temperatures (the commit orders it mixes are the backbone's own)."""
        return frozenset({"temperature"}) if _split(self.config.temperatures) else frozenset()

    def settings(self, ops: Ops) -> list[dict[str, object]]:
        mix = self.combinations(ops.commit_orders)
        return [mix[i % len(mix)] for i in range(self.config.n)]

    def combinations(self, commit_orders: Mapping[str, tuple[str, ...]]) -> list[dict[str, object]]:
        """Every (temperature, order) setting, in order: temperatures outermost."""
        temps = [{"temperature": float(t)} for t in _split(self.config.temperatures)] or [{}]
        orders: list[dict[str, object]] = [{}]
        name = next(iter(commit_orders), None)
        if self.config.orders == "auto":
            orders = [{name: o} for o in commit_orders[name]] if name else [{}]
        elif self.config.orders != "none":
            if name is None:
                raise UserError(
                    f"ensemble: orders={self.config.orders} but this backbone has no commit "
                    "order to vary per row; use orders=none"
                )
            orders = [{name: o} for o in _split(self.config.orders)]
        return [{**t, **o} for t, o in itertools.product(temps, orders)]


@hookimpl
def dllmbench_register_strategies(register):
    register("ensemble", Ensemble)
