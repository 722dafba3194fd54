"""`dllmbench run`: run methods on a task and print the leaderboard; with neither --task nor
--backbone, the shipped demo."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dllmbench.analysis.leaderboard import rich_table
from dllmbench.cli.argtypes import budgets, positive_int
from dllmbench.cli.common import (
    CAPACITY,
    GENERAL,
    RUN_CONFIG,
    Interrupted,
    Reply,
    Settings,
    add_json,
    add_limit,
    add_methods,
    add_preset,
    add_sampling,
    add_scorers,
    check_canvas,
    declared_default,
    methods_arg,
    settings,
    stdout_console,
)
from dllmbench.cli.progress import Progress
from dllmbench.core.errors import Terminated, UserError
from dllmbench.core.flops import Flops, format_flops
from dllmbench.core.schema import MOST_RESAMPLES
from dllmbench.demo import BLOCK_DEMO, DEMO_TASK
from dllmbench.storage.shards import parse_shard, resolve

if TYPE_CHECKING:  # the runner and the engine load torch: `execute` imports them
    from dllmbench.execution.engine import Capacity
    from dllmbench.loading.registry import Registry
    from dllmbench.running.runner import RunConfig

# `dllmbench run` with neither --task nor --backbone: the shipped tiny model on arith, with
# the PRM and ORM trained for it; every option can still be given.
DEMO = {
    "task": DEMO_TASK,
    "backbone": "tiny",
    "steps": 24,
    "gen_length": 32,
    "prompt": "fewshot",
    "limit": 40,
}
# each demo model's own sampling protocol: `run` with no --task and one of these backbones (or
# none: tiny) is the demo on it; with a --task (and no --preset), the run samples as the model
# was trained to, unless a flag says otherwise
DEMO_PROTOCOLS: dict[str, dict[str, Any]] = {
    "tiny": {"steps": DEMO["steps"], "gen_length": DEMO["gen_length"], "prompt": DEMO["prompt"]},
    "tiny-block": {**BLOCK_DEMO, "prompt": DEMO["prompt"]},
}


# the demo's budgets without --budget: its matched budget (PRM Guided K=8 with two segments)
# and four times it (K=32), as the paper's two budgets
DEMO_BUDGET_FACTORS = (1, 4)


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run methods on a task and print the leaderboard")
    run.add_argument("--task", help="task[:option=value,...], e.g. gsm8k or arith:test_size=50")
    run.add_argument("--split", default=declared_default(RUN_CONFIG, "split"))
    run.add_argument("--backbone", help="backbone[:option=value,...], e.g. dream, llada or tiny")
    add_scorers(
        run,
        "NAME[=PLUGIN[:k=v,...]]",
        "a scorer under the name methods use, e.g. orm=orm:checkpoint=DIR; repeatable",
    )
    run.add_argument(
        "--budget",
        type=budgets,
        help="passes per problem each method may spend, or FLOPs (e.g. 2.1e15flops); several, "
        "e.g. 1040,4160, plan every "
        "family at each in one run",
    )
    add_methods(run)
    run.add_argument("--reference", help="method the Δ column is paired against (default Vanilla)")
    add_preset(run)
    add_sampling(run)
    add_limit(run)
    run.add_argument(
        "--batch-rows",
        type=positive_int,
        default=declared_default(CAPACITY, "batch_rows"),
        help="rows per forward (default %(default)s)",
    )
    run.add_argument("--batch-tokens", type=positive_int, help="rows × canvas length per forward")
    run.add_argument(
        "--max-problems",
        type=positive_int,
        default=declared_default(CAPACITY, "problems"),
        help="problems in flight (default %(default)s)",
    )
    run.add_argument(
        "--shard",
        type=parse_shard,
        metavar="I/N",
        help="run share I of N of the problems into --out (then: dllmbench merge RUN_DIR)",
    )
    run.add_argument(
        "--resamples",
        type=lambda text: positive_int(text, MOST_RESAMPLES),
        default=declared_default(RUN_CONFIG, "resamples"),
        help=f"bootstrap resamples, at most {MOST_RESAMPLES} (default %(default)s)",
    )
    run.add_argument(
        "--out",
        help="run directory (default runs/TASK-BACKBONE-bBUDGETS-seedSEED, e.g. b1040, then "
        "-nLIMIT after a --limit)",
    )
    run.add_argument(
        "--resume", action="store_true", help="require an existing run directory and continue it"
    )
    add_json(run, "print results.json instead of a table")
    run.add_argument(
        "--allow-deterministic",
        action="store_true",
        help="run multi-candidate methods even if the backbone samples deterministically",
    )
    run.set_defaults(execute=execute, kept=kept)


def _required(reg: Registry, s: Settings) -> None:
    if not s.task:
        raise UserError(f"--task is required; tasks: {', '.join(reg.names('task')) or 'none'}")
    if not s.backbone:
        raise UserError(
            f"--backbone is required; backbones: {', '.join(reg.names('backbone')) or 'none'}"
        )


def _capacity(args: argparse.Namespace) -> Capacity:
    from dllmbench.execution.engine import Capacity

    try:
        return Capacity(args.batch_rows, args.batch_tokens, args.max_problems)
    except ValueError as exc:
        default = Capacity()
        raise UserError(
            f"{exc}; e.g. --batch-rows {default.batch_rows} --max-problems {default.problems}"
        ) from exc


def shipped_model(args: argparse.Namespace) -> str | None:
    """The shipped demo model that --backbone names (none named: tiny), whose own protocol
    fills the flags left unset; None for another backbone, or when --preset sets them."""
    model = (args.backbone or DEMO["backbone"]).split(":", 1)[0]
    return None if args.preset or model not in DEMO_PROTOCOLS else model


def fill_unset(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """Set each flag of `values` that the command line left unset."""
    for key, value in values.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run_config(args: argparse.Namespace) -> RunConfig:
    """The `RunConfig` these arguments ask for, checked as far as it can be without a model."""
    from dllmbench.execution.engine import Sampling
    from dllmbench.execution.planner import check_scorers, scorer_users
    from dllmbench.loading.registry import registry
    from dllmbench.running.runner import RunConfig

    reg = registry()
    if args.out is not None and not args.out.strip():
        raise UserError("--out is empty; give the run directory, e.g. --out runs/mine")
    model = shipped_model(args)
    demo = model is not None and not args.task
    named_limit = None if demo and args.limit == DEMO["limit"] else args.limit  # before filling
    if model is not None:
        # with no --task, the shipped demo on this model; with one, the model's own sampling
        # (T, canvas, prompt): `--task arith --backbone tiny` samples as it was trained to,
        # not at the paper's 512-token canvas, which its 256 positions cannot hold
        fill_unset(args, {**DEMO, **DEMO_PROTOCOLS[model]} if demo else DEMO_PROTOCOLS[model])
    s = settings(args, GENERAL)
    _required(reg, s)
    if s.scorers is not None:  # a typo in a scorer name costs no model load
        users = scorer_users(reg, methods_arg(args), args.steps)
        check_scorers(users, set(s.scorers), requested=methods_arg(args) is not None)
    check_canvas(
        s.backbone, reg.check("backbone", s.backbone, **s.backbone_config), args.gen_length
    )
    return RunConfig(
        task=s.task,
        task_config=s.task_config,
        backbone=s.backbone,
        backbone_config=s.backbone_config,
        scorers=s.scorers,
        split=args.split,
        limit=args.limit,
        named_limit=named_limit,
        budget=args.budget,
        budget_factors=DEMO_BUDGET_FACTORS if demo else (1,),
        methods=methods_arg(args),
        reference=args.reference,
        sampling=Sampling(args.steps, args.gen_length, args.prompt, args.seed),
        capacity=_capacity(args),
        resamples=args.resamples,
        out=args.out,
        command=sys.argv,
        allow_deterministic=args.allow_deterministic,
        preset=s.preset,
        shard=args.shard,
    )


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.running.runner import run

    cfg = run_config(args)
    args.run_dir = cfg.run_dir()  # for `kept`, should the command be interrupted
    if args.resume and not (cfg.run_dir() / "manifest.json").exists():
        raise UserError(f"--resume: {cfg.run_dir()} holds no run to resume; drop --resume")
    shown: list[int] = []  # budgets whose table is printed already

    def early_table(results: dict[str, Any], budget: int) -> None:
        """A budget's table as soon as its methods are done (the run goes on)."""
        if args.json or args.json_before:
            return  # stdout is for the JSON at the end
        console = stdout_console()
        console.print(_table(cfg, results, budget, True, console.width), crop=False)
        shown.append(budget)

    try:
        shard = resolve(cfg.shard)  # the progress lines of several processes say whose
        what = f"{cfg.task}" + (f" (share {shard.label})" if shard else "")
        costs: dict[str, float] = {}  # each method's planned passes per problem

        def started(total: int, done: int) -> None:
            manifest = _manifest(cfg.run_dir())
            costs.update(planned_passes(manifest))
            counted, work = counts(manifest, total, costs)
            progress.start(f"{what}: {counted}", total, done, work=work, unit="records")

        with Progress() as progress:
            outcome = run(
                cfg,
                on_record=lambda r: progress.advance(work=costs.get(r.get("method", ""))),
                on_start=started,
                on_budget=early_table,
            )
    except Terminated:
        raise Interrupted(f"terminated (SIGTERM); {_what_is_kept(cfg.run_dir())}", 143) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {_what_is_kept(cfg.run_dir())}") from None
    if outcome.results is None:  # a share that does not merge
        return _share_reply(outcome)

    def show(console: Console) -> None:
        several = len(outcome.plan.budgets) > 1
        for budget in outcome.plan.budgets:
            if budget not in shown:
                table = _table(cfg, outcome.results, budget, several, console.width)
                console.print(table, crop=False)
        for x in outcome.plan.left_out:
            console.print(f"left out: {x.family} — {x.reason}")
        note = f", {outcome.resumed} resumed" if outcome.resumed else ""
        by = ""
        if outcome.shard is not None:  # the first of a launch: the others wrote the rest
            by = f" by this process of {outcome.shard.count}"
        files = ", ".join(written_files(Path(outcome.path)))
        records = f"{outcome.written} record{'s' * (outcome.written != 1)} written"
        console.print(
            f"run directory: {outcome.path} ({records}{by}{note}): {files}",
            soft_wrap=True,  # a path is never cut; the terminal wraps it
        )
        console.print(
            f"next: dllmbench report {shlex.quote(str(outcome.path))} (report.md, report.json "
            "and the figures)",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )

    return Reply(outcome.results, show)


