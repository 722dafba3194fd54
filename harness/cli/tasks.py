"""`dllmbench tasks`: every task with its splits and their sizes."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dllmbench.cli.common import Reply, add_json, table


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tasks", help="list tasks with their splits and sizes")
    add_json(t)
    t.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.loading.registry import registry

    reg = registry()
    rows = [
        {
            "name": name,
            "distribution": reg.info("task", name).distribution,
            "splits": reg.task(name).splits(),
        }
        for name in reg.names("task")
    ]

    def show(console: Console) -> None:
        lines = [
            (r["name"], ", ".join(f"{k} ({v})" for k, v in r["splits"].items()), r["distribution"])
            for r in rows
        ]
        console.print(table("dllmbench tasks", ("task", "splits", "distribution"), lines))

    return Reply(rows, show)
