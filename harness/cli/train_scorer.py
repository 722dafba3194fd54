"""`dllmbench train-scorer`: train a PRM or ORM on a collection."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dllmbench.cli.argtypes import fraction, natural_int, positive_float, positive_int
from dllmbench.cli.common import Reply, add_json, declared_default, plugin_arg
from dllmbench.cli.folders import claim
from dllmbench.cli.progress import Progress
from dllmbench.core.errors import Blamed, UserError

if TYPE_CHECKING:  # training loads torch: `execute` imports it
    from dllmbench.scoring.training import TrainConfig

TRAIN_CONFIG = "dllmbench.scoring.training.TrainConfig"


def add_parser(sub: Any) -> None:
    t = sub.add_parser("train-scorer", help="train a PRM or ORM on a collection")
    t.add_argument("--kind", required=True, choices=["prm", "orm"])
    t.add_argument("--data", required=True, help="a directory made by dllmbench collect")
    t.add_argument("--backbone", help="default: the collection's backbone")
    t.add_argument("--options", default="", help="scorer options, e.g. attention=causal")
    settings = [  # (flag, type, field, what it is)
        ("--steps", positive_int, "steps", "optimizer steps"),
        ("--batch", positive_int, "batch", "examples per micro-batch"),
        ("--accum", positive_int, "accum", "micro-batches per optimizer step"),
        ("--lr", positive_float, "lr", "AdamW's learning rate"),
        ("--warmup", natural_int, "warmup", "steps of linear warm-up, then a cosine decay"),
        ("--val-fraction", fraction, "val_fraction", "share of problems held out to validate"),
        ("--val-every", positive_int, "val_every", "steps between validations"),
    ]
    for flag, kind, name, what in settings:
        default = declared_default(TRAIN_CONFIG, name)
        t.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    t.add_argument(
        "--groups",
        choices=["all", "mixed", "balanced"],
        default=declared_default(TRAIN_CONFIG, "groups"),
        help="mixed: only problems with both correct and incorrect trajectories; balanced: "
        "of those, as many correct as incorrect trajectories per problem (default %(default)s)",
    )
    t.add_argument(
        "--labels",
        choices=["final", "rollout"],
        default=declared_default(TRAIN_CONFIG, "labels"),
        help="final: each snapshot's trajectory's final correctness; rollout: the share of "
        "its rollouts that were correct (a collection made with collect --rollouts; default "
        "%(default)s)",
    )
    t.add_argument("--seed", type=natural_int, default=declared_default(TRAIN_CONFIG, "seed"))
    t.add_argument("--out", required=True, help="training directory (resumed if it exists)")
    add_json(t)
    t.set_defaults(execute=execute, kept=kept)


def kept(args: argparse.Namespace) -> str:
    """What an interrupted training keeps, and how to go on."""
    return (
        f"the checkpoints saved so far (every --val-every steps) are kept in {args.out}; run "
        "the same command again to resume from the last"
    )


def _config(args: argparse.Namespace) -> TrainConfig:
    from dllmbench.scoring.training import TrainConfig

    return TrainConfig(
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
        labels=args.labels,
    )


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.api.interfaces import TrainableScorer, missing_members
    from dllmbench.loading.registry import registry
    from dllmbench.scoring.collect import load
    from dllmbench.scoring.training import NO_ROLLOUTS, train

    reg = registry()
    if args.warmup > args.steps:  # the learning rate would never reach --lr
        raise UserError(
            f"--warmup {args.warmup} is longer than --steps {args.steps}: the learning rate "
            "would never reach --lr; give a warm-up of at most --steps"
        )
    out = claim(args.out, "scorer training folder")  # not the collection it reads, not a run
    meta, snapshots = load(Path(args.data))
    if args.labels == "rollout" and not meta.get("rollouts"):
        raise UserError(f"{args.data} has no rollouts: {NO_ROLLOUTS}")
    if args.backbone:
        backbone_name, backbone_config = plugin_arg("backbone", args.backbone)
    else:
        backbone_name = meta["backbone"]["name"]
        backbone_config = dict(meta["backbone"]["config"])
    _, options = plugin_arg("scorer", f"{args.kind}:{args.options}")
    reg.check("scorer", args.kind, seed=args.seed, **options)  # before the backbone loads
    backbone = reg.backbone(backbone_name, **backbone_config)
    scorer = reg.scorer(args.kind, shared={"backbone": backbone}, seed=args.seed, **options)
    missing = missing_members(scorer, TrainableScorer)
    if missing:
        raise UserError(
            f"scorer {args.kind!r} cannot be trained here: it lacks {', '.join(missing)} "
            "(dllmbench.interfaces.TrainableScorer)"
        )
    cfg = _config(args)
    # an exception the scorer's own code raises while it trains (its logits, its save) is its
    # fault: one line naming it, exit status 3, as in a run
    blamed = Blamed(scorer, "scorer", args.kind, reg.info("scorer", args.kind).distribution)
    with Progress() as bar:
        record = train(
            blamed,
            snapshots,
            cfg,
            out,
            backbone.mask_id,
            log=bar.log,
            advance=bar.advance,
            started=lambda step: bar.start(f"train {args.kind}", cfg.steps, step),
        )
    return Reply(json.loads(json.dumps(record)), lambda console: _show(console, record, out))


def _fmt(value: float | None) -> str:
    """A ROC-AUC as the training log writes it: `n/a` where it has none (one class only)."""
    return "n/a" if value is None else f"{value:.3f}"


def _show(console: Console, record: dict[str, Any], out: Path) -> None:
    best = record["best"]
    console.print(
        f"best checkpoint: {out / 'best'} (step {best['step']}, validation BCE "
        f"{best['bce']:.4f}, accuracy {best['accuracy']:.3f}, ROC-AUC "
        f"{_fmt(best['auc'])})"
    )
    if "rollout_bce" in best:
        console.print(f"  validation BCE against the rollouts' shares: {best['rollout_bce']:.4f}")
    ranked = best["rerank"]
    if ranked["problems"]:
        console.print(
            f"  best-of-N on {ranked['problems']} validation problems: "
            f"{ranked['top1_accuracy']:.3f} (their mean accuracy {ranked['mean_accuracy']:.3f})"
        )
    for bucket, m in best["by_mask_ratio"].items():
        console.print(f"  mask ratio {bucket}: n={m['n']} ROC-AUC {_fmt(m['auc'])}")
