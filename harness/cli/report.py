"""`dllmbench report`: report.md, report.json and figures from finished run directories."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dllmbench.cli.common import Reply, add_json
from dllmbench.cli.folders import claim
from dllmbench.cli.progress import duration
from dllmbench.core.errors import UserError

SLICINGS = ("paper", "split")  # analysis.controls.SLICINGS, without loading numpy to parse


def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "report",
        help="tables, pooled curves, diagnostics and figures from finished run directories",
        description=(
            "Write report.md, report.json and PNG figures from one or more finished run "
            "directories of one protocol (same task and problems, sampling, seed, backbone "
            "and scorers); their methods and budgets are combined."
        ),
    )
    r.add_argument("runs", nargs="+", metavar="RUN_DIR", help="finished run directories")
    r.add_argument("--out", help="folder to write the report into (default: RUN_DIR/report)")
    r.add_argument(
        "--controls",
        metavar="DIR",
        help="add the scorer controls dllmbench diagnose wrote into DIR (a collection sampled "
        "as the runs were)",
    )
    r.add_argument(
        "--slicing",
        choices=SLICINGS,
        default=SLICINGS[0],
        help="the snapshot slicing of the controls' ROC-AUC by mask ratio and removal risk: "
        "paper (the default), the paper's: every stored state in the mask buckets, the fully "
        "decoded one in [0, 0.1), the initial state the all-mask canvas; or split, the "
        "project's: the states at steps 0 < s < T in the buckets, the fully decoded ones "
        "only apart, the initial state the first stored step after the canvas",
    )
    r.add_argument(
        "--exact",
        metavar="EXACT_RUN",
        help="a run of the same protocol decoded exactly: for a run decoded with an "
        "approximate cache, how often its answers are exact decoding's",
    )
    add_json(r, "print what was written as JSON")
    r.set_defaults(execute=execute, kept=kept)


def kept(args: argparse.Namespace) -> str:
    """What an interrupted report keeps, and how to go on: the runs are only read."""
    out = Path(args.runs[0]) / "report" if args.out is None else args.out
    return f"the run directories are untouched; run the same command again to write {out} whole"


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.analysis.report import (  # numpy, scipy and matplotlib: only when asked
        check_finished,
        skip_line,
        write_report,
    )

    seen: dict[Path, str] = {}
    for run in args.runs:
        where = Path(run).resolve()
        if where in seen:
            raise UserError(
                f"{run} is given twice (as {seen[where]} before); give each run directory once"
            )
        seen[where] = run
        check_finished(Path(run))  # before its report folder is judged (a file has none)
    claim(Path(args.runs[0]) / "report" if args.out is None else args.out, "report folder")
    start = time.perf_counter()

    def stage(name: str) -> None:  # a report of the demo takes a minute: say where it is
        elapsed = duration(time.perf_counter() - start)
        print(f"dllmbench: report: {name} ({elapsed} elapsed)", file=sys.stderr, flush=True)

    # to a person at a terminal only: what a script reads on stderr stays the errors alone
    stage_lines = stage if sys.stderr.isatty() else None

    written = write_report(
        args.runs,
        args.out,
        controls=args.controls,
        exact=args.exact,
        slicing=args.slicing,
        say=stage_lines,
    )
    seconds = round(time.perf_counter() - start, 2)
    for entry in written.report.get("skipped", []):
        print(f"dllmbench: {skip_line(entry)}", file=sys.stderr, flush=True)
    data = {
        "out": str(written.out),
        "files": list(written.files),
        "methods": len(written.report["methods"]),
        "budgets": written.report["budgets"],
        "seconds": seconds,
    }

    def show(console: Console) -> None:
        console.print(
            f"report of {len(args.runs)} run director{'y' if len(args.runs) == 1 else 'ies'} "
            f"written to {written.out} in {seconds:.1f} s: {', '.join(written.files)}"
        )

    return Reply(data, show)
