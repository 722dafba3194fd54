"""`dllmbench merge RUN_DIR`: results.json, leaderboard.md and compute.json of a sharded run
once every share (`dllmbench run --shard I/N`) is done; one line naming what is missing when
one is not."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from dllmbench.analysis.leaderboard import rich_table
from dllmbench.cli.argtypes import positive_float
from dllmbench.cli.common import Reply, add_json
from dllmbench.core.errors import UserError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="write the results of a sharded run once every share is done")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory the shares ran into")
    p.add_argument(
        "--wait",
        action="store_true",
        help=(
            "wait until every share is done, and for RUN_DIR to be made if it is not yet "
            "(stops with one line if a process died)"
        ),
    )
    p.add_argument(
        "--wait-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="with --wait: give up after this many seconds",
    )
    add_json(p, "print results.json instead of a table")
    p.set_defaults(execute=execute, kept=kept)


def kept(args: argparse.Namespace) -> str:
    """What an interrupted merge keeps, and how to go on: results.json is written last."""
    again = f"run dllmbench merge{' --wait' if args.wait else ''} {args.run_dir} again"
    if not (Path(args.run_dir) / "manifest.json").is_file():  # waiting for the run to begin
        return f"{args.run_dir} holds no run yet and nothing was written; {again}"
    return (
        f"every record in {args.run_dir} is kept (results.json is written only by a merge "
        f"that ends); {again}"
    )


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.running.merge import merge

    path = Path(args.run_dir)
    if args.wait_timeout is not None and not args.wait:
        raise UserError("--wait-timeout goes with --wait; add --wait")
    results, manifest = merge(path, wait=args.wait, timeout=args.wait_timeout)

    def show(console: Console) -> None:
        for budget in results["budgets"]:
            title = (
                f"{manifest['task']['name']} · {manifest['backbone']['name']} · budget {budget} "
                f"passes/problem · {results['task']['problems']} problems"
            )
            at = budget if len(results["budgets"]) > 1 else None
            console.print(rich_table(results, title, console.width, at), crop=False)
        console.print(
            f"merged: {path} (results.json, leaderboard.md, compute.json)", soft_wrap=True
        )

    return Reply(results, show)