# what a finished run directory holds for a person, in the order to read it
RUN_FILES = ("leaderboard.md", "results.json", "compute.json", "manifest.json")


def written_files(path: Path) -> list[str]:
    """The files a finished run wrote into `path` that a person reads: the tables, every
    number, the compute, the manifest, and the records (`samples*.jsonl`)."""
    found = [name for name in RUN_FILES if (path / name).is_file()]
    return found + sorted(p.name for p in path.glob("samples*.jsonl"))


def kept(args: argparse.Namespace) -> str:
    """What `run` keeps when interrupted outside its run (while it reads its arguments and
    plugins, or prints the results), and how to go on."""
    path = getattr(args, "run_dir", None)
    if path is None:
        return "the run had not begun and nothing was written; run the same command again"
    return _what_is_kept(path)


def _what_is_kept(path: Path) -> str:
    """What an interrupted run leaves: its records, or nothing when it had not begun (no
    manifest: the run directory it made is gone again)."""
    if (path / "manifest.json").exists():
        return f"every finished record is kept in {path}; run the same command again to resume"
    return f"the run had not begun and {path} holds none of it; run the same command again"


def _manifest(path: Path) -> dict[str, Any]:
    """The run's manifest (written before its first record), or {} when it cannot be read:
    the progress then counts every record alike."""
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def planned_passes(manifest: dict[str, Any]) -> dict[str, float]:
    """Each method's planned passes per problem (every kind of pass), by its id: the weight of
    its records in the time left."""
    out: dict[str, float] = {}
    for method in manifest.get("methods") or []:
        cost = method.get("cost") if isinstance(method, dict) else None
        if isinstance(cost, dict) and "id" in method:
            out[str(method["id"])] = float(sum(v for v in cost.values() if isinstance(v, int)))
    return out


