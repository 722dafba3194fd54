"""`dllmbench plan`: the configuration each method family takes at a budget; with --task,
--backbone or --preset, a dry run of `run` (every option checked, nothing built). A budget in
FLOPs needs --task and --backbone: their models are built (no forward runs) to price a pass
at the run's reference row (`dllmbench.execution.rates`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dllmbench.cli.argtypes import budgets
from dllmbench.cli.common import (
    GENERAL,
    RUN_CONFIG,
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
    natural_width,
    settings,
    table,
)
from dllmbench.cli.run import DEMO_PROTOCOLS, fill_unset, shipped_model
from dllmbench.core.errors import UserError
from dllmbench.core.flops import format_flops, unit_of
from dllmbench.running import presets

if TYPE_CHECKING:  # the planner's and the registry's modules: imported when the plan is made
    from dllmbench.execution.planner import Plan
    from dllmbench.loading.registry import Registry


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show the configuration each method family takes")
    p.add_argument(
        "--budget",
        type=budgets,
        help="passes per problem, or several: 1040,4160; or FLOPs: 2.1e15flops "
        "(required without --preset)",
    )
    p.add_argument("--task", help="with --backbone or --preset: the task's resolved options")
    p.add_argument("--backbone", help="the backbone's resolved options; no weights are loaded")
    add_sampling(p, seed=False)
    p.add_argument(
        "--split",
        default=declared_default(RUN_CONFIG, "split"),
        help="with a FLOP budget: the split whose prompts price a pass",
    )
    add_limit(p)
    add_preset(p)
    add_methods(p)
    add_scorers(p, "NAME", "scorer names the run will have; families needing others are left out")
    add_json(p)
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.api.interfaces import ends_early, passes_per_step, shipped_scorers
    from dllmbench.execution.planner import (
        backbone_predicts,
        backbone_refuses,
        backbone_varies,
        default_budget,
        plan,
        refuse_missing_scorers,
        refuse_row_settings,
        scorer_users,
    )
    from dllmbench.loading.registry import registry

    reg = registry()
    dry = bool(args.preset or args.task or args.backbone)
    model = shipped_model(args) if args.backbone else None
    if model is not None:  # a shipped demo model samples as `run` samples it: its own way
        fill_unset(args, DEMO_PROTOCOLS[model])
    # a dry run without --scorer shows the scorers the methods use, as `run` would need them
    args.scorer_assumed = dry and args.scorer is None
    args.scorer_unbound = []  # assumed run names that are no scorer plugin's name
    if args.scorer_assumed:
        needed = sorted(scorer_users(reg, methods_arg(args), args.steps or GENERAL["steps"]))
        plugins = set(reg.names("scorer"))
        args.scorer = [name for name in needed if name in plugins]
        args.scorer_unbound = [name for name in needed if name not in plugins]
    s = settings(args, GENERAL)
    if args.budget is None:
        raise UserError(
            "plan needs --budget B (passes per problem), or --preset with --task and --backbone; "
            f"e.g. --budget {default_budget(args.steps)}"
        )
    backbone_config = reg.check("backbone", s.backbone, **s.backbone_config) if s.backbone else None
    check_canvas(s.backbone, backbone_config, args.gen_length)
    shipped = shipped_scorers(backbone_config) if args.scorer_assumed else {}
    if shipped:  # as `run` does: a backbone that ships scorers (the demo's) runs with them
        s = replace(s, scorers=shipped)
        args.scorer_assumed = False
        args.scorer_unbound = []  # refused below when named, left out as families
    passes = passes_per_step(backbone_config)
    scorers = None if s.scorers is None or args.scorer_assumed else set(s.scorers)
    rates = None
    entries = methods_arg(args)
    refuses = backbone_refuses(s.backbone, backbone_config) if s.backbone else None
    if unit_of([args.budget] if isinstance(args.budget, int) else args.budget) == "flops":
        # before the models are built, as a budget in passes refuses them
        refuse_row_settings(
            reg,
            entries,
            args.steps,
            refuses,
            backbone_varies(reg, s.backbone) if s.backbone else None,
            backbone_predicts(reg, s.backbone) if s.backbone else None,
        )
        rates, passes, scorers = _rates(reg, args, s)
    selectors = presets.selector_options(s.preset)  # a preset's selector options
    early = ends_early(backbone_config)  # a threshold or block backbone caps every method
    varies = backbone_varies(reg, s.backbone) if s.backbone else None
    predicts = backbone_predicts(reg, s.backbone) if s.backbone else None
    result = plan(
        reg,
        args.budget,
        args.steps,
        entries,
        scorers,
        passes,
        rates,
        selectors,
        early,
        varies,
        predicts,
        refuses=refuses,
    )
    if entries and scorers is not None:  # the run's scorers are known: refused as `run` does
        refuse_missing_scorers(result)
    resolved = dry_run(reg, args, s, backbone_config) if dry else None

    def show(console: Console) -> None:
        if resolved is not None:
            _print_dry_run(console, resolved)
        _print_plan(console, result, args.steps)

    return Reply({**(resolved or {}), **result.as_dict()}, show)


def _rates(
    reg: Registry, args: argparse.Namespace, s: Settings
) -> tuple[dict[str, int], int, set[str]]:
    """FLOPs per pass by kind at the reference row of the task's problems, with the passes
    per step and the scorers of the built models (a FLOP budget's price)."""
    from dllmbench.api.interfaces import passes_per_step, shipped_scorers
    from dllmbench.execution.rates import reference
    from dllmbench.loading.provenance import Origins

    if not (s.task and s.backbone):
        raise UserError(
            "a FLOP budget needs --task and --backbone (a pass's FLOPs depend on the model and "
            "the prompts), e.g. --task arith --backbone tiny"
        )
    backbone = reg.backbone(s.backbone, **s.backbone_config)
    if args.scorer_assumed or s.scorers is None:  # the run's default: the shipped scorers
        specs = shipped_scorers(reg.check("backbone", s.backbone, **s.backbone_config))
    else:
        specs = s.scorers
    scorers = {
        name: reg.scorer(plugin, shared={"backbone": backbone}, **config)
        for name, (plugin, config) in specs.items()
    }
    task = reg.task(s.task, **s.task_config)
    problems = reg.problems(s.task, task, args.split)[: args.limit]
    origins = Origins.of(reg, s.backbone, s.task, {n: p for n, (p, _) in specs.items()})
    row = reference(
        backbone, scorers, task, problems, args.prompt, args.gen_length, args.steps, origins
    )
    if "denoise" not in row.rates:
        raise UserError(
            f"backbone {s.backbone!r} does not say its model's shape; give the budget in passes"
        )
    return row.rates, passes_per_step(backbone), set(scorers)


def _config(checked: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Every option of a checked plugin configuration (its Config), or the options given."""
    return asdict(checked) if checked is not None else dict(given)


def dry_run(
    reg: Registry, args: argparse.Namespace, s: Settings, backbone_config: Any
) -> dict[str, Any]:
    """What `run` would use with these arguments, each plugin's options checked as `run`
    checks them (`Registry.check`); nothing is built and no weights are loaded."""
    from dllmbench.execution.engine import Sampling

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
    for name in args.scorer_unbound:  # a run name no plugin bears: the user binds it
        out["scorers"][name] = {"plugin": None, "config": {}, "assumed": True}
    out["scorers"] = dict(sorted(out["scorers"].items()))
    return out


def _options_text(config: dict[str, Any]) -> str:
    """`k=v, ...`; a text of several lines is quoted, so that each option stays on its line."""
    shown = [f"{k}={_value_text(v)}" for k, v in config.items() if v is not None]
    return ", ".join(shown) or "defaults"


def _value_text(value: Any) -> str:
    return repr(value) if isinstance(value, str) and "\n" in value else str(value)


def _binding(name: str, plugin: str) -> str:
    """The `--scorer` a run needs for an assumed scorer: with `checkpoint=DIR` when its plugin
    reads one (prm, orm), bare when it has no such option (self: the backbone itself)."""
    from dllmbench.loading.registry import options, registry

    takes = "checkpoint" in options(registry().info("scorer", plugin).factory)
    return f"--scorer {name}={plugin}" + (":checkpoint=DIR" if takes else "")


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
        if entry["plugin"] is None:
            console.print(
                f"scorer {name}: no plugin of that name (assumed: give --scorer {name}=PLUGIN)"
            )
            continue
        how = f" (assumed: give {_binding(name, entry['plugin'])})" if entry["assumed"] else ""
        console.print(f"scorer {name}={entry['plugin']}: {_options_text(entry['config'])}{how}")


def _print_plan(console: Console, result: Plan, steps: int) -> None:
    """A table per budget (with FLOPs and what each plan leaves unused when the budget is in
    FLOPs), then what was left out. A capped method's passes are its cap (≤)."""
    in_flops = result.unit == "flops"
    for budget in result.budgets:
        rows = []
        for p in result.at(budget):
            cap = "≤ " if p.capped else ""
            spend = result.spend(p) or 0
            share = f"{100 * spend / budget:.1f}%"
            flops = [f"{cap}{format_flops(p.flops)}", share, format_flops(budget - spend)]
            priced = flops if in_flops else [share]
            note = "ceiling" if p.method.ceiling else ""
            rows.append((p.method.id, p.method.spec.text(), f"{cap}{p.passes}", *priced, note))
        if in_flops:
            title = f"Plan for a budget of {format_flops(budget)} per problem (T={steps})"
            head = ("method", "configuration", "passes", "FLOPs", "share", "unused", "")
        else:
            title = f"Plan for a budget of {budget} passes per problem (T={steps})"
            head = ("method", "configuration", "passes", "share", "")
        if natural_width(head, rows) <= console.width:
            console.print(table(title, head, rows))
        else:
            _print_blocks(console, title, head, rows)
    for x in result.left_out:
        console.print(f"left out: {x.family} — {x.reason}")


def _print_blocks(
    console: Console, title: str, head: tuple[str, ...], rows: list[tuple[str, ...]]
) -> None:
    """The plan too wide for the terminal as a table: each method on a line with its numbers,
    then its configuration on a line of its own, whole, as `--method` takes it (a terminal
    narrower than a configuration wraps it; nothing here cuts it)."""
    console.print(title, markup=False, highlight=False, soft_wrap=True)
    for label, spec, *values in rows:
        numbers = [f"{h} {v}" if h else v for h, v in zip(head[2:], values, strict=True) if v]
        console.print(
            f"{label}: {', '.join(numbers)}", markup=False, highlight=False, soft_wrap=True
        )
        console.print(f"  {spec}", markup=False, highlight=False, soft_wrap=True)
