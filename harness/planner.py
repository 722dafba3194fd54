"""Budget planner: each method family takes its largest configuration that fits the budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dllmbench.errors import PluginError, UserError
from dllmbench.method import Method, MethodSpec
from dllmbench.registry import Registry, describe


@dataclass(frozen=True)
class Family:
    """A method template whose free size (`*`) the planner chooses."""

    name: str
    label: str  # formatted with the strategy's configuration, e.g. "ORM Rerank@{n}"
    spec: str  # "{half}" stands for T // 2, the segment length of the guided families


FAMILIES: tuple[Family, ...] = (
    Family("vanilla", "Vanilla", "independent:n=1+first"),
    Family("majority", "Majority@{n}", "independent:n=*+majority"),
    Family("orm_rerank", "ORM Rerank@{n}", "independent:n=*+argmax:scorer=orm"),
    Family(
        "weighted_majority", "Weighted Majority@{n}", "independent:n=*+weighted_majority:by=orm"
    ),
    Family("prm_rerank", "PRM Rerank@{n}", "independent:n=*+argmax:scorer=prm"),
    Family("random_rerank", "Random Rerank@{n}", "independent:n=*+random"),
    Family(
        "prm_guided",
        "PRM Guided K={k} b={every}",
        "prm_guided:k=*,every={half},final=keep+argmax:scorer=prm",
    ),
    Family(
        "top_m", "Top-{keep} Retention K={k} b={every}", "prm_guided:k=*,every={half},keep=2+first"
    ),
    Family(
        "prm_hybrid",
        "PRM Hybrid K={k} b={every} + Majority",
        "prm_guided:k=*,every={half},final=keep+majority",
    ),
    Family(
        "smc_vote",
        "SMC K={k} b={every} (weighted vote)",
        "smc:k=*,every={half}+weighted_majority:by=weight",
    ),
    Family(
        "smc_top", "SMC K={k} b={every} (top particle)", "smc:k=*,every={half}+argmax:scorer=prm"
    ),
    Family("oracle", "Oracle@{n}", "independent:n=*+oracle"),
    Family(
        "hybrid_oracle",
        "Oracle of PRM Hybrid K={k} b={every}",
        "prm_guided:k=*,every={half},final=keep+oracle",
    ),
)

FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


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
        return template.format(**describe(method.strategy))
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


def _spec(registry: Registry, entry: str, total_steps: int) -> tuple[MethodSpec, Family | None]:
    """The method spec of a family name or a spec text, its plugins and options checked."""
    family = FAMILY_BY_NAME.get(entry)
    if family is not None:
        return MethodSpec.parse(family.spec.format(half=half_steps(total_steps))), family
    if not (":" in entry or "+" in entry or entry in registry.names("strategy")):
        known = ", ".join(FAMILY_BY_NAME)
        raise UserError(
            f"unknown method {entry!r}; families: {known}; or a spec such as "
            "independent:n=8+majority"
        )
    spec = MethodSpec.parse(entry)
    free = spec.free_field()
    registry.coerce(
        "strategy", spec.strategy, spec.strategy_config, unchecked=[free] if free else ()
    )
    registry.coerce("selector", spec.selector, spec.selector_config)
    return spec, None


def scorer_users(
    registry: Registry, entries: list[str] | None, total_steps: int
) -> dict[str, list[str]]:
    """Scorer name → the entries (families or specs) whose methods use it."""
    users: dict[str, list[str]] = {}
    for entry in entries or [f.name for f in FAMILIES]:
        spec, _ = _spec(registry, entry, total_steps)
        method = None  # which scorers a method uses does not depend on its size: any will do
        for size in range(1, 65) if spec.free_field() else (0,):
            method = _try_build(registry, spec.with_size(size), None, None)
            if isinstance(method, Method):
                break
        if isinstance(method, PluginError):
            raise method
        for scorer in sorted(method.scorers()):
            users.setdefault(scorer, []).append(entry)
    return users


def check_scorers(users: dict[str, list[str]], scorers: set[str], requested: bool) -> None:
    """With `users` from `scorer_users`: a requested method whose scorer the run lacks, or a
    scorer no method uses, is an error (with no methods requested, families lacking a scorer
    are only left out)."""
    for scorer, entries in sorted(users.items()) if requested else ():
        if scorer not in scorers:
            raise UserError(
                f"method {entries[0]!r} needs scorer {scorer}, which the run does not have; "
                f"give --scorer {scorer}=PLUGIN[:checkpoint=DIR] or drop the method"
            )
    for name in sorted(scorers):
        if name not in users:
            used = "; ".join(f"{s} by {', '.join(e)}" for s, e in sorted(users.items()))
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
    """Choose every method for `budget`. `entries` are family names or method specs.

    With `scorers` given, families that need a scorer outside it are left out.
    """
    if budget < 1:
        raise UserError(f"--budget must be a positive number of passes, got {budget}")
    result = Plan(budget, total_steps)
    specs = [(entry, *_spec(registry, entry, total_steps)) for entry in entries or FAMILY_BY_NAME]
    for entry, spec, family in specs:
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
            result.left_out.append(
                LeftOut(entry, f"needs scorer {', '.join(missing)}", missing=missing)
            )
            continue
        if any(p.method.id == method.id for p in result.methods):
            continue
        result.methods.append(Planned(method, method.cost(total_steps, passes_per_step)))
    return result