def counts(
    manifest: dict[str, Any], total: int, costs: dict[str, float]
) -> tuple[str, float | None]:
    """What the progress counts, in words (`100 problems × 35 methods (2 budgets)`: a record
    is one problem solved by one method at one budget; a method planned at several budgets is
    one method), and the planned passes of all `total` records (None when the manifest does
    not say)."""
    methods = manifest.get("methods") or []
    if not methods or len(costs) != len(methods) or total % len(methods):
        return "records", None
    problems = total // len(methods)
    budgets = len(manifest.get("budgets") or [])
    plural = "" if len(methods) == 1 else "s"
    text = f"{problems} problem{'' if problems == 1 else 's'} × {len(methods)} method{plural}"
    if budgets > 1:
        text += f" ({budgets} budgets)"
    return text, problems * sum(costs.values())


def _table(cfg: Any, results: dict[str, Any], budget: int, several: bool, width: int) -> Any:
    per = format_flops(budget) if isinstance(budget, Flops) else f"{budget} passes"
    title = (
        f"{cfg.task} · {cfg.backbone} · budget {per}/problem · "
        f"{results['task']['problems']} problems"
    )
    return rich_table(results, title, width=width, budget=budget if several else None)


def _share_reply(outcome: Any) -> Reply:
    """What a share that does not write the results says: what it wrote, what comes next."""
    data = {
        "shard": outcome.shard.label,
        "path": str(outcome.path),
        "written": outcome.written,
        "resumed": outcome.resumed,
    }
    merge = f"; when every share is done: dllmbench merge {outcome.path}"
    nxt = "" if outcome.shard.launched else merge

    def show(console: Console) -> None:
        console.print(
            f"share {outcome.shard.label} done: {outcome.path} ({outcome.written} records "
            f"written, {outcome.resumed} found){nxt}"
        )

    return Reply(data, show)
