"""`dllmbench run`: run methods on a task and print the leaderboard; with neither --task nor
--backbone, the shipped demo."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from dllmbench.analysis.leaderboard import rich_table
from dllmbench.cli.argtypes import budgets, positive_int
from dllmbench.cli.common import (
    GENERAL,
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
    field_default,
    methods_arg,
    settings,
    stdout_console,
)
from dllmbench.cli.progress import Progress
from dllmbench.core.errors import Terminated, UserError
from dllmbench.core.flops import Flops, format_flops
from dllmbench.demo import BLOCK_DEMO, DEMO_TASK
from dllmbench.execution.engine import Capacity, Sampling
from dllmbench.execution.planner import check_scorers, scorer_users
from dllmbench.loading.registry import Registry, registry
from dllmbench.running.runner import RunConfig
from dllmbench.storage.shards import parse_shard, resolve

# `dllmbench run` with neither --task nor --backbone: the shipped tiny model on arith, with
# the PRM and ORM trained for it; every option can still be given.
DEMO = {
    "task": DEMO_TASK,
    "backbone": "tiny",
    "steps": 24,
    "gen_length": 32,
    "prompt": "fewshot",
    "limit": 100,
}
# each demo model's protocol: `run` with no --task and one of these backbones (or none: tiny)
# is the demo on it
DEMO_PROTOCOLS: dict[str, dict[str, int]] = {
    "tiny": {"steps": DEMO["steps"], "gen_length": DEMO["gen_length"]},
    "tiny-block": dict(BLOCK_DEMO),
}


# the demo's budgets without --budget: its matched budget (PRM Guided K=8 with two segments)
# and four times it (K=32), as the paper's two budgets
DEMO_BUDGET_FACTORS = (1, 4)


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run methods on a task and print the leaderboard")
    run.add_argument("--task", help="task[:option=value,...], e.g. gsm8k or arith:test_size=50")
    run.add_argument("--split", default=field_default(RunConfig, "split"))
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
        default=field_default(Capacity, "batch_rows"),
        help="rows per forward (default %(default)s)",
    )
    run.add_argument("--batch-tokens", type=positive_int, help="rows × canvas length per forward")
    run.add_argument(
        "--max-problems",
        type=positive_int,
        default=field_default(Capacity, "problems"),
        help="problems in flight (default %(default)s)",
    )
    run.add_argument(
        "--shard",
        type=parse_shard,
        metavar="I/N",
        help="run share I of N of the problems into --out (then: dllmbench merge --out)",
    )
    run.add_argument(
        "--resamples",
        type=positive_int,
        default=field_default(RunConfig, "resamples"),
        help="bootstrap resamples (default %(default)s)",
    )
    run.add_argument(
        "--out", help="run directory (default runs/TASK-BACKBONE-bBUDGETS-seedSEED, e.g. b1040)"
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
    run.set_defaults(execute=execute)


def _required(reg: Registry, s: Settings) -> None:
    if not s.task:
        raise UserError(f"--task is required; tasks: {', '.join(reg.names('task')) or 'none'}")
    if not s.backbone:
        raise UserError(
            f"--backbone is required; backbones: {', '.join(reg.names('backbone')) or 'none'}"
        )


def _capacity(args: argparse.Namespace) -> Capacity:
    try:
        return Capacity(args.batch_rows, args.batch_tokens, args.max_problems)
    except ValueError as exc:
        default = Capacity()
        raise UserError(
            f"{exc}; e.g. --batch-rows {default.batch_rows} --max-problems {default.problems}"
        ) from exc


def run_config(args: argparse.Namespace) -> Any:
    """The `RunConfig` these arguments ask for, checked as far as it can be without a model."""

    reg = registry()
    if args.out is not None and not args.out.strip():
        raise UserError("--out is empty; give the run directory, e.g. --out runs/mine")
    model = (args.backbone or DEMO["backbone"]).split(":", 1)[0]
    demo = not args.task and not args.preset and model in DEMO_PROTOCOLS
    if demo:  # the shipped demo, on the model asked for
        for key, value in {**DEMO, **DEMO_PROTOCOLS[model]}.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
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
        what = f"{cfg.task} × methods" + (f" (share {shard.label})" if shard else "")
        with Progress() as progress:
            outcome = run(
                cfg,
                on_record=lambda _r: progress.advance(),
                on_start=lambda total, done: progress.start(what, total, done),
                on_budget=early_table,
            )
    except Terminated:
        raise Interrupted(
            f"terminated (SIGTERM); every finished record is kept in {cfg.run_dir()}; "
            "run the same command again to resume",
            status=143,
        ) from None
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; every finished record is kept in {cfg.run_dir()}; "
            "run the same command again to resume"
        ) from None
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
        console.print(
            f"run directory: {outcome.path} ({outcome.written} records written{by}{note})",
            soft_wrap=True,  # a path is never cut; the terminal wraps it
        )

    return Reply(outcome.results, show)


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
