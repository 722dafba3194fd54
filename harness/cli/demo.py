"""`dllmbench demo retrain --out DIR`: rebuild the shipped demo (the tiny model on `arith`, its
PRM and ORM; or with `--backbone tiny-block`, the block-diffusion one) from a seed, into DIR;
never into the installed package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

from rich.console import Console

from dllmbench.cli.argtypes import natural_int, positive_int
from dllmbench.cli.common import Parser, Reply, add_json, field_default
from dllmbench.cli.folders import claim
from dllmbench.core.errors import UserError
from dllmbench.demo import PRETRAIN_STEPS, DemoBackbone, RetrainConfig


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the shipped demo: rebuild it with `demo retrain`")
    demo.set_defaults(execute=_no_action)
    actions = demo.add_subparsers(dest="action", parser_class=Parser)
    r = actions.add_parser(
        "retrain",
        help="pretrain the tiny model, collect its trajectories, train its PRM and ORM",
        description="Rebuild the demo from a seed into --out (about 45 minutes on two CPU "
        "cores; each stage resumes from --out/build). Run the result with "
        "--backbone tiny:model=OUT --scorer prm=prm:checkpoint=OUT/prm "
        "--scorer orm=orm:checkpoint=OUT/orm.",
    )
    r.add_argument("--out", required=True, help="where the model and scorers go")
    r.add_argument("--seed", type=natural_int, default=field_default(RetrainConfig, "seed"))
    r.add_argument(
        "--backbone",
        choices=get_args(DemoBackbone),
        help="which demo model to rebuild: tiny (the default; Dream's architecture) or "
        "tiny-block (block diffusion on Qwen3; about as long, run as the command prints)",
    )
    r.add_argument(
        "--pretrain-steps",
        type=positive_int,
        default=field_default(RetrainConfig, "pretrain_steps"),
        help="default: "
        + ", ".join(f"{steps} for {model}" for model, steps in PRETRAIN_STEPS.items()),
    )
    r.add_argument(
        "--problems",
        type=positive_int,
        default=field_default(RetrainConfig, "problems"),
        help="train problems to collect",
    )
    r.add_argument(
        "--samples",
        type=positive_int,
        default=field_default(RetrainConfig, "samples"),
        help="trajectories per problem",
    )
    r.add_argument(
        "--scorer-steps",
        type=positive_int,
        default=field_default(RetrainConfig, "scorer_steps"),
        help="PRM training steps",
    )
    r.add_argument(
        "--orm-steps",
        type=positive_int,
        default=field_default(RetrainConfig, "orm_steps"),
        help="ORM training steps",
    )
    r.add_argument(
        "--negatives",
        type=natural_int,
        default=field_default(RetrainConfig, "negatives"),
        help="train problems the ORM also learns from, written out right and with one slip",
    )
    r.add_argument(
        "--orm-groups",
        choices=["all", "mixed", "balanced"],
        default=field_default(RetrainConfig, "orm_groups"),
        help="the ORM learns from the final states of all problems, or of those whose answers "
        "differ (mixed)",
    )
    r.add_argument(
        "--quick",
        action="store_true",
        help="a few steps of every stage (a check of the pipeline in seconds, not a usable model)",
    )
    add_json(r)
    r.set_defaults(execute=retrain, kept=kept)


def _no_action(args: argparse.Namespace) -> Reply:
    raise UserError("demo needs an action: dllmbench demo retrain --out DIR (see --help)")


def kept(args: argparse.Namespace) -> str:
    """What an interrupted retraining keeps, and how to go on: each stage resumes."""
    return f"every finished stage is kept in {args.out}; run the same command again to resume"


def retrain(args: argparse.Namespace) -> Reply:
    from dllmbench.demo.retrain import check_out, retrain  # torch and transformers: here

    if args.out.strip():
        check_out(Path(args.out))  # the installed package first: its own line

    cfg = RetrainConfig(
        out=claim(args.out, "demo folder"),  # before pretraining, its longest stage
        seed=args.seed,
        pretrain_steps=args.pretrain_steps,
        problems=args.problems,
        samples=args.samples,
        scorer_steps=args.scorer_steps,
        orm_steps=args.orm_steps,
        negatives=args.negatives,
        orm_groups=args.orm_groups,
        backbone=args.backbone or field_default(RetrainConfig, "backbone"),
    )
    if args.quick:
        cfg = cfg.quick()
    done = retrain(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))

    def show(console: Console) -> None:
        console.print(f"demo written to {done['out']}; run it with")
        scorers = " ".join(f"--scorer {entry}" for entry in done["scorers"].values())
        console.print(
            f"  dllmbench run --task {done['task']} --backbone {done['backbone']} {scorers} "
            f"--steps {done['steps']} --gen-length {done['gen_length']} --prompt fewshot",
            soft_wrap=True,
        )

    return Reply(done, show)
