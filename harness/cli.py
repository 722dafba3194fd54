"""The command line: `dllmbench run | plan | plugins | tasks`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

from dllmbench import __version__, presets, scoring_cli
from dllmbench.argtypes import name_list, natural_int, positive_int, scorer_entry
from dllmbench.engine import Limits, Sampling
from dllmbench.errors import CostMismatch, UserError
from dllmbench.leaderboard import rich_table
from dllmbench.method import parse_part
from dllmbench.planner import check_scorers, default_budget, plan, scorer_users
from dllmbench.progress import Progress
from dllmbench.registry import registry


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"dllmbench: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _scorers_arg(entries: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """`--scorer prm` or `--scorer orm=toy:partial=false` → {run name: (plugin, config)}."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for entry in entries:
        name, eq, plugin = entry.partition("=")
        out[name.strip()] = parse_part(plugin if eq else name)
    return out


# `dllmbench run` with neither --task nor --backbone: the shipped tiny model on arith, with
# the PRM and ORM trained for it; every option can still be given.
DEMO = {
    "task": "arith",
    "backbone": "tiny",
    "steps": 24,
    "gen_length": 24,
    "prompt": "fewshot",
    "limit": 100,
}
# every other run (the paper's T and canvas); `--preset` and explicit flags come first
GENERAL = {"steps": 128, "gen_length": 512, "prompt": "chat"}


