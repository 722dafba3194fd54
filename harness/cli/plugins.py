"""`dllmbench plugins`: every registered plugin, and every broken one with the reason;
`--verbose` adds each plugin's options (type and default), its docstring's first line and, for
a strategy, its cost formula."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import inspect
import types
import typing
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dllmbench.cli.common import GENERAL, Reply, add_json, table
from dllmbench.core.errors import UserError

if TYPE_CHECKING:  # the registry loads the plugins: `execute` imports it
    from dllmbench.loading.manager import MethodFamily
    from dllmbench.loading.registry import Registry

COLUMNS = ("kind", "name", "distribution", "version", "module")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list every registered plugin")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="each plugin's options with types and defaults, what it does, a strategy's cost",
    )
    add_json(p)
    p.set_defaults(execute=execute)


FAMILY_KEYS = ("label", "spec", "cost")
FAMILIES = "method families (the names --methods takes, each run as its label)"


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.loading.registry import registry

    described = describe_plugins(registry())
    if args.verbose:
        return Reply(described, lambda console: _show_verbose(console, described))
    brief = [
        {
            key: entry[key]
            for key in (*COLUMNS, *(FAMILY_KEYS if entry["kind"] == "family" else ()), "broken")
        }
        for entry in described
    ]
    return Reply(brief, lambda console: _show(console, brief))


def _broken_line(entry: dict[str, Any]) -> str:
    return (
        f"broken: {entry['kind']} {entry['name']!r} from {entry['distribution']}: {entry['broken']}"
    )


def _show(console: Console, entries: list[dict[str, Any]]) -> None:
    plugins = [e for e in entries if e["kind"] != "family"]
    families = [e for e in entries if e["kind"] == "family"]
    rows = [
        (*(entry[c] for c in COLUMNS), "broken" if entry["broken"] else "ok") for entry in plugins
    ]
    console.print(table("dllmbench plugins", (*COLUMNS, "status"), rows, whole=("name",)))
    family_rows = [
        (
            e["name"],
            e["label"] or "",
            e["cost"] or "",
            e["distribution"],
            "broken" if e["broken"] else "ok",
        )
        for e in families
    ]
    if family_rows:
        columns = ("family", "label", "strategy cost", "distribution", "status")
        console.print(table(FAMILIES, columns, family_rows, whole=("family",)))
    for entry in entries:
        if entry["broken"]:
            console.print(_broken_line(entry), markup=False, highlight=False)


def _option(option: dict[str, Any]) -> str:
    default = f" = {option['default']!r}" if "default" in option else " (required)"
    return f"    {option['name']}: {option['type']}{default}"


def _show_verbose(console: Console, entries: list[dict[str, Any]]) -> None:
    """One block per plugin: its heading, what it does, its cost formula, its options (a
    Literal's allowed values as `'a' | 'b'`); then the method families, by the name `--methods`
    takes, with the label they run as."""
    heading = False
    for entry in entries:
        if entry["broken"]:
            console.print(_broken_line(entry), markup=False, highlight=False)
            continue
        if entry["kind"] == "family":
            if not heading:
                console.print(FAMILIES + ":\n", markup=False, highlight=False, soft_wrap=True)
                heading = True
            lines = [
                f"family {entry['name']}  ({entry['distribution']}, {entry['module']})",
                f"  label: {entry['label']}",
                f"  spec: {entry['spec']}",
                f"  cost: {entry['cost'] or '(not stated)'}",
            ]
            console.print("\n".join(lines) + "\n", markup=False, highlight=False, soft_wrap=True)
            continue
        lines = [
            f"{entry['kind']} {entry['name']}  ({entry['distribution']} {entry['version']}, "
            f"{entry['module']})",
            f"  {entry['summary'] or '(no docstring)'}",
        ]
        if entry["kind"] == "strategy":
            lines.append(f"  cost: {entry.get('cost') or '(not stated)'}")
        lines.append("  options:" if entry["options"] else "  options: none")
        lines += [_option(option) for option in entry["options"]]
        console.print("\n".join(lines) + "\n", markup=False, highlight=False, soft_wrap=True)


# -- each plugin as plain data ------------------------------------------------------------


def _type_text(tp: Any) -> str:
    """A type as a reader writes it: `int`, `str | None`; the allowed values of a Literal:
    `'a' | 'b'`."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def _choices(tp: Any) -> list[Any] | None:
    """The allowed values of an option whose type is a Literal (or an optional one)."""
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [c for a in typing.get_args(tp) for c in _choices(a) or []]
        return found or None
    return None


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def option_table(factory: Any) -> list[dict[str, Any]]:
    """A factory's options: name, type and default (from its `Config` dataclass, else its
    signature); a required option has no "default" key."""
    from dllmbench.api.interfaces import config_class
    from dllmbench.loading.registry import options

    config_cls = config_class(factory)
    rows: list[dict[str, Any]] = []
    if config_cls is not None:
        hints = typing.get_type_hints(config_cls)
        for f in dataclasses.fields(config_cls):
            tp = hints.get(f.name, Any)
            row: dict[str, Any] = {"name": f.name, "type": _type_text(tp)}
            if _choices(tp):
                row["choices"] = _choices(tp)
            if f.default is not dataclasses.MISSING:
                row["default"] = _plain(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                row["default"] = _plain(f.default_factory())
            rows.append(row)
        return rows
    for p in inspect.signature(factory).parameters.values():
        if p.name in options(factory):
            row = {"name": p.name, "type": _type_text(p.annotation) if p.annotation else "any"}
            if p.default is not inspect.Parameter.empty:
                row["default"] = _plain(p.default)
            rows.append(row)
    return rows


def _summary(factory: Any) -> str:
    """The first line of a plugin's own docstring (a class's, not one it inherits)."""
    own = factory.__dict__.get("__doc__") if isinstance(factory, type) else factory.__doc__
    doc = inspect.cleandoc(own or "")
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _families(reg: Registry) -> list[dict[str, Any]]:
    """Every method family as plain data: its label, spec, its strategy's cost formula (None
    when the strategy is not available), and `broken` (why its spec does not parse or its
    strategy or selector cannot be built, or None); then the family names two plugins
    register, broken."""
    from dllmbench.execution.planner import unavailable

    out = []
    versions = {info.distribution: info.version for info in reg.all()}
    for family in reg.families():
        missing = unavailable(reg, family, GENERAL["steps"])
        out.append(
            {
                "name": family.name,
                "kind": "family",
                "distribution": family.distribution,
                "version": family.version
                or versions.get(family.distribution)
                or _version(family.distribution),
                "module": family.module,
                "label": family.label,
                "spec": family.spec,
                "summary": family.label,
                "options": [],
                "cost": _strategy_cost(reg, family),
                "broken": missing,
            }
        )
    for b in reg.broken():
        if b.kind == "method family":
            out.append(
                {
                    "name": b.name,
                    "kind": "family",
                    "distribution": b.distribution,
                    "version": "",
                    "module": b.module,
                    "label": None,
                    "spec": None,
                    "cost": None,
                    "broken": b.reason,
                }
            )
    return out


def _version(distribution: str) -> str:
    """The installed version of a distribution that registers families only; "local" for a
    module named in DLLMBENCH_PLUGIN_MODULES."""
    if distribution.startswith("module:"):
        return "local"
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _strategy_cost(reg: Registry, family: MethodFamily) -> str | None:
    """The cost formula of a family's strategy; None when its spec does not parse or the
    strategy is missing or broken (a broken selector leaves the formula known)."""
    from dllmbench.api.interfaces import cost_formula
    from dllmbench.execution.planner import family_spec

    try:
        name = family_spec(family, GENERAL["steps"]).strategy
        return cost_formula(reg.info("strategy", name).factory)
    except (UserError, KeyError, IndexError, ValueError):
        return None


def describe_plugins(reg: Registry) -> list[dict[str, Any]]:
    """Every plugin as plain data, for `dllmbench plugins --verbose` / `--json`: name, kind,
    distribution, version, module, `summary` (its docstring's first line), `options` (name,
    type, default), for strategies `cost` (its cost formula, or None), and `broken` (None, or
    the reason it is left out; a broken plugin has no summary, options or cost). Method
    families follow the plugins as kind `family`, with `label`, `spec` and their strategy's
    `cost` formula."""
    from dllmbench.api.interfaces import cost_formula

    out: list[dict[str, Any]] = []
    for info in sorted(reg.all(), key=lambda i: (i.kind, i.name)):
        entry: dict[str, Any] = {
            **info.as_dict(),
            "summary": _summary(info.factory),
            "options": option_table(info.factory),
            "broken": None,
        }
        if info.kind == "strategy":
            entry["cost"] = cost_formula(info.factory)
        out.append(entry)
    out.extend(_families(reg))
    for b in reg.broken():
        if b.kind == "method family":
            continue  # listed with the families
        out.append(
            {
                "name": b.name,
                "kind": b.kind or "plugin",
                "distribution": b.distribution,
                "version": "",
                "module": b.module,
                "broken": b.reason,
            }
        )
    return out
