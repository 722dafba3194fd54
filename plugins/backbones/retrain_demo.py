"""Rebuild the shipped demo from a seed: the tiny dLLM, its trajectories, its PRM and ORM.

    python -m dllmbench.plugins.backbones.retrain_demo [--seed 0] [--out DIR]

Stages (each printed with its time): train the Dream-architecture model on the arith train
stream with the masked-diffusion loss; collect on-policy trajectories on arith train problems
through the engine; train the PRM on every snapshot and the ORM on final states, validating on
held-out train problems. The default output is the package's own `tiny_model/` folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dllmbench.collect import CollectConfig, collect, describe_collection, load, snapshot_steps
from dllmbench.engine import Limits, Sampling
from dllmbench.plugins.backbones.pretrain import PretrainConfig, pretrain, word_tokenizer
from dllmbench.plugins.backbones.tiny import TINY_DIR, Tiny
from dllmbench.registry import registry
from dllmbench.tasks.arith import Arith, format_example
from dllmbench.training import TrainConfig, train

STEPS, GEN_LENGTH = 24, 24  # the demo's sampling protocol (T and generated tokens)
SCORER = {
    "target_modules": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "lora_r": 32,
    "lora_alpha": 64,
    "head_width": 256,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TINY_DIR)
    parser.add_argument("--pretrain-steps", type=int, default=2500)
    parser.add_argument("--problems", type=int, default=1000, help="train problems to collect")
    parser.add_argument("--samples", type=int, default=8, help="trajectories per problem")
    parser.add_argument("--scorer-steps", type=int, default=600)
    parser.add_argument(
        "--orm-groups",
        choices=["all", "mixed", "balanced"],
        default="mixed",
        help="the ORM learns from problems whose answers differ (mixed) or from all",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("demo-build"),
        help="scratch folder for trajectories and training state",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    task = Arith(seed=args.seed)
    started = time.time()

    def stage(name: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {name}", flush=True)

    stage("pretraining the tiny dLLM")
    texts = [
        t
        for e in [*task.examples("train", 0, 5000), *task.examples("test")]
        for t in (format_example(e.question), " " + e.solution)
    ]

    def example(i: int) -> tuple[str, str]:
        e = task.train_example(i)
        return format_example(e.question), " " + e.solution

    model_dir = args.work / "model"
    config = PretrainConfig(
        seed=args.seed,
        steps=args.pretrain_steps,
        batch=64,
        lr=2e-3,
        intermediate=256,
        gen_length=GEN_LENGTH,
    )
    if pretrained(model_dir) == asdict(config):
        print(f"    {model_dir} holds this pretraining already", flush=True)
    else:
        pretrain(
            example,
            word_tokenizer(texts),
            config,
            model_dir,
            log=lambda line: print("   ", line, flush=True),
        )

    stage("collecting trajectories")
    reg = registry()
    backbone = Tiny(model=str(model_dir))
    sampling = Sampling(STEPS, GEN_LENGTH, "fewshot", args.seed)
    steps = snapshot_steps(STEPS, 6)
    problems = task.problems("train")[: args.problems]
    description = describe_collection(
        "arith", task, "train", "tiny", backbone, sampling, args.samples, steps, len(problems)
    )
    collect(
        CollectConfig(
            task,
            backbone,
            description,
            problems,
            args.samples,
            steps,
            sampling,
            Limits(batch_rows=128),
        ),
        reg,
        args.work / "trajectories",
    )
    _, snapshots = load(args.work / "trajectories")

    for kind in ("prm", "orm"):
        stage(f"training the {kind.upper()}")
        scorer = reg.scorer(kind, shared={"backbone": backbone}, seed=args.seed, **SCORER)
        train(
            scorer,
            snapshots,
            TrainConfig(
                kind=kind,
                steps=args.scorer_steps,
                batch=32,
                lr=1e-3,
                warmup=50,
                val_every=100,
                # the ORM ranks one problem's answers: learn from problems whose answers differ
                groups=args.orm_groups if kind == "orm" else "all",
                seed=args.seed,
            ),
            args.work / kind,
            backbone.mask_id,
            log=lambda line: print("   ", line, flush=True),
        )

    stage(f"writing {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        shutil.copy2(item, args.out / item.name)
    for kind in ("prm", "orm"):
        shutil.rmtree(args.out / kind, ignore_errors=True)
        shutil.copytree(args.work / kind / "best", args.out / kind)
    stage("done")


def pretrained(model_dir: Path) -> dict | None:
    """The pretraining configuration of a finished model in `model_dir`, if there is one."""
    config = model_dir / "config.json"
    if not (config.exists() and (model_dir / "model.safetensors").exists()):
        return None
    return json.loads(config.read_text()).get("pretrain")


if __name__ == "__main__":
    main()
