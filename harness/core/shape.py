"""Whether a JSON value read from a run directory has the shape a TypedDict of
`dllmbench.core.schema` gives it: the first key that is missing or of the wrong type, so that a
damaged file is one line naming it, not a KeyError deep in the analysis."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.flops import UNITS
from dllmbench.core.numbers import INT_MAX
from dllmbench.core.schema import MOST_RESAMPLES, Manifest, Results

# what to do about a manifest that lacks what is read of it: it cannot be rebuilt from the records
MANIFEST_FIX = "restore it from a copy, or run the command again with another --out"

_NAMES = {bool: "a bool", int: "an int", float: "a number", str: "a string", type(None): "null"}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _describe(tp: Any) -> str:
    if _is_typeddict(tp) or typing.get_origin(tp) is dict:
        return "an object"
    if typing.get_origin(tp) is list:
        return "a list"
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def problem(value: Any, tp: Any, where: str = "") -> str | None:
    """Why `value` is not a `tp` (`'methods[2] lacks id'`), or None when it is. Checks required
    keys and types through nested TypedDicts, lists and dicts; keys `tp` does not name, and
    `Any`, are not checked."""
    here = where or "the file"
    origin = typing.get_origin(tp)
    if tp is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if any(problem(value, option, where) is None for option in options):
            return None
        simple = [o for o in options if typing.get_origin(o) is None and not _is_typeddict(o)]
        if len(simple) < len(options) - 1 or value is None:  # not a plain X | None
            return f"{here} is not {_describe(tp)}"
        inner = next(o for o in options if o is not type(None))
        return problem(value, inner, where)
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{here} is not an object"
        hints = typing.get_type_hints(tp)
        for key in sorted(tp.__required_keys__, key=list(hints).index):
            if key not in value:
                return f"{where + ' ' if where else ''}lacks {key!r}"
        for key in hints:
            if key in value:
                found = problem(value[key], hints[key], f"{where}.{key}" if where else key)
                if found:
                    return found
        return None
    if origin is list:
        if not isinstance(value, list):
            return f"{here} is not a list"
        (item,) = typing.get_args(tp) or (Any,)
        for i, entry in enumerate(value):
            found = problem(entry, item, f"{where}[{i}]")
            if found:
                return found
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"{here} is not an object"
        _, item = typing.get_args(tp) or (str, Any)
        for key, entry in value.items():
            found = problem(entry, item, f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(tp, type):
        ok = isinstance(value, tp)
    else:
        ok = True
    return None if ok else f"{here} is not {_describe(tp)}"


def require(value: Any, tp: Any, file: Path, fix: str) -> Any:
    """`value` when it is a `tp`; else a UserError naming `file`, what is wrong, and `fix`."""
    found = problem(value, tp)
    if found:
        raise UserError(f"{file} is damaged: {found}; {fix}")
    return value


def _manifest_values(manifest: dict[str, Any]) -> str | None:
    """What of a well-typed manifest's values the summary cannot read, or None: a list that
    is empty, a number out of its range, an id given twice or naming nothing."""
    for check in (_budget_values, _run_values, _method_values):
        found = check(manifest)
        if found:
            return found
    return None


def _budget_values(manifest: dict[str, Any]) -> str | None:
    """The budgets and the statistics."""
    budgets, statistics = manifest["budgets"], manifest["statistics"]
    found = _budgets_problem(budgets, manifest.get("budget_unit", "passes"))
    if found:
        return found
    if manifest["budget"] <= 0:
        return f"budget {manifest['budget']} is not positive"
    if manifest["budget"] != budgets[-1]:
        return f"budget {manifest['budget']} is not the largest of budgets {budgets}"
    return _statistics_problem(statistics["resamples"], statistics["level"], "statistics.")


def _budgets_problem(budgets: list[int], unit: str) -> str | None:
    if not budgets:
        return "budgets is empty"
    if any(b <= 0 for b in budgets) or budgets != sorted(set(budgets)):
        return f"budgets {budgets} are not positive and ascending"
    if unit not in UNITS:
        return f"budget_unit {unit!r} is not {' or '.join(UNITS)}"
    return None


def _statistics_problem(resamples: int, level: float, where: str) -> str | None:
    if not 1 <= resamples <= MOST_RESAMPLES:
        return f"{where}resamples {resamples} is not 1 to {MOST_RESAMPLES}"
    if not 0 < level < 1:
        return f"{where}level {level} is not between 0 and 1"
    return None


def _run_values(manifest: dict[str, Any]) -> str | None:
    """The sampling protocol and the problems."""
    sampling, task = manifest["sampling"], manifest["task"]
    for key in ("total_steps", "gen_length"):
        if sampling[key] < 1:
            return f"sampling.{key} {sampling[key]} is not positive"
    if not 0 <= sampling["seed"] <= INT_MAX:
        return f"sampling.seed {sampling['seed']} is not 0 to {INT_MAX}"
    if task["problems"] < 1:
        return f"task.problems {task['problems']} is not positive"
    ids = task.get("problem_ids")
    if ids is not None:
        if len(ids) != task["problems"]:
            return f"task.problem_ids lists {len(ids)} problems, task.problems {task['problems']}"
        twice = _twice(ids)
        if twice is not None:
            return f"task.problem_ids lists {twice!r} twice"
    return None


def _method_values(manifest: dict[str, Any]) -> str | None:
    """The methods: some, each id once, costs and budgets the run can have."""
    methods, budgets = manifest["methods"], manifest["budgets"]
    if not methods:
        return "methods is empty"
    ids = [m["id"] for m in methods]
    twice = _twice(ids)
    if twice is not None:
        return f"methods list the id {twice!r} twice"
    for i, method in enumerate(methods):
        where = f"methods[{i}]"
        if not method["id"]:
            return f"{where}.id is empty"
        for kind, passes in method["cost"].items():
            if passes < 0:
                return f"{where}.cost.{kind} {passes} is negative"
        if method.get("flops", 0) < 0:
            return f"{where}.flops {method['flops']} is negative"
        own = method.get("budgets")
        if own is not None and (not own or not set(own) <= set(budgets)):
            return f"{where}.budgets {own} are not some of budgets {budgets}"
    reference = manifest.get("reference")
    if reference is not None and reference not in ids:
        return f"reference {reference!r} is not one of the methods' ids"
    return None


def _twice(values: list[Any]) -> Any:
    """The first value `values` holds twice, or None."""
    seen = set()
    for value in values:
        if value in seen:
            return value
        seen.add(value)
    return None


def manifest_problem(value: Any) -> str | None:
    """What keeps `value` from being a manifest the summary, `merge` and `report` can read (a
    key missing or of the wrong type, a value out of range), or None."""
    return problem(value, Manifest) or _manifest_values(value)


def require_manifest(value: Any, file: Path) -> dict[str, Any]:
    """`value` when it is a manifest the summary, `merge` and `report` can read: a `Manifest`
    whose values are in range; else one line naming `file`."""
    found = manifest_problem(value)
    if found:
        raise UserError(f"{file} is damaged: {found}; {MANIFEST_FIX}")
    return value


def require_results(value: Any, file: Path, fix: str) -> dict[str, Any]:
    """`value` when it is a results.json the report can read: a `Results` whose budgets and
    statistics are in range; else one line naming `file`, what is wrong, and `fix`."""
    results = require(value, Results, file, fix)
    unit = results.get("budget_unit", "passes")
    found = _budgets_problem(results["budgets"], unit)
    found = found or _statistics_problem(results["resamples"], results["level"], "")
    if found:
        raise UserError(f"{file} is damaged: {found}; {fix}")
    return results
