"""`dllmbench collect` and `dllmbench train-scorer`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from dllmbench.argtypes import fraction, natural_int, positive_float, positive_int
from dllmbench.collect import (
    CollectConfig,
    collect,
    describe_collection,
    done_problems,
    load,
    snapshot_steps,
)
from dllmbench.engine import Limits, Sampling
from dllmbench.errors import UserError
from dllmbench.method import parse_part
from dllmbench.progress import Progress
from dllmbench.registry import registry
from dllmbench.training import TrainConfig, train


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("collect", help="on-policy trajectories with snapshots, for scorers")
    c.add_argument("--task", required=True)
    c.add_argument("--split", default="train")
    c.add_argument("--backbone", required=True)
    c.add_argument("--n", type=positive_int, default=4, help="trajectories per problem")
    c.add_argument(
        "--snapshots", type=positive_int, default=8, help="snapshot steps per trajectory"
    )
    c.add_argument("--steps", type=positive_int, default=128)
    c.add_argument("--gen-length", type=positive_int, default=512)
    c.add_argument("--prompt", default="chat", choices=["chat", "fewshot"])
    c.add_argument("--limit", type=positive_int, help="first N problems of the split")
    c.add_argument("--seed", type=natural_int, default=0)
    c.add_argument("--batch-rows", type=positive_int, default=64)
    c.add_argument("--out", required=True, help="collection directory (resumed if it exists)")
    c.add_argument("--json", action="store_true")

    t = sub.add_parser("train-scorer", help="train a PRM or ORM on a collection")
    t.add_argument("--kind", required=True, choices=["prm", "orm"])
    t.add_argument("--data", required=True, help="a directory made by dllmbench collect")
    t.add_argument("--backbone", help="default: the collection's backbone")
    t.add_argument("--options", default="", help="scorer options, e.g. attention=causal")
    t.add_argument("--steps", type=positive_int, default=2000)
    t.add_argument("--batch", type=positive_int, default=32)
    t.add_argument("--accum", type=positive_int, default=1)
    t.add_argument("--lr", type=positive_float, default=2e-5)
    t.add_argument("--warmup", type=natural_int, default=0)
    t.add_argument("--val-fraction", type=fraction, default=0.1)
    t.add_argument("--val-every", type=positive_int, default=200)
    t.add_argument(
        "--groups",
        choices=["all", "mixed", "balanced"],
        default="all",
        help="mixed: only problems with both correct and incorrect trajectories; balanced: "
        "of those, as many correct as incorrect trajectories per problem",
    )
    t.add_argument("--seed", type=natural_int, default=0)
    t.add_argument("--out", required=True, help="training directory (resumed if it exists)")
    t.add_argument("--json", action="store_true")


def cmd_collect(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    reg = registry()
    task_name, task_config = parse_part(args.task)
    backbone_name, backbone_config = parse_part(args.backbone)
    if args.n < 1:
        raise UserError(f"--n must be >= 1, got {args.n}")
    task = reg.task(task_name, **task_config)
    if args.split not in task.splits():
        raise UserError(
            f"task {task_name!r} has no split {args.split!r}; splits: {', '.join(task.splits())}"
        )
    problems = task.problems(args.split)[: args.limit]
    backbone = reg.backbone(backbone_name, **backbone_config)
    sampling = Sampling(args.steps, args.gen_length, args.prompt, args.seed)
    steps = snapshot_steps(args.steps, args.snapshots)
    description = describe_collection(
        task_name, task, args.split, backbone_name, backbone, sampling, args.n, steps, len(problems)
    )
    out = Path(args.out)
    cfg = CollectConfig(
        task,
        backbone,
        description,
        problems,
        args.n,
        steps,
        sampling,
        Limits(batch_rows=args.batch_rows),
        shard_problems=64,
    )
    with Progress() as bar:
        done = len(done_problems(out)) if out.exists() else 0
        bar.start(f"collect {task_name}/{args.split}", len(problems), done)
        counts = collect(cfg, reg, out, advance=bar.advance)
    if not args.json:
        console.print(
            f"collected {counts['trajectories']} trajectories of "
            f"{counts['problems'] - counts['skipped']} problems into {out} "
            f"({counts['skipped']} problems were already there)"
        )
    return counts


def cmd_train_scorer(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    reg = registry()
    meta, snapshots = load(Path(args.data))
    if args.backbone:
        backbone_name, backbone_config = parse_part(args.backbone)
    else:
        backbone_name = meta["backbone"]["name"]
        backbone_config = {k: v for k, v in meta["backbone"]["config"].items()}
    _, options = parse_part(f"x:{args.options}")
    reg.check("scorer", args.kind, seed=args.seed, **options)  # before the backbone loads
    backbone = reg.backbone(backbone_name, **backbone_config)
    scorer = reg.scorer(args.kind, shared={"backbone": backbone}, seed=args.seed, **options)
    if not hasattr(scorer, "trainable"):
        raise UserError(f"scorer {args.kind!r} cannot be trained here")
    cfg = TrainConfig(
        kind=args.kind,
        steps=args.steps,
        batch=args.batch,
        accum=args.accum,
        lr=args.lr,
        warmup=args.warmup,
        val_fraction=args.val_fraction,
        val_every=args.val_every,
        groups=args.groups,
        seed=args.seed,
    )
    out = Path(args.out)
    with Progress() as bar:
        bar.start(f"train {args.kind}", cfg.steps)
        record = train(
            scorer,
            snapshots,
            cfg,
            out,
            backbone.mask_id,
            log=bar.log,
            advance=bar.advance,
        )
    if not args.json:
        best = record["best"]
        console.print(
            f"best checkpoint: {out / 'best'} (step {best['step']}, validation BCE "
            f"{best['bce']:.4f}, accuracy {best['accuracy']:.3f}, ROC-AUC "
            f"{best['auc']})"
        )
        ranked = best["rerank"]
        if ranked["problems"]:
            console.print(
                f"  best-of-N on {ranked['problems']} validation problems: "
                f"{ranked['top1_accuracy']:.3f} (their mean accuracy {ranked['mean_accuracy']:.3f})"
            )
        for bucket, m in best["by_mask_ratio"].items():
            console.print(f"  mask ratio {bucket}: n={m['n']} ROC-AUC {m['auc']}")
    return json.loads(json.dumps(record))
