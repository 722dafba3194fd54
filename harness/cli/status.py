"""`dllmbench status RUN_DIR`: records done of planned, and per process: running, stuck (its
heartbeat beats, its work does not move), finished, stopped or dead (pid, host, last
heartbeat), records, rate and ETA; `--json` for scripts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dllmbench.cli.common import Reply, add_json
from dllmbench.cli.progress import duration


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="how far a run is: records done, and each process running, finished or dead",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (finished or running)")
    add_json(p, "print the status as JSON")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.running.status import status

    found = status(Path(args.run_dir))

    def show(console: Console) -> None:
        pct = 100 * found.done // found.planned if found.planned else 100
        eta = f", ETA {duration(found.eta_seconds)}" if found.eta_seconds else ""
        state = "merged" if found.merged else "complete" if found.complete else "in progress"
        if found.stale:  # a samples file lost records after results.json was written
            state = "records missing (results.json is older; run the same command to redo them)"
        if found.changed:  # a process went on after the merge (it was stuck, or late)
            state = (
                f"complete, but {', '.join(found.changed)} changed after results.json and "
                f"compute.json were written; run dllmbench merge {found.path} again"
            )
        if found.unaccounted:  # a merge (or a run's end) cut short before compute.json
            state = (
                "complete, but compute.json is missing or does not account for the records "
                f"(a merge cut short); run dllmbench merge {found.path}"
            )
        if found.damaged:  # a file the merge writes was cut or edited
            names = " and ".join(found.damaged)
            away = "move compute.json away, then " if "compute.json" in found.damaged else ""
            state = (
                f"complete, but {names} {'are' if len(found.damaged) > 1 else 'is'} damaged "
                f"(not a JSON object); {away}run dllmbench merge {found.path}"
            )
        # never cut into lines: the path and the command it names are copied whole
        line = f"{found.path}: {found.done}/{found.planned} records ({pct}%), {state}{eta}"
        console.print(line, soft_wrap=True)
        if found.not_started:
            console.print(f"not started: share {', '.join(found.not_started)}", soft_wrap=True)
        if found.chunks is not None:
            c = found.chunks
            console.print(
                f"chunks: {c.done} done, {c.held} held, {c.abandoned} held by a process that "
                f"is gone, {c.free} free, of {c.total}"
            )
        if not found.processes:
            console.print("no process has written a heartbeat here")
            return
        table = Table()
        for column in ("share", "state", "pid", "host", "heartbeat", "records", "rate", "ETA"):
            table.add_column(column)
        for p in found.processes:
            records = f"{p.records_written}" + (f"/{p.planned}" if p.planned is not None else "")
            if p.held is not None and p.held != p.records_written:  # a share run again
                records += f" ({p.held} in its file)"
            state = p.state
            if p.stuck_seconds is not None:  # beating, but its work has not moved
                state = f"stuck in {p.doing} for {duration(p.stuck_seconds)}"
            table.add_row(
                p.share or "whole run",
                state,
                str(p.pid),
                p.host,
                f"{duration(p.last_heartbeat)} ago",
                records,
                "" if p.rate is None else f"{p.rate:.2f}/s",
                "" if p.eta_seconds is None else duration(p.eta_seconds),
            )
        console.print(table)

    return Reply(found.as_dict(), show)
