"""`dllmbench collect`: on-policy trajectories with snapshots, for training scorers."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dllmbench.cli.argtypes import natural_int, positive_int
from dllmbench.cli.common import (
    CAPACITY,
    GENERAL,
    Reply,
    add_json,
    add_limit,
    add_sampling,
    check_canvas,
    declared_default,
    plugin_arg,
)
from dllmbench.cli.folders import claim
from dllmbench.cli.progress import Progress
from dllmbench.cli.run import DEMO_PROTOCOLS, fill_unset
from dllmbench.core.errors import UserError

COLLECT_CONFIG = "dllmbench.scoring.collect.CollectConfig"


def add_parser(sub: Any) -> None:
    c = sub.add_parser("collect", help="on-policy trajectories with snapshots, for scorers")
    c.add_argument("--task", required=True)
    c.add_argument("--split", default="train", help="the task's split (default %(default)s)")
    c.add_argument("--backbone", required=True)
    c.add_argument(
        "--n", type=positive_int, default=4, help="trajectories per problem (default %(default)s)"
    )
    c.add_argument(
        "--snapshots",
        type=positive_int,
        default=8,
        help="snapshot steps per trajectory, spread over 1..T, after the all-mask canvas "
        "(step 0); at most T (default %(default)s)",
    )
    c.add_argument(
        "--rollouts",
        type=natural_int,
        default=declared_default(COLLECT_CONFIG, "rollouts"),
        help="R continuations to T of every snapshot state before T, graded by the task; "
        "each snapshot stores how many were correct (train-scorer --labels rollout)",
    )
    add_sampling(c)  # unset: a shipped demo model's own protocol, else GENERAL
    add_limit(c)
    c.add_argument(
        "--batch-rows", type=positive_int, default=declared_default(CAPACITY, "batch_rows")
    )
    c.add_argument("--out", required=True, help="collection directory (resumed if it exists)")
    add_json(c)
    c.set_defaults(execute=execute, kept=kept)


def kept(args: argparse.Namespace) -> str:
    """What an interrupted collection keeps, and how to go on."""
    return (
        f"the trajectories of every finished problem are kept in {args.out}; run the same "
        "command again to resume"
    )


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.execution.engine import Capacity, Sampling
    from dllmbench.execution.rates import prompts_fit
    from dllmbench.loading.provenance import Origins
    from dllmbench.loading.registry import registry
    from dllmbench.scoring.collect import (
        CollectConfig,
        collection_manifest,
        done_problems,
        run_collection,
        snapshot_steps,
    )

    reg = registry()
    out = claim(args.out, "collection")  # before the backbone loads
    task_name, task_config = plugin_arg("task", args.task)
    backbone_name, backbone_config = plugin_arg("backbone", args.backbone)
    # a shipped demo model samples as it was trained to, as `run` and `plan` do; else GENERAL
    fill_unset(args, {**GENERAL, **DEMO_PROTOCOLS.get(backbone_name, {})})
    steps = snapshot_steps(args.steps, args.snapshots)
    check_canvas(
        backbone_name, reg.check("backbone", backbone_name, **backbone_config), args.gen_length
    )
    task = reg.task(task_name, **task_config)
    if args.split not in task.splits():
        raise UserError(
            f"task {task_name!r} has no split {args.split!r}; splits: {', '.join(task.splits())}"
        )
    problems = reg.problems(task_name, task, args.split)[: args.limit]
    backbone = reg.backbone(backbone_name, **backbone_config)
    sampling = Sampling(args.steps, args.gen_length, args.prompt, args.seed)
    origins = Origins.of(reg, backbone_name, task_name, {})
    prompts_fit(backbone, task, problems, args.prompt, args.gen_length, origins)
    description = collection_manifest(
        task_name,
        task,
        args.split,
        backbone_name,
        backbone,
        sampling,
        args.n,
        steps,
        len(problems),
        rollouts=args.rollouts,
    )
    capacity = Capacity(batch_rows=args.batch_rows)
    cfg = CollectConfig(
        task,
        backbone,
        description,
        problems,
        args.n,
        steps,
        sampling,
        capacity,
        rollouts=args.rollouts,
    )
    with Progress() as bar:
        done = len(done_problems(out)) if out.exists() else 0
        bar.start(f"collect {task_name}/{args.split}", len(problems), done)
        counts = run_collection(cfg, reg, out, advance=bar.advance)

    def show(console: Console) -> None:
        console.print(
            f"collected {counts['trajectories']} trajectories of "
            f"{counts['problems'] - counts['skipped']} problems into {out} "
            f"({counts['skipped']} problems were already there)"
        )

    return Reply(counts, show)
