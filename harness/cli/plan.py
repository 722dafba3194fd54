"""`dllmbench plan`: the configuration each method family takes at a budget; with --task,
--backbone or --preset, a dry run of `run` (every option checked, nothing built)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.console import Console

from dllmbench.api.interfaces import passes_per_step
from dllmbench.cli.argtypes import budgets
from dllmbench.cli.common import (
    GENERAL,
    Reply,
    Settings,
    add_json,
    add_methods,
    add_preset,
    add_sampling,
    add_scorers,
    check_canvas,
    methods_arg,
    settings,
    table,
)
from dllmbench.core.errors import UserError
from dllmbench.execution.engine import Sampling
from dllmbench.execution.planner import Plan, default_budget, plan, scorer_users
from dllmbench.loading.registry import Registry, registry


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show the configuration each method family takes")
    p.add_argument(
        "--budget",
        type=budgets,
        help="passes per problem, or several: 1040,4160 (required without --preset)",
    )
    p.add_argument("--task", help="with --backbone or --preset: the task's resolved options")
    p.add_argument("--backbone", help="the backbone's resolved options; no weights are loaded")
    add_sampling(p, seed=False)
    add_preset(p)
    add_methods(p)
    add_scorers(p, "NAME", "scorer names the run will have; families needing others are left out")
    add_json(p)
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> Reply:
    reg = registry()
    dry = bool(args.preset or args.task or args.backbone)
    # a dry run without --scorer shows the scorers the methods use, as `run` would need them
    args.scorer_assumed = dry and args.scorer is None
    if args.scorer_assumed:
        args.scorer = sorted(scorer_users(reg, methods_arg(args), args.steps or GENERAL["steps"]))
    s = settings(args, GENERAL)
    if args.budget is None:
        raise UserError(
            "plan needs --budget B (passes per problem), or --preset with --task and --backbone; "
            f"e.g. --budget {default_budget(args.steps)}"
        )
    backbone_config = reg.check("backbone", s.backbone, **s.backbone_config) if s.backbone else None
    check_canvas(s.backbone, backbone_config, args.gen_length)
    passes = passes_per_step(backbone_config)
    scorers = None if s.scorers is None or args.scorer_assumed else set(s.scorers)
    result = plan(reg, args.budget, args.steps, methods_arg(args), scorers, passes)
    resolved = dry_run(reg, args, s, backbone_config) if dry else None

    def show(console: Console) -> None:
        if resolved is not None:
            _print_dry_run(console, resolved)
        _print_plan(console, result, args.steps)

    return Reply({**(resolved or {}), **result.as_dict()}, show)


def _config(checked: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Every option of a checked plugin configuration (its Config), or the options given."""
    return asdict(checked) if checked is not None else dict(given)


def dry_run(
    reg: Registry, args: argparse.Namespace, s: Settings, backbone_config: Any
) -> dict[str, Any]:
    """What `run` would use with these arguments, each plugin's options checked as `run`
    checks them (`Registry.check`); nothing is built and no weights are loaded."""
    sampling = Sampling(args.steps, args.gen_length, args.prompt)
    out: dict[str, Any] = {
        "preset": s.preset,
        # the names of the command line and the preset (the manifest says total_steps and
        # prompt_style, as `Sampling` does)
        "sampling": {
            "steps": sampling.total_steps,
            "gen_length": sampling.gen_length,
            "prompt": sampling.prompt_style,
            "seed": sampling.seed,
        },
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
    """`k=v, ...`; a text of several lines is quoted, so that each option stays on its line."""
    shown = [f"{k}={_value_text(v)}" for k, v in config.items() if v is not None]
    return ", ".join(shown) or "defaults"


def _value_text(value: Any) -> str:
    return repr(value) if isinstance(value, str) and "\n" in value else str(value)


def _print_dry_run(console: Console, dry: dict[str, Any]) -> None:
    if dry["preset"]:
        p = dry["preset"]
        over = _options_text(p["overridden"])
        note = f" (overridden: {over})" if p["overridden"] else ""
        console.print(f"preset {p['name']}: {len(p['set'])} values set{note}")
    sampling = dry["sampling"]
    console.print(
        f"sampling: T={sampling['steps']}, {sampling['gen_length']} generated tokens, "
        f"prompt {sampling['prompt']}, seed {sampling['seed']}"
    )
    for kind in ("backbone", "task"):
        if kind in dry:
            console.print(f"{kind} {dry[kind]['name']}: {_options_text(dry[kind]['config'])}")
    for name, entry in dry["scorers"].items():
        how = " (assumed: give --scorer NAME=PLUGIN:checkpoint=DIR)" if entry["assumed"] else ""
        console.print(f"scorer {name}={entry['plugin']}: {_options_text(entry['config'])}{how}")


def _print_plan(console: Console, result: Plan, steps: int) -> None:
    """A table per budget, then what was left out."""
    for budget in result.budgets:
        rows = [
            (
                p.method.id,
                p.method.spec.text(),
                str(p.passes),
                f"{100 * p.passes / budget:.1f}%",
                "ceiling" if p.method.ceiling else "",
            )
            for p in result.at(budget)
        ]
        title = f"Plan for a budget of {budget} passes per problem (T={steps})"
        console.print(table(title, ("method", "configuration", "passes", "share", ""), rows))
    for x in result.left_out:
        console.print(f"left out: {x.family} — {x.reason}")
