"""`dllmbench plugins`: every registered plugin, and every broken one with the reason;
`--verbose` adds each plugin's options (type and default), its docstring's first line and, for
a strategy, its cost formula."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dllmbench.cli.common import Reply, add_json, table
from dllmbench.loading.registry import describe_plugins, registry

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


def execute(args: argparse.Namespace) -> Reply:
    described = describe_plugins(registry())
    if args.verbose:
        return Reply(described, lambda console: _show_verbose(console, described))
    brief = [{key: entry[key] for key in (*COLUMNS, "broken")} for entry in described]
    return Reply(brief, lambda console: _show(console, brief))


def _broken_line(entry: dict[str, Any]) -> str:
    return (
        f"broken: {entry['kind']} {entry['name']!r} from {entry['distribution']}: {entry['broken']}"
    )


def _show(console: Console, entries: list[dict[str, Any]]) -> None:
    rows = [
        (*(entry[c] for c in COLUMNS), "broken" if entry["broken"] else "ok") for entry in entries
    ]
    console.print(table("dllmbench plugins", (*COLUMNS, "status"), rows))
    for entry in entries:
        if entry["broken"]:
            console.print(_broken_line(entry), markup=False, highlight=False)


def _option(option: dict[str, Any]) -> str:
    default = f" = {option['default']!r}" if "default" in option else " (required)"
    return f"    {option['name']}: {option['type']}{default}"


def _show_verbose(console: Console, entries: list[dict[str, Any]]) -> None:
    """One block per plugin: its heading, what it does, its cost formula, its options."""
    for entry in entries:
        if entry["broken"]:
            console.print(_broken_line(entry), markup=False, highlight=False)
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
