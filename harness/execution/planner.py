"""Budget planner: each method family takes its largest configuration that fits the budget.

Method families (built-in and third-party alike) come from the registry, registered through
the `dllmbench_register_methods` hook. `all` (and no entry at all) means every family whose
strategy and selector are available. Several budgets plan every entry at each budget; a method
planned identically at two budgets is one method carrying both (`Method.budgets`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dllmbench.api.interfaces import (
    RefusesRowSettings,
    is_capped,
    reads_predictions,
    reports_predictions,
    row_refusal,
    row_settings,
    row_settings_line,
    sets_per_row,
    settings_by_config,
)
from dllmbench.core.errors import PluginError, UserError
from dllmbench.core.flops import Flops, format_flops, unit_of
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.manager import MethodFamily
from dllmbench.loading.provenance import config_data
from dllmbench.loading.registry import Registry


def half_steps(total_steps: int) -> int:
    """The guided families' segment length: two segments, as b=64 at the paper's T=128."""
    return max(1, total_steps // 2)


def default_budget(total_steps: int) -> int:
    """The headline budget: what PRM Guided K=8 with two segments spends (1040 at T=128)."""
    return 8 * total_steps + 8 * math.ceil(total_steps / half_steps(total_steps))


def planned_flops(cost: Mapping[str, int], rates: Mapping[str, int]) -> int:
    """FLOPs per problem of a cost in passes by kind, at `rates` (FLOPs per pass by kind)."""
    return sum(n * rates[kind] for kind, n in cost.items())


@dataclass
class Planned:
    method: Method
    cost: dict[str, int]
    flops: int | None = None  # per problem at the run's reference row (`rates`), when known
    early: bool = False  # the backbone's rows may end before their T (`ends_early`)

    @property
    def passes(self) -> int:
        return sum(self.cost.values())

    @property
    def capped(self) -> bool:
        """Whether the cost is a cap the method may stay under: its strategy's, or every
        method's on a backbone whose rows may end early."""
        return is_capped(self.method.strategy) or self.early

    @property
    def budgets(self) -> list[int]:
        """The budgets the method is planned at, ascending."""
        return list(self.method.budgets)


@dataclass
class LeftOut:
    family: str
    reason: str
    min_budget: int | None = None
    missing: tuple[str, ...] = ()  # scorers the run lacks, when that is the reason
    budget: int | None = None  # the budget it does not fit; None when that is not the reason


