"""A method: one strategy, one selector and the scorers they use — one leaderboard row.

Methods are written as specs: `strategy[:key=value,...][+selector[:key=value,...]]`, e.g.
`independent:n=8+argmax:scorer=orm`. A value `*` marks the size the planner chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dllmbench.api.interfaces import SearchStrategy, Selector, evidence_of, pool_size_of
from dllmbench.core.errors import PluginViolation, UserError, blame
from dllmbench.core.numbers import ascii_float, ascii_int
from dllmbench.core.schema import EvidenceEntry, MethodEntry, PluginEntry
from dllmbench.loading.provenance import config_data
from dllmbench.loading.registry import Registry

FREE = "*"


def _value(text: str) -> Any:
    if text == FREE:
        return FREE
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (ascii_int, ascii_float):  # `2_08` and `٢٠٨` stay text: not a number
        value = cast(text)
        if value is not None:
            return value
    return text


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_part(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.strip().partition(":")
    if not name:
        raise UserError(f"method spec part {text!r} has no plugin name; e.g. independent:n=8")
    config: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"method spec option {item!r} is not key=value; e.g. n=8")
        if key.strip() in config:
            raise UserError(
                f"option {key.strip()!r} is given twice in {text.strip()!r}; give each option once"
            )
        config[key.strip()] = _value(value.strip())
    return name.strip(), config


@dataclass(frozen=True)
class MethodSpec:
    """A strategy and a selector by name, with their configuration."""

    strategy: str
    strategy_config: dict[str, Any] = field(default_factory=dict)
    selector: str = "first"
    selector_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        parts = text.split("+")
        if len(parts) > 2:
            raise UserError(
                f"method spec {text!r} has more than one '+'; "
                "write strategy[:k=v,...][+selector[:k=v,...]]"
            )
        strategy, sconf = parse_part(parts[0])
        selector, selconf = parse_part(parts[1]) if len(parts) == 2 else ("first", {})
        return cls(strategy, sconf, selector, selconf)

    def free_field(self) -> str | None:
        free = [k for k, v in self.strategy_config.items() if v == FREE]
        if len(free) > 1:
            raise UserError(f"method spec {self.text()!r} leaves more than one size free")
        return free[0] if free else None

    def with_size(self, size: int) -> MethodSpec:
        key = self.free_field()
        if key is None:
            return self
        return MethodSpec(
            self.strategy,
            {**self.strategy_config, key: size},
            self.selector,
            dict(self.selector_config),
        )

    def text(self) -> str:
        def fmt(name: str, config: dict[str, Any]) -> str:
            opts = ",".join(f"{k}={_format_value(v)}" for k, v in config.items())
            return f"{name}:{opts}" if opts else name

        return (
            f"{fmt(self.strategy, self.strategy_config)}+{fmt(self.selector, self.selector_config)}"
        )


@dataclass
class Method:
    """A built method, ready to run."""

    id: str
    spec: MethodSpec
    strategy: SearchStrategy
    selector: Selector
    family: str | None = None
    budgets: tuple[int, ...] = ()  # the budgets the planner planned it at, ascending
    distribution: str | None = None  # that registered its strategy, named when it errs

    @classmethod
    def build(
        cls,
        registry: Registry,
        spec: MethodSpec,
        label: str | None = None,
        family: str | None = None,
    ) -> Method:
        if spec.free_field() is not None:
            raise UserError(
                f"method {spec.text()!r} has a free size '*'; give --budget to "
                "choose it or write a number"
            )
        strategy = registry.strategy(spec.strategy, **spec.strategy_config)
        selector = registry.selector(spec.selector, **spec.selector_config)
        distribution = registry.info("strategy", spec.strategy).distribution
        return cls(label or spec.text(), spec, strategy, selector, family, (), distribution)

    @property
    def ceiling(self) -> bool:
        return bool(self.selector.ceiling)

    def scorers(self) -> set[str]:
        return set(self.strategy.scorers) | set(self.selector.needs)

    def selector_scoring(self) -> tuple[str, ...]:
        """Scorers the selector needs that the strategy's pool does not already carry."""
        have = self.strategy.pool_scores()
        return tuple(s for s in self.selector.needs if s not in have)

    def cost(self, total_steps: int, passes_per_step: int = 1) -> dict[str, int]:
        """Declared passes per problem by kind.

        `passes_per_step` is the backbone's forwards per row-step (2 with classifier-free
        guidance); it multiplies the denoising passes.
        """
        cost = self._declared_cost(total_steps)
        if "denoise" in cost:
            cost["denoise"] *= passes_per_step
        for scorer in self.selector_scoring():
            kind = f"score:{scorer}"
            cost[kind] = cost.get(kind, 0) + pool_size_of(self.strategy, total_steps)
        return {k: v for k, v in sorted(cost.items()) if v}

    def _declared_cost(self, total_steps: int) -> dict[str, int]:
        """The strategy's `cost(T)`, held to its type: a dict of pass kinds to whole numbers
        >= 0 (else its broken contract, one line)."""
        with blame("strategy", self.spec.strategy, self.distribution):
            cost = self.strategy.cost(total_steps)
        if not isinstance(cost, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in cost.items()
        ):
            what = (
                f"cost({total_steps}) returned {cost!r}, not a dict of pass kinds to whole "
                'numbers >= 0 (e.g. {"denoise": n * T})'
            )
            raise PluginViolation(self.spec.strategy, self.distribution, what)
        return dict(cost)

    def total_cost(self, total_steps: int, passes_per_step: int = 1) -> int:
        return sum(self.cost(total_steps, passes_per_step).values())

    def manifest_entry(self, cost: dict[str, int]) -> MethodEntry:
        """The method as the manifest records it, planned at `cost` (the runner adds how it
        is planned and where its plugins came from)."""
        return MethodEntry(
            id=self.id,
            family=self.family,
            spec=self.spec.text(),
            strategy=PluginEntry(name=self.spec.strategy, config=config_data(self.strategy)),
            selector=PluginEntry(name=self.spec.selector, config=config_data(self.selector)),
            ceiling=self.ceiling,
            evidence=EvidenceEntry(**evidence_of(self.strategy).as_dict()),
            cost=cost,
        )
