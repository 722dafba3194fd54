"""`dllmbench diagnose`: the paper's scorer controls over a collection's stored states."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from dllmbench.cli.argtypes import natural_int, positive_int
from dllmbench.cli.common import (
    Reply,
    add_json,
    add_scorers,
    declared_default,
    plugin_arg,
    scorers_arg,
)
from dllmbench.cli.folders import claim
from dllmbench.cli.progress import Progress
from dllmbench.core.errors import UserError

CONTROLS_CONFIG = "dllmbench.scoring.controls.ControlsConfig"


def add_parser(sub: Any) -> None:
    d = sub.add_parser(
        "diagnose",
        help="the paper's scorer controls over a collection (dllmbench collect)",
        description=(
            "Score every stored state of a collection with each scorer and write "
            "controls.json and controls.md: ROC-AUC by mask ratio over every stored state "
            "(fully decoded states apart), within-problem Kendall τ, the removal-risk "
            "counterfactual (top-M cuts at the initial, middle and final stored states), "
            "mean against last-token readout, the suffix ablation, reversed-input causal "
            "scoring, each scorer as a best-of-N reranker, and a scorer swap on one pool. "
            "Add them to a report with dllmbench report RUN_DIR --controls OUT."
        ),
    )
    d.add_argument("collection", metavar="COLLECTION", help="a directory made by collect")
    add_scorers(
        d,
        "NAME=SPEC",
        "a scorer, e.g. prm=prm:checkpoint=DIR; repeatable (default: the backbone's shipped "
        "scorers, with the demo's causal PRMs)",
    )
    d.add_argument("--backbone", help="default: the collection's backbone")
    d.add_argument(
        "--width",
        type=positive_int,
        help="K: trajectories per group of the removal-risk counterfactual, at most the "
        f"collection's n (default {declared_default(CONTROLS_CONFIG, 'width')}, the paper's, "
        "or n when that is fewer)",
    )
    d.add_argument(
        "--seed",
        type=natural_int,
        default=declared_default(CONTROLS_CONFIG, "seed"),
        help="seed of the bootstrap",
    )
    d.add_argument(
        "--out", help="where controls.json and controls.md go (default: COLLECTION/controls)"
    )
    add_json(d)
    d.set_defaults(execute=execute, kept=kept)


def default_scorers(backbone: str, config: dict[str, Any]) -> dict[str, tuple[str, dict]]:
    """The backbone's shipped PRM and ORM and, for the shipped demo, its causal PRMs."""
    from dllmbench.api.interfaces import shipped_scorers
    from dllmbench.demo import CONTROL_SCORERS, TINY_DIR
    from dllmbench.loading.registry import registry

    shipped = shipped_scorers(registry().check("backbone", backbone, **config))
    out = {name: spec for name, spec in shipped.items() if spec[0] in ("prm", "orm")}
    if any(Path(cfg.get("checkpoint", "")).parent == TINY_DIR for _, cfg in out.values()):
        for name in CONTROL_SCORERS:
            if (TINY_DIR / name / "config.json").is_file():
                out[name] = ("prm", {"checkpoint": str(TINY_DIR / name)})
    return out


def kept(args: argparse.Namespace) -> str:
    """What interrupted controls keep, and how to go on: they are written at their end."""
    out = Path(args.collection) / "controls" if args.out is None else args.out
    return (
        f"the collection is untouched and {out} holds no new controls; run the same command again"
    )


def execute(args: argparse.Namespace) -> Reply:
    from dllmbench.analysis.controls_markdown import markdown
    from dllmbench.loading.registry import registry
    from dllmbench.scoring.collect import read_meta
    from dllmbench.scoring.controls import ControlsConfig, run_controls, write

    path = Path(args.collection)
    meta = read_meta(path)
    out = claim(path / "controls" if args.out is None else args.out, "scorer controls folder")
    if args.backbone:
        backbone = plugin_arg("backbone", args.backbone)
    else:
        backbone = (meta["backbone"]["name"], dict(meta["backbone"]["config"]))
    specs = scorers_arg(args.scorer) if args.scorer else default_scorers(*backbone)
    if not specs:
        raise UserError(
            f"the backbone {backbone[0]!r} ships no scorers; name them with --scorer "
            "NAME=SPEC, e.g. --scorer prm=prm:checkpoint=DIR"
        )
    n = int(meta["n"])
    if args.width is not None and args.width > n:
        raise UserError(
            f"--width {args.width} is more than the {n} trajectories per problem of {path}; "
            f"give --width {n} or fewer (or collect with --n {args.width})"
        )
    width = args.width if args.width is not None else ControlsConfig().width
    cfg = ControlsConfig(width=width, seed=args.seed)
    with Progress() as bar:

        def progress(name: str, rows: int):
            bar.start(f"score {name}", rows)
            return bar.advance

        controls = run_controls(
            path,
            specs,
            registry(),
            cfg,
            backbone_override=backbone,
            progress=progress,
        )
    files = write(out, controls, markdown(controls))
    data = {"out": str(out), "files": list(files), "scorers": sorted(specs)}

    def show(console: Console) -> None:
        console.print(
            f"scorer controls of {', '.join(sorted(specs))} on {path} written to {out}: "
            f"{', '.join(files)}"
        )

    return Reply(data, show)