def _preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=sorted(presets.PRESETS),
        help="every setting of a published protocol for --task and --backbone "
        "(docs/reproducing.md); explicit flags and options override single values",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dllmbench",
        description=(
            "Compare test-time search strategies for diffusion LMs "
            "at a matched forward-pass budget."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dllmbench {__version__}")
    # `dllmbench --json plugins` as well as `dllmbench plugins --json`
    parser.add_argument("--json", dest="json_before", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run methods on a task and print the leaderboard")
    run.add_argument("--task", help="task[:option=value,...], e.g. gsm8k or arith:test_size=50")
    run.add_argument("--split", default="test")
    run.add_argument("--backbone", help="backbone[:option=value,...], e.g. dream, llada or tiny")
    run.add_argument(
        "--scorer",
        action="append",
        default=None,
        type=scorer_entry,
        metavar="NAME[=PLUGIN[:k=v,...]]",
        help="a scorer under the name methods use, e.g. orm=orm:checkpoint=DIR; repeatable",
    )
    run.add_argument("--budget", type=positive_int, help="passes per problem each method may spend")
    run.add_argument(
        "--methods", type=name_list, help="comma-separated method families; default: all"
    )
    run.add_argument(
        "--method",
        action="append",
        default=[],
        metavar="SPEC",
        help="a method spec, e.g. independent:n=8+majority; repeatable",
    )
    run.add_argument("--reference", help="method the Δ column is paired against (default Vanilla)")
    _preset_arg(run)
    run.add_argument("--steps", type=positive_int, help="denoising steps T (default 128)")
    run.add_argument(
        "--gen-length", type=positive_int, help="generated tokens per canvas (default 512)"
    )
    run.add_argument("--prompt", choices=["chat", "fewshot"], help="prompt style (default chat)")
    run.add_argument("--limit", type=positive_int, help="first N problems of the split")
    run.add_argument("--seed", type=natural_int, default=0)
    run.add_argument("--batch-rows", type=positive_int, default=64, help="rows per forward")
    run.add_argument("--batch-tokens", type=positive_int, help="rows × canvas length per forward")
    run.add_argument("--max-problems", type=positive_int, default=32, help="problems in flight")
    run.add_argument("--resamples", type=positive_int, default=2000, help="bootstrap resamples")
    run.add_argument("--out", help="run directory (default runs/TASK-BACKBONE-bBUDGET-seedSEED)")
    run.add_argument(
        "--resume", action="store_true", help="require an existing run directory and continue it"
    )
    run.add_argument("--json", action="store_true", help="print results.json instead of a table")
    run.add_argument(
        "--allow-deterministic",
        action="store_true",
        help="run multi-candidate methods even if the backbone samples deterministically",
    )

    p = sub.add_parser("plan", help="show the configuration each method family takes")
    p.add_argument(
        "--budget", type=positive_int, help="passes per problem (required without --preset)"
    )
    p.add_argument("--steps", type=positive_int, help="denoising steps T (default 128)")
    p.add_argument("--task", help="with --backbone or --preset: the task's resolved options")
    p.add_argument("--backbone", help="the backbone's resolved options; no weights are loaded")
    p.add_argument("--gen-length", type=positive_int, help="generated tokens (default 512)")
    p.add_argument("--prompt", choices=["chat", "fewshot"], help="prompt style (default chat)")
    _preset_arg(p)
    p.add_argument(
        "--methods", type=name_list, help="comma-separated method families; default: all"
    )
    p.add_argument("--method", action="append", default=[], metavar="SPEC")
    p.add_argument(
        "--scorer",
        action="append",
        default=None,
        type=scorer_entry,
        metavar="NAME",
        help="scorer names the run will have; families needing others are left out",
    )
    p.add_argument("--json", action="store_true")

    pl = sub.add_parser("plugins", help="list every registered plugin")
    pl.add_argument("--json", action="store_true")

    t = sub.add_parser("tasks", help="list tasks with their splits and sizes")
    t.add_argument("--json", action="store_true")
    scoring_cli.add_parsers(sub)
    return parser


def _methods_arg(args: argparse.Namespace) -> list[str] | None:
    return (list(args.methods or []) + list(args.method)) or None


@dataclass
class _Settings:
    """--task, --backbone and --scorer parsed, a preset's values applied."""

    task: str | None
    task_config: dict[str, Any]
    backbone: str | None
    backbone_config: dict[str, Any]
    scorers: dict[str, tuple[str, dict[str, Any]]] | None
    preset: dict[str, Any] | None  # what the preset set and what was overridden


def _settings(args: argparse.Namespace, defaults: dict[str, Any]) -> _Settings:
    """Parse --task, --backbone and --scorer; fill the flags from --preset, then from
    `defaults`. An explicit flag or plugin option always wins over the preset's value."""
    task, task_config = parse_part(args.task) if args.task else (None, {})
    backbone, backbone_config = parse_part(args.backbone) if args.backbone else (None, {})
    scorers = None if args.scorer is None else _scorers_arg(args.scorer)
    record = None
    if args.preset:
        if task is None or backbone is None:
            raise UserError(
                f"--preset {args.preset} needs --task and --backbone; e.g. "
                f"--preset {args.preset} --task gsm8k --backbone dream"
            )
        resolved = presets.apply(
            args.preset,
            backbone=backbone,
            task=task,
            flags={key: getattr(args, key) for key in presets.FLAGS},
            backbone_config=backbone_config,
            task_config=task_config,
            scorers=scorers,
        )
        for key, value in resolved.flags.items():
            setattr(args, key, value)
        task_config, backbone_config = resolved.task_config, resolved.backbone_config
        scorers, record = resolved.scorers, resolved.record
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return _Settings(task, task_config, backbone, backbone_config, scorers, record)


def _config(checked: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Every option of a checked plugin configuration (its Config), or the options given."""
    return asdict(checked) if checked is not None else dict(given)


def _dry_run(args: argparse.Namespace, s: _Settings, backbone_config: Any) -> dict[str, Any]:
    """What `run` would use with these arguments, each plugin's options checked as `run`
    checks them (`Registry.check`); nothing is built and no weights are loaded."""
    reg = registry()
    out: dict[str, Any] = {
        "preset": s.preset,
        "sampling": asdict(Sampling(args.steps, args.gen_length, args.prompt)),
    }
    if s.backbone:
        out["backbone"] = {
            "name": s.backbone,
            "config": _config(backbone_config, s.backbone_config),
        }
    if s.task:
        checked = reg.check("task", s.task, **s.task_config)
        out["task"] = {"name": s.task, "config": _config(checked, s.task_config)}
    out["scorers"] = {
        name: {
            "plugin": plugin,
            "config": _config(reg.check("scorer", plugin, **config), config),
            "assumed": args.scorer_assumed,
        }
        for name, (plugin, config) in sorted((s.scorers or {}).items())
    }
    return out


def _options_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items() if v is not None) or "defaults"


def _print_dry_run(console: Console, dry: dict[str, Any]) -> None:
    if dry["preset"]:
        p = dry["preset"]
        over = _options_text(p["overridden"])
        note = f" (overridden: {over})" if p["overridden"] else ""
        console.print(f"preset {p['name']}: {len(p['set'])} values set{note}")
    sampling = dry["sampling"]
    console.print(
        f"sampling: T={sampling['total_steps']}, {sampling['gen_length']} generated tokens, "
        f"prompt {sampling['prompt_style']}, seed {sampling['seed']}"
    )
    for kind in ("backbone", "task"):
        if kind in dry:
            console.print(f"{kind} {dry[kind]['name']}: {_options_text(dry[kind]['config'])}")
    for name, entry in dry["scorers"].items():
        how = " (assumed: give --scorer NAME=PLUGIN:checkpoint=DIR)" if entry["assumed"] else ""
        console.print(f"scorer {name}={entry['plugin']}: {_options_text(entry['config'])}{how}")


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    reg = registry()
    dry = bool(args.preset or args.task or args.backbone)
    # a dry run without --scorer shows the scorers the methods use, as `run` would need them
    args.scorer_assumed = dry and args.scorer is None
    if args.scorer_assumed:
        args.scorer = sorted(scorer_users(reg, _methods_arg(args), args.steps or 128))
    s = _settings(args, GENERAL)
    if args.budget is None:
        raise UserError(
            "plan needs --budget B (passes per problem), or --preset with --task and --backbone; "
            f"e.g. --budget {default_budget(args.steps)}"
        )
    backbone_config = reg.check("backbone", s.backbone, **s.backbone_config) if s.backbone else None
    passes = int(getattr(backbone_config, "passes_per_step", 1))
    scorers = None if s.scorers is None or args.scorer_assumed else set(s.scorers)
    result = plan(reg, args.budget, args.steps, _methods_arg(args), scorers, passes)
    resolved = _dry_run(args, s, backbone_config) if dry else None
    if args.json:
        print(json.dumps({**(resolved or {}), **result.as_dict()}, indent=2))
        return 0
    if resolved is not None:
        _print_dry_run(console, resolved)
    table = Table(title=f"Plan for a budget of {args.budget} passes per problem (T={args.steps})")
    for col in ("method", "configuration", "passes", "share", ""):
        table.add_column(col)
    for p in result.methods:
        table.add_row(
            p.method.id,
            p.method.spec.text(),
            str(p.passes),
            f"{100 * p.passes / args.budget:.1f}%",
            "ceiling" if p.method.ceiling else "",
        )
    console.print(table)
    for x in result.left_out:
        console.print(f"left out: {x.family} — {x.reason}")
    return 0


def cmd_plugins(args: argparse.Namespace, console: Console) -> int:
    infos = sorted(registry().all(), key=lambda i: (i.kind, i.name))
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
        return 0
    table = Table(title="dllmbench plugins")
    for col in ("kind", "name", "distribution", "version", "module"):
        table.add_column(col)
    for i in infos:
        table.add_row(i.kind, i.name, i.distribution, i.version, i.module)
    console.print(table)
    return 0


def cmd_tasks(args: argparse.Namespace, console: Console) -> int:
    reg = registry()
    rows = []
    for name in reg.names("task"):
        rows.append(
            {
                "name": name,
                "distribution": reg.info("task", name).distribution,
                "splits": reg.task(name).splits(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="dllmbench tasks")
    for col in ("task", "splits", "distribution"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"], ", ".join(f"{k} ({v})" for k, v in r["splits"].items()), r["distribution"]
        )
    console.print(table)
    return 0


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from dllmbench.runner import RunConfig, run

    reg = registry()
    if not args.task and not args.backbone and not args.preset:  # the shipped demo
        for key, value in DEMO.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    s = _settings(args, GENERAL)
    if not args.task:
        raise UserError(f"--task is required; tasks: {', '.join(reg.names('task')) or 'none'}")
    if not args.backbone:
        raise UserError(
            f"--backbone is required; backbones: {', '.join(reg.names('backbone')) or 'none'}"
        )
    task, task_config = s.task, s.task_config
    backbone, backbone_config = s.backbone, s.backbone_config
    scorers = s.scorers
    if scorers is not None:  # a typo in a scorer name costs no model load
        users = scorer_users(reg, _methods_arg(args), args.steps)
        check_scorers(users, set(scorers), requested=_methods_arg(args) is not None)
    try:
        limits = Limits(args.batch_rows, args.batch_tokens, args.max_problems)
    except ValueError as exc:
        raise UserError(f"{exc}; e.g. --batch-rows 64 --max-problems 32") from exc
    cfg = RunConfig(
        task=task,
        task_config=task_config,
        backbone=backbone,
        backbone_config=backbone_config,
        scorers=scorers,
        split=args.split,
        limit=args.limit,
        budget=args.budget,
        methods=_methods_arg(args),
        reference=args.reference,
        sampling=Sampling(args.steps, args.gen_length, args.prompt, args.seed),
        limits=limits,
        resamples=args.resamples,
        out=args.out,
        command=sys.argv,
        allow_deterministic=args.allow_deterministic,
        preset=s.preset,
    )
    if args.resume and not (cfg.run_dir() / "manifest.json").exists():
        raise UserError(f"--resume: {cfg.run_dir()} holds no run to resume; drop --resume")
    try:
        with Progress() as progress:
            outcome = run(
                cfg,
                on_record=lambda _r: progress.advance(),
                on_start=lambda total, done: progress.start(f"{cfg.task} × methods", total, done),
            )
    except KeyboardInterrupt:
        sys.stderr.write(
            f"dllmbench: interrupted; every finished record is kept in "
            f"{cfg.run_dir()}; run the same command again to resume\n"
        )
        return 130
    if args.json:
        print(json.dumps(outcome.results, indent=2))
        return 0
    title = (
        f"{cfg.task} · {cfg.backbone} · budget {outcome.plan.budget} passes/problem · "
        f"{outcome.results['task']['problems']} problems"
    )
    console.print(rich_table(outcome.results, title, width=console.width))
    for x in outcome.plan.left_out:
        console.print(f"left out: {x.family} — {x.reason}")
    note = f", {outcome.resumed} resumed" if outcome.resumed else ""
    console.print(f"run directory: {outcome.path} ({outcome.written} records written{note})")
    return 0


def _json_command(command):
    """A command returning a dict, printed as JSON under --json."""

    def run(args: argparse.Namespace, console: Console) -> int:
        result = command(args, console)
        if args.json:
            print(json.dumps(result, indent=2))
        return 0

    return run


COMMANDS = {
    "run": cmd_run,
    "plan": cmd_plan,
    "plugins": cmd_plugins,
    "tasks": cmd_tasks,
    "collect": _json_command(scoring_cli.cmd_collect),
    "train-scorer": _json_command(scoring_cli.cmd_train_scorer),
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # piped output (a file, a log) is not cut to 80 columns unless COLUMNS says so
    wide = sys.stdout.isatty() or os.environ.get("COLUMNS")
    console = Console() if wide else Console(width=160)
    if args.command is None:
        parser.print_help()
        return 2
    args.json = args.json or args.json_before
    try:
        return COMMANDS[args.command](args, console)
    except UserError as exc:
        sys.stderr.write(f"dllmbench: error: {exc}\n")
        return 2
    except CostMismatch as exc:
        sys.stderr.write(f"dllmbench: ledger check failed: {exc}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("dllmbench: interrupted\n")
        return 130
    except BrokenPipeError:  # `dllmbench plugins --json | head`: the reader left; so do we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