@dataclass
class Plan:
    budget: int  # the largest budget
    total_steps: int
    methods: list[Planned] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)  # ascending; [budget] for one budget
    unit: str = "passes"  # of the budgets: "passes" or "flops"
    rates: dict[str, int] | None = None  # FLOPs per pass by kind at the reference row

    def __post_init__(self) -> None:
        self.budgets = self.budgets or [self.budget]

    def spend(self, planned: Planned) -> int | None:
        """What a planned method spends per problem in the budgets' unit."""
        return planned.flops if self.unit == "flops" else planned.passes

    def at(self, budget: int) -> list[Planned]:
        """The methods planned at `budget`, in plan order."""
        return [p for p in self.methods if budget in p.method.budgets]

    def as_dict(self) -> dict[str, object]:
        return {
            "budget": self.budget,
            "budgets": self.budgets,
            "unit": self.unit,
            "steps": self.total_steps,
            "rates": self.rates,
            "methods": [
                {
                    "id": p.method.id,
                    "family": p.method.family,
                    "spec": p.method.spec.text(),
                    "budgets": p.budgets,
                    "passes": p.passes,
                    "flops": p.flops,
                    # of the smallest budget the method is planned at, in its unit
                    "share": round((self.spend(p) or 0) / p.budgets[0], 4),
                    # of that budget, what the plan leaves unspent
                    "unused": p.budgets[0] - (self.spend(p) or 0),
                    "cost": p.cost,
                    "capped": p.capped,
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


Measure = Callable[[Method], int]  # what a method spends per problem, in the budget's unit


def fit(
    registry: Registry,
    spec: MethodSpec,
    label: str | None,
    family: str | None,
    budget: int,
    total_steps: int,
    passes_per_step: int = 1,
    measure: Measure | None = None,
    passes: int | None = None,
) -> tuple[Method | None, int | None]:
    """The largest configuration of `spec` costing at most `budget`, and the smallest cost,
    each by `measure` (default: passes per problem); `passes`: the most passes the budget
    can buy (default: the budget itself, a budget of passes).

    Costs grow with the size, so the size is found by doubling then halving: about
    2·log2(budget) configurations are built, not one per size. A size the strategy's
    constraints rule out (k not divisible by keep) stands for the nearest allowed size below
    it. A free size that no size from 1 to max(budget, 64) + 1 (at most 4096) accepts is the
    plugin's error.
    """
    if measure is None:

        def measure(method: Method) -> int:
            return method.total_cost(total_steps, passes_per_step)

    free = spec.free_field()
    if free is None:
        method = Method.build(registry, spec, family=family)
        method.id = _label(label, method)
        cost = measure(method)
        return (method if cost <= budget else None), cost
    # a size costs at least one pass; SCAN sizes at least, so that a budget below a family's
    # smallest size still finds it (and says what budget it needs)
    top = max(budget if passes is None else passes, SCAN) + 1
    built: dict[int, Method | PluginError] = {}

    def at(size: int) -> Method | PluginError:
        if size not in built:
            built[size] = _try_build(registry, spec.with_size(size), label, family)
        return built[size]

    smallest_size, error = None, None
    for size in range(1, min(top, SCAN) + 1):  # the smallest size the strategy accepts
        method = at(size)
        if isinstance(method, Method):
            smallest_size = size
            break
        error = error or method
    if smallest_size is None:
        smallest_size = _first_allowed(at, SCAN + 1, top)
    if smallest_size is None:
        if error is not None:
            raise error
        return None, None
    first = at(smallest_size)
    assert isinstance(first, Method)
    smallest = measure(first)
    if smallest > budget:
        return None, smallest

    def allowed_below(size: int) -> Method:
        """The method of the largest allowed size from `smallest_size` to `size`."""
        for below in range(size, smallest_size - 1, -1):
            method = at(below)
            if isinstance(method, Method):
                return method
        return first

    def fits(size: int) -> bool:
        return measure(allowed_below(size)) <= budget

    low, high = smallest_size, smallest_size  # fits(low); then the first size that does not
    while fits(high):
        low = high
        if high >= top:
            return allowed_below(top), smallest
        high = min(top, 2 * high)
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return allowed_below(low), smallest


# sizes tried one by one for the smallest a strategy accepts, before a search by halving
SCAN, SCAN_MAX = 64, 4096


def _first_allowed(at, start: int, top: int) -> int | None:
    """The smallest size from `start` to `top` (at most `SCAN_MAX`) that builds, found one by
    one (a strategy refusing the first 64 sizes is rare): None when none does."""
    for size in range(start, min(top, SCAN_MAX) + 1):
        if isinstance(at(size), Method):
            return size
    return None


ALL = "all"


def family_spec(family: MethodFamily, total_steps: int) -> MethodSpec:
    """A family's spec at T: `{half}` is T // 2 (at least 1), `{quarter}` T // 4."""
    text = family.spec.format(half=half_steps(total_steps), quarter=total_steps // 4)
    return MethodSpec.parse(text)


def available_families(registry: Registry, total_steps: int) -> list[str]:
    """Every registered family whose strategy and selector are registered and not broken."""
    return [f.name for f in registry.families() if unavailable(registry, f, total_steps) is None]


def expand(registry: Registry, entries: list[str] | None, total_steps: int) -> dict[str, bool]:
    """Entry → whether it was asked for by name: `all` (or no entries) adds every registered
    family, not asked for by name, so one that lacks a scorer or whose plugins are missing or
    broken is only left out, with the reason."""
    out: dict[str, bool] = {}
    clashing = [b.name for b in registry.broken() if b.kind == "method family"]
    for entry in entries or [ALL]:
        for name in (
            [*(f.name for f in registry.families()), *clashing] if entry == ALL else [entry]
        ):
            out[name] = out.get(name, False) or entry != ALL
    return out


def unavailable(registry: Registry, family: MethodFamily, total_steps: int) -> str | None:
    """Why a family's strategy or selector cannot be built (missing, broken, clashing), or
    None when both are registered."""
    try:
        spec = family_spec(family, total_steps)
    except (UserError, KeyError, IndexError, ValueError) as exc:  # a third party's bad spec
        return f"its spec {family.spec!r} does not parse: {' '.join(str(exc).split())}"
    for kind, name in (("strategy", spec.strategy), ("selector", spec.selector)):
        try:
            registry.info(kind, name)
        except PluginError as exc:
            return f"{kind} {name!r} is not available: {exc}"
    return None


def left_out_reason(registry: Registry, entry: str, total_steps: int) -> str | None:
    """Why the family `entry` cannot be planned (its name clashes, or `unavailable`), or None
    (also for a spec text)."""
    for b in registry.broken():
        if b.kind == "method family" and b.name == entry:
            return b.line()
    family = registry.family(entry)
    return None if family is None else unavailable(registry, family, total_steps)


def _spec(
    registry: Registry, entry: str, total_steps: int
) -> tuple[MethodSpec, MethodFamily | None]:
    """The method spec of a family name or a spec text, its plugins and options checked."""
    family = registry.family(entry)
    if family is not None:
        return family_spec(family, total_steps), family
    if not (":" in entry or "+" in entry or entry in registry.names("strategy")):
        families = [f.name for f in registry.families()]
        strategies = registry.names("strategy")
        close = difflib.get_close_matches(entry, [*families, *strategies], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(
            f"unknown method {entry!r}, no family's or strategy's name; {hint}families: "
            f"{', '.join(families)}, or all; strategies: {', '.join(strategies)}; or a spec "
            "such as independent:n=8+majority"
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
        if not named and left_out_reason(registry, entry, total_steps):
            continue  # left out by `plan`, with the reason
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


def missing_scorer(method: str, missing: list[str]) -> UserError:
    """The one line for a requested method whose scorers the run lacks."""
    return UserError(
        f"method {method!r} needs scorer {', '.join(missing)}, which the run does not have; "
        f"give --scorer {missing[0]}=PLUGIN[:checkpoint=DIR] or drop the method"
    )


def refuse_missing_scorers(chosen: Plan) -> None:
    """A requested method the plan left out for a scorer the run lacks is an error: `run`
    refuses it before loading a model, and `plan` as `run` would."""
    for x in chosen.left_out:
        if x.missing:
            raise missing_scorer(x.family, list(x.missing))


def check_scorers(users: dict[str, list[Use]], scorers: set[str], requested: bool) -> None:
    """With `users` from `scorer_users`: a requested method whose scorer the run lacks, or a
    scorer no method uses, is an error (with no methods requested, families lacking a scorer
    are only left out, as are the families `all` adds)."""
    for scorer, uses in sorted(users.items()) if requested else ():
        named = [u.entry for u in uses if u.named]
        if scorer not in scorers and named:
            raise missing_scorer(named[0], [scorer])
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


def check_budgets(budgets: list[int]) -> list[int]:
    """Budgets ascending, in one unit (passes, or `Flops`); a budget below 1, given twice or
    a mix of units is an error."""
    try:
        unit_of(budgets)
    except ValueError as exc:
        raise UserError(f"--budget {exc}") from None
    for budget in budgets:
        if budget < 1:
            raise UserError(f"--budget must be a positive number of passes, got {budget}")
    twice = sorted({b for b in budgets if budgets.count(b) > 1})
    if twice:
        raise UserError(
            f"--budget lists {twice[0]} twice; give each budget once, e.g. --budget 1040,4160"
        )
    if not budgets:
        raise UserError("--budget needs at least one budget, e.g. --budget 1040")
    return sorted(budgets)


def with_selector_options(
    spec: MethodSpec, selectors: Mapping[str, Mapping[str, Any]] | None
) -> MethodSpec:
    """`spec` with a preset's options for its selector plugin (`presets.selector_options`),
    the spec's own options winning: `independent:n=8+majority:invalid=drop` stays as given."""
    options = (selectors or {}).get(spec.selector, {})
    return replace(spec, selector_config={**options, **spec.selector_config})


def _place(
    registry: Registry,
    entry: str,
    named: bool,
    budget: int,
    total_steps: int,
    scorers: set[str] | None,
    passes_per_step: int,
    rates: Mapping[str, int] | None = None,
    selectors: Mapping[str, Mapping[str, Any]] | None = None,
) -> Method | LeftOut:
    """The method `entry` takes at `budget` (FLOPs at `rates` for a `Flops` budget), or why
    it is left out."""
    missing = left_out_reason(registry, entry, total_steps)
    if missing is not None:
        if named:
            registry.family(entry)  # a clashing name: the registry's own line
            raise PluginError(f"method family {entry!r}: {missing}")
        return LeftOut(entry, missing)
    spec, family = _spec(registry, entry, total_steps)
    spec = with_selector_options(spec, selectors)
    label, name = (family.label, family.name) if family else (None, None)
    measure, most, unit, known = None, None, "passes", None
    if isinstance(budget, Flops):
        if not rates:
            raise UserError("a FLOP budget needs the model's FLOPs per pass; give a backbone")
        known = dict(rates)

        def measure(method: Method) -> int:
            cost = method.cost(total_steps, passes_per_step)
            return sum(n * known.get(kind, 0) for kind, n in cost.items())

        # the sizes tried: as many as the passes the budget buys at the cheapest kind
        most, unit = budget // max(1, min(known.values())), "FLOPs"
    method, smallest = fit(
        registry, spec, label, name, budget, total_steps, passes_per_step, measure, most
    )
    if method is None:
        shown = format_flops if unit == "FLOPs" else str
        at_least = f"; needs a budget of at least {shown(smallest)}" if smallest else ""
        reason = f"does not fit {shown(budget)}{'' if unit == 'FLOPs' else ' passes'}{at_least}"
        return LeftOut(entry, reason, smallest, budget=budget)
    missing = tuple(sorted(method.scorers() - scorers)) if scorers is not None else ()
    if missing:
        reason = f"needs scorer {', '.join(missing)}"
        return LeftOut(entry, reason, missing=missing if named else ())
    unpriced = sorted(set(method.cost(total_steps, passes_per_step)) - set(known or {}))
    if known is not None and unpriced:  # a scorer that says no model shape: FLOPs unknown
        reason = (
            f"its {', '.join(unpriced)} passes have unknown FLOPs (the scorer says no model "
            "shape), so a FLOP budget cannot price it; give the budget in passes"
        )
        if named:
            raise UserError(f"method {entry!r}: {reason}")
        return LeftOut(entry, reason)
    return method


# why a backbone's Config refuses rows with these sampler settings, as one line; None: it does
# not (`backbone_refuses`)
Refuses = Callable[[Mapping[str, Any]], str | None]


def _settable(
    method: Method,
    entry: str,
    named: bool,
    varies: frozenset[str] | None,
    predicts: bool | None = None,
    refuses: Refuses | None = None,
) -> Method | LeftOut:
    """The method, or why it is left out: its rows read each step's predictions
    (`ReadsPredictions`), which the backbone does not report (`predicts`), set sampler
    settings (`SetsPerRow`) the backbone cannot vary (`varies`), or values its Config refuses
    (`refuses`, for the settings the strategy's config fixes: `SettingsByConfig`). Named, any
    is an error: the last the line the backbone would give at the first problem, before any
    model loads."""
    if predicts is False and reads_predictions(method.strategy):
        reason = "its rows read each step's predictions, which the backbone does not report"
        if named:
            raise UserError(
                f"method {entry!r}: {reason}; run it on dream, llada or tiny, or drop it"
            )
        return LeftOut(entry, reason)
    lacking = sorted(sets_per_row(method.strategy) - varies) if varies is not None else []
    if lacking:
        reason = f"its rows set {', '.join(lacking)}, which the backbone cannot vary per row"
        if named:
            raise UserError(f"method {entry!r}: {reason}; choose a backbone that can, or drop it")
        return LeftOut(entry, reason)
    for settings in settings_by_config(method.strategy) if refuses is not None else ():
        line = refuses(settings)
        if line is not None:
            if named:
                raise UserError(line)
            return LeftOut(entry, line)
    return method


def backbone_refuses(backbone: str, config: Any) -> Refuses | None:
    """What the backbone `backbone` with the checked `config` (its Config object) refuses of
    a row's sampler settings before its model loads (`RefusesRowSettings`), as the line its
    built sampler gives; None when its Config cannot say."""
    if not isinstance(config, RefusesRowSettings):
        return None

    def refuses(settings: Mapping[str, Any]) -> str | None:
        reason = row_refusal(config, settings)
        return None if reason is None else row_settings_line(backbone, settings, reason)

    return refuses


def refuse_row_settings(
    registry: Registry,
    entries: list[str] | None,
    total_steps: int,
    refuses: Refuses | None,
    varies: frozenset[str] | None = None,
    predicts: bool | None = None,
) -> None:
    """A method named in `entries` whose rows set sampler settings the backbone cannot vary
    per row (`varies`), read predictions it does not report (`predicts`) or whose values its
    Config refuses (`backbone_refuses`) is one line, with no plan made, the line a budget in
    passes gives: for a FLOP budget, which is planned only once the models are built to price
    it."""
    if (refuses is None and varies is None and predicts is None) or not entries:
        return
    for entry, named in expand(registry, entries, total_steps).items():
        if not named or left_out_reason(registry, entry, total_steps):
            continue
        spec, _ = _spec(registry, entry, total_steps)
        method: Method | PluginError | None = None  # the settings do not depend on its size
        for size in range(1, 65) if spec.free_field() else (0,):
            method = _try_build(registry, spec.with_size(size), None, None)
            if isinstance(method, Method):
                break
        if isinstance(method, Method):
            _settable(method, entry, True, varies, predicts, refuses)


def backbone_varies(registry: Registry, backbone: str) -> frozenset[str] | None:
    """The sampler settings backbone `backbone` lets rows set, read from its factory (a
    class); None when the factory is not a class, whose objects only say once built."""
    factory = registry.info("backbone", backbone).factory
    return row_settings(factory) if isinstance(factory, type) else None


def backbone_predicts(registry: Registry, backbone: str) -> bool | None:
    """Whether backbone `backbone` reports each step's predictions, read from its factory (a
    class); None when the factory is not a class, whose objects only say once built."""
    factory = registry.info("backbone", backbone).factory
    return reports_predictions(factory) if isinstance(factory, type) else None


def _add(result: Plan, method: Method, budget: int, cost: dict[str, int]) -> None:
    """Plan `method` at `budget`: a method already planned under its id, or (a spec without a
    family) with its spec, carries one more budget (the same method, run once); another method
    under the same id is an error."""
    same = next((p for p in result.methods if p.method.id == method.id), None)
    text = method.spec.text()
    twin = next(  # the same spec listed twice, once bare: run once, under the family's name
        (
            p
            for p in result.methods
            if p.method.spec.text() == text and None in (p.method.family, method.family)
        ),
        None,
    )
    if same is None and twin is not None:
        if method.family is not None:  # the family's name wins over the bare spec
            method.budgets = twin.method.budgets
            twin.method = method
        if budget not in twin.method.budgets:
            twin.method.budgets += (budget,)
        return
    if same is None:
        method.budgets = (budget,)
        result.methods.append(Planned(method, cost))
    elif same.method.spec.text() != method.spec.text():
        raise UserError(
            f"two methods are labelled {method.id!r} ({same.method.spec.text()} and "
            f"{method.spec.text()}); give the family a label that names its size, e.g. Name@{{n}}"
        )
    elif budget not in same.method.budgets:
        same.method.budgets += (budget,)


def plan(
    registry: Registry,
    budget: int | list[int],
    total_steps: int,
    entries: list[str] | None = None,
    scorers: set[str] | None = None,
    passes_per_step: int = 1,
    rates: Mapping[str, int] | None = None,
    selectors: Mapping[str, Mapping[str, Any]] | None = None,
    early: bool = False,
    varies: frozenset[str] | None = None,
    predicts: bool | None = None,
    refuses: Refuses | None = None,
) -> Plan:
    """Choose every method for `budget`, or for each of several budgets. `entries` are family
    names, `all` or method specs. Budgets are passes per problem, or FLOPs per problem
    (`Flops`), which `rates` (FLOPs per pass by kind, at the run's reference row) convert;
    with `rates` every planned method also carries its FLOPs. `selectors` (selector plugin →
    options, a preset's) fills each method's selector options its spec does not give.

    With `scorers` given, families that need a scorer outside it are left out. Methods are in
    entry order (an entry's sizes by budget); each carries the budgets it is planned at.
    `early`: the backbone's rows may end before their T, so every cost is a cap. `varies`:
    the sampler settings the backbone lets rows set (None: not known); a method whose rows
    set others (`SetsPerRow`) is left out, or, named, refused; so is one whose rows' settings
    the backbone's Config refuses (`refuses`, from `backbone_refuses`). `predicts`: whether
    the backbone reports each step's predictions (None: not known); a method whose rows read
    them (`ReadsPredictions`) on one that does not is left out, or, named, refused.
    """
    budgets = check_budgets([budget] if isinstance(budget, int) else list(budget))
    unit = unit_of(budgets)
    result = Plan(budgets[-1], total_steps, budgets=budgets, unit=unit)
    result.rates = dict(rates) if rates else None
    for entry, named in expand(registry, entries, total_steps).items():
        for at in budgets:
            placed = _place(
                registry, entry, named, at, total_steps, scorers, passes_per_step, rates, selectors
            )
            if not isinstance(placed, LeftOut):
                placed = _settable(placed, entry, named, varies, predicts, refuses)
            if isinstance(placed, LeftOut):
                if placed not in result.left_out:
                    result.left_out.append(placed)
                continue
            _add(result, placed, at, placed.cost(total_steps, passes_per_step))
    for planned in result.methods:
        planned.early = early
        if rates and all(kind in rates for kind in planned.cost):
            planned.flops = planned_flops(planned.cost, rates)
    return result
