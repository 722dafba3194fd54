"""Budget planner: each method family takes its largest configuration that fits the budget.

Method families (built-in and third-party alike) come from the registry, registered through
the `dllmbench_register_methods` hook. `all` (and no entry at all) means every family whose
strategy and selector are available.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dllmbench.errors import PluginError, UserError
from dllmbench.manager import MethodFamily
from dllmbench.method import Method, MethodSpec
from dllmbench.provenance import config_data
from dllmbench.registry import Registry


def half_steps(total_steps: int) -> int:
    """The guided families' segment length: two segments, as b=64 at the paper's T=128."""
    return max(1, total_steps // 2)


def default_budget(total_steps: int) -> int:
    """The headline budget: what PRM Guided K=8 with two segments spends (1040 at T=128)."""
    return 8 * total_steps + 8 * math.ceil(total_steps / half_steps(total_steps))


@dataclass
class Planned:
    method: Method
    cost: dict[str, int]

    @property
    def passes(self) -> int:
        return sum(self.cost.values())


@dataclass
class LeftOut:
    family: str
    reason: str
    min_budget: int | None = None
    missing: tuple[str, ...] = ()  # scorers the run lacks, when that is the reason


@dataclass
class Plan:
    budget: int
    total_steps: int
    methods: list[Planned] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "budget": self.budget,
            "steps": self.total_steps,
            "methods": [
                {
                    "id": p.method.id,
                    "family": p.method.family,
                    "spec": p.method.spec.text(),
                    "passes": p.passes,
                    "share": round(p.passes / self.budget, 4),
                    "cost": p.cost,
                    "ceiling": p.method.ceiling,
                }
                for p in self.methods
            ],
            "left_out": [
                {"family": x.family, "reason": x.reason, "min_budget": x.min_budget}
                for x in self.left_out
            ],
        }


def _label(template: str | None, method: Method) -> str:
    if template is None:
        return method.spec.text()
    try:
        return template.format(**config_data(method.strategy))
    except (KeyError, IndexError):
        return template


def _try_build(
    registry: Registry, spec: MethodSpec, label: str | None, family: str | None
) -> Method | PluginError:
    try:
        method = Method.build(registry, spec, family=family)
    except PluginError as exc:
        return exc  # e.g. a size the strategy's constraints rule out (k not divisible by keep)
    method.id = _label(label, method)
    return method


def fit(
    registry: Registry,
    spec: MethodSpec,
    label: str | None,
    family: str | None,
    budget: int,
    total_steps: int,
    passes_per_step: int = 1,
) -> tuple[Method | None, int | None]:
    """The largest configuration of `spec` costing at most `budget`, and the smallest cost.

    A free size that no size from 1 to budget + 1 accepts is the plugin's error.
    """
    free = spec.free_field()
    if free is None:
        method = Method.build(registry, spec, family=family)
        method.id = _label(label, method)
        cost = method.total_cost(total_steps, passes_per_step)
        return (method if cost <= budget else None), cost
    best, smallest, error = None, None, None
    for size in range(1, budget + 2):
        method = _try_build(registry, spec.with_size(size), label, family)
        if isinstance(method, PluginError):
            error = error or method
            continue
        cost = method.total_cost(total_steps, passes_per_step)
        if smallest is None:
            smallest = cost
        if cost > budget:
            break
        best = method
    if smallest is None and error is not None:
        raise error
    return best, smallest


ALL = "all"


def family_spec(family: MethodFamily, total_steps: int) -> MethodSpec:
    return MethodSpec.parse(family.spec.format(half=half_steps(total_steps)))


def available_families(registry: Registry, total_steps: int) -> list[str]:
    """Every registered family whose strategy and selector are registered and not broken."""
    have = {kind: set(registry.names(kind)) for kind in ("strategy", "selector")}
    names = []
    for family in registry.families():
        spec = family_spec(family, total_steps)
        if spec.strategy in have["strategy"] and spec.selector in have["selector"]:
            names.append(family.name)
    return names


def expand(registry: Registry, entries: list[str] | None, total_steps: int) -> dict[str, bool]:
    """Entry → whether it was asked for by name: `all` (or no entries) adds every available
    family, not asked for by name, so one that lacks a scorer is only left out."""
    out: dict[str, bool] = {}
    for entry in entries or [ALL]:
        for name in available_families(registry, total_steps) if entry == ALL else [entry]:
            out[name] = out.get(name, False) or entry != ALL
    return out


def _spec(
    registry: Registry, entry: str, total_steps: int
) -> tuple[MethodSpec, MethodFamily | None]:
    """The method spec of a family name or a spec text, its plugins and options checked."""
    family = registry.family(entry)
    if family is not None:
        return family_spec(family, total_steps), family
    if not (":" in entry or "+" in entry or entry in registry.names("strategy")):
        known = ", ".join(f.name for f in registry.families())
        raise UserError(
            f"unknown method {entry!r}; families: {known}, or all; or a spec such as "
            "independent:n=8+majority"
        )
    spec = MethodSpec.parse(entry)
    free = spec.free_field()
    registry.coerce(
        "strategy", spec.strategy, spec.strategy_config, unchecked=[free] if free else ()
    )
    registry.coerce("selector", spec.selector, spec.selector_config)
    return spec, None


@dataclass(frozen=True)
class Use:
    """An entry whose methods use a scorer; `named` when asked for by name (not by `all`)."""

    entry: str
    named: bool

    def __str__(self) -> str:
        return self.entry


def scorer_users(
    registry: Registry, entries: list[str] | None, total_steps: int
) -> dict[str, list[Use]]:
    """Scorer name → the entries (families or specs) whose methods use it."""
    users: dict[str, list[Use]] = {}
    for entry, named in expand(registry, entries, total_steps).items():
        spec, _ = _spec(registry, entry, total_steps)
        method = None  # which scorers a method uses does not depend on its size: any will do
        for size in range(1, 65) if spec.free_field() else (0,):
            method = _try_build(registry, spec.with_size(size), None, None)
            if isinstance(method, Method):
                break
        if isinstance(method, PluginError):
            raise method
        for scorer in sorted(method.scorers()):
            users.setdefault(scorer, []).append(Use(entry, named))
    return users


def check_scorers(users: dict[str, list[Use]], scorers: set[str], requested: bool) -> None:
    """With `users` from `scorer_users`: a requested method whose scorer the run lacks, or a
    scorer no method uses, is an error (with no methods requested, families lacking a scorer
    are only left out, as are the families `all` adds)."""
    for scorer, uses in sorted(users.items()) if requested else ():
        named = [u.entry for u in uses if u.named]
        if scorer not in scorers and named:
            raise UserError(
                f"method {named[0]!r} needs scorer {scorer}, which the run does not have; "
                f"give --scorer {scorer}=PLUGIN[:checkpoint=DIR] or drop the method"
            )
    for name in sorted(scorers):
        if name not in users:
            used = "; ".join(f"{s} by {', '.join(map(str, u))}" for s, u in sorted(users.items()))
            raise UserError(
                f"no requested method uses scorer {name!r}; "
                + (
                    f"scorers in use: {used}"
                    if used
                    else f"none uses a scorer; drop --scorer {name}"
                )
            )


def plan(
    registry: Registry,
    budget: int,
    total_steps: int,
    entries: list[str] | None = None,
    scorers: set[str] | None = None,
    passes_per_step: int = 1,
) -> Plan:
    """Choose every method for `budget`. `entries` are family names, `all` or method specs.

    With `scorers` given, families that need a scorer outside it are left out.
    """
    if budget < 1:
        raise UserError(f"--budget must be a positive number of passes, got {budget}")
    result = Plan(budget, total_steps)
    named = expand(registry, entries, total_steps)
    for entry, spec, family in [(e, *_spec(registry, e, total_steps)) for e in named]:
        label, name = (family.label, family.name) if family else (None, None)
        method, smallest = fit(registry, spec, label, name, budget, total_steps, passes_per_step)
        if method is None:
            at_least = f"; needs a budget of at least {smallest}" if smallest else ""
            result.left_out.append(
                LeftOut(entry, f"does not fit {budget} passes{at_least}", smallest)
            )
            continue
        missing = tuple(sorted(method.scorers() - scorers)) if scorers is not None else ()
        if missing:
            reason = f"needs scorer {', '.join(missing)}"
            result.left_out.append(LeftOut(entry, reason, missing=missing if named[entry] else ()))
            continue
        if any(p.method.id == method.id for p in result.methods):
            continue
        result.methods.append(Planned(method, method.cost(total_steps, passes_per_step)))
    return result
