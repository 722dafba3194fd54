"""Rebuild the demo from a seed: the tiny dLLM, its trajectories, its PRM and ORM.

    dllmbench demo retrain --out DIR [--seed 0] [--quick] [--backbone tiny-block]

Stages (each logged with its time): train the Dream-architecture model on the `arith` train
stream with the masked-diffusion loss (with `backbone="tiny-block"`, a Qwen3 with the
block-diffusion loss, pretrain_block.py); collect on-policy trajectories through the engine on
train problems the model never saw (the stretch of the stream after its pretraining); train
the PRM on every snapshot, and the ORM on the final states and on worked train solutions with
and without one slip (negatives.py), validating on held-out problems. The task, the backbone
and the scorers are all built through the registry. Everything is written under `out`
(scratch state in `out/build/`, so every stage resumes); never into the installed package.
`out` then runs as `--backbone tiny:model=OUT --scorer prm=prm:checkpoint=OUT/prm
--scorer orm=orm:checkpoint=OUT/orm` (or `--backbone tiny-block:model=OUT`, at the block
demo's T and gen_length). The block model's scorers are the PRM and ORM; the causal PRMs of
the readout controls are the tiny model's only.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

import dllmbench
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem
from dllmbench.demo import (
    BLOCK_DEMO,
    BLOCK_DIR,
    BLOCK_LENGTH,
    CONTROL_SCORERS,
    DEMO_TASK,
    SCORER_KINDS,
    TASK_CONFIG,
    TINY_DIR,
    RetrainConfig,
)
from dllmbench.demo.negatives import slip
from dllmbench.demo.pretrain import PretrainConfig, answer_tokens, pretrain, word_tokenizer
from dllmbench.demo.pretrain_block import BlockPretrainConfig, pretrain_block
from dllmbench.execution.engine import Capacity, Sampling
from dllmbench.loading.registry import Registry, registry
from dllmbench.scoring.collect import (
    CollectConfig,
    Snapshot,
    collection_manifest,
    load,
    run_collection,
    snapshot_steps,
)
from dllmbench.scoring.training import TrainConfig, train

TASK, BACKBONE = "arith", "tiny"
STEPS, GEN_LENGTH = 24, 32  # the demo's sampling protocol (T and generated tokens)
SNAPSHOTS = 6  # snapshot steps per collected trajectory
PRETRAIN_BATCH = 64
TOKENIZER_EXAMPLES = 5000  # train examples (with every test example) the vocabulary is read from
SCORER = {
    "target_modules": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "lora_r": 32,
    "lora_alpha": 64,
    "head_width": 256,
}

BLOCK_BATCH = 64  # the block model's pretraining batch


@dataclass(frozen=True)
class DemoModel:
    """What differs between the demo's models: the backbone each runs as, the sampling protocol
    its scorers learn under (T, gen_length), its pretraining batch, what its stage is called,
    and whether the causal PRMs of the readout controls are trained for it."""

    backbone: str
    steps: int
    gen_length: int
    batch: int
    what: str
    controls: bool


MODELS = {
    "tiny": DemoModel(BACKBONE, STEPS, GEN_LENGTH, PRETRAIN_BATCH, "the tiny dLLM", True),
    "tiny-block": DemoModel(
        "tiny-block",
        BLOCK_DEMO["steps"],
        BLOCK_DEMO["gen_length"],
        BLOCK_BATCH,
        "the tiny block-diffusion LM",
        False,
    ),
}

Log = Callable[[str], None]


@runtime_checkable
class WorkedExamples(Protocol):
    """A task whose train split is an endless stream of worked examples (`arith`): each item
    has a `question` and a `solution` (the lines the model learns to write)."""

    def examples(self, split: str, start: int = 0, count: int | None = None) -> Iterator[Any]: ...

    def train_example(self, index: int) -> Any: ...


def check_out(out: Path) -> None:
    """`out` must lie outside the installed package (the shipped demo is never overwritten)."""
    package = Path(dllmbench.__file__).resolve().parent
    target = out.resolve()
    shipped = (TINY_DIR.resolve(), BLOCK_DIR.resolve())
    if target == package or package in target.parents or target in shipped:
        raise UserError(
            f"--out {out} lies inside the installed package ({package}); "
            "write the demo elsewhere, e.g. --out demo-model"
        )


def retrain(cfg: RetrainConfig, log: Log = print) -> dict[str, Any]:
    """Every stage in turn; returns where the model and its scorers were written."""
    check_out(cfg.out)
    cfg = cfg.resolved()
    reg = registry()
    task = reg.task(TASK, seed=cfg.seed, **TASK_CONFIG)
    if not isinstance(task, WorkedExamples):
        raise UserError(f"task {TASK!r} gives no worked train examples to pretrain on")
    model = MODELS[cfg.backbone]
    started = time.time()
    seconds: dict[str, float] = {}

    def stage(name: str, run: Callable[[], Any]) -> Any:
        log(f"[{time.time() - started:6.0f}s] {name}")
        begun = time.time()
        result = run()
        seconds[name] = round(time.time() - begun, 1)
        return result

    model_dir = stage(f"pretraining {model.what}", lambda: pretrain_model(task, cfg, log))
    # sampled as the demo runs it: the backbone's defaults (tiny: Dream's sampler as the paper
    # runs it; tiny-block: SDAR's, with a confidence threshold)
    backbone = reg.backbone(model.backbone, model=str(model_dir))
    stage("collecting trajectories", lambda: collect_trajectories(reg, task, backbone, cfg))
    _, snapshots = load(cfg.work / "trajectories")
    for kind in SCORER_KINDS:

        def fit(kind: str = kind) -> None:
            train_scorer(reg, kind, task, backbone, snapshots, cfg, log)

        stage(f"training the {kind.upper()}", fit)
    for name, options in CONTROL_SCORERS.items() if model.controls else ():

        def fit_control(name: str = name, options: dict[str, str] = options) -> None:
            train_scorer(reg, "prm", task, backbone, snapshots, cfg, log, options, name)

        stage(f"training {name} (the PRM with {options})", fit_control)
    stage(f"writing {cfg.out}", lambda: publish(model_dir, cfg))
    log(f"[{time.time() - started:6.0f}s] done")
    return {
        "out": str(cfg.out),
        "task": DEMO_TASK,
        "steps": model.steps,
        "gen_length": model.gen_length,
        "backbone": f"{model.backbone}:model={cfg.out}",
        "scorers": {kind: f"{kind}={kind}:checkpoint={cfg.out / kind}" for kind in SCORER_KINDS},
        "seconds": seconds,
        "config": {**asdict(cfg), "out": str(cfg.out)},
    }


def _prompt(task: Any, question: str) -> str:
    """The task's own `fewshot` prompt text for a question, as the engine will give it."""
    return task.prompt(Problem("pretrain", question, None), "fewshot").text


def pretrain_model(task: WorkedExamples, cfg: RetrainConfig, log: Log) -> Path:
    """The Dream-format model (tiny-block: the Qwen3 block-diffusion one) in `work/model`; a
    finished identical pretraining is reused."""
    model_dir = cfg.work / "model"
    model = MODELS[cfg.backbone]
    config: PretrainConfig | BlockPretrainConfig
    if cfg.backbone == "tiny-block":
        config = BlockPretrainConfig(
            seed=cfg.seed,
            steps=pretrain_steps(cfg),
            batch=model.batch,
            block_length=BLOCK_LENGTH,
            gen_length=model.gen_length,
        )
    else:
        config = PretrainConfig(
            seed=cfg.seed,
            steps=pretrain_steps(cfg),
            batch=model.batch,
            lr=2e-3,
            intermediate=256,
            gen_length=model.gen_length,
        )
    if pretrained(model_dir) == {"pretrain": asdict(config), "data": TASK_CONFIG}:
        log(f"    {model_dir} holds this pretraining already")
        return model_dir
    seen = [*task.examples("train", 0, TOKENIZER_EXAMPLES), *task.examples("test")]
    texts = [t for e in seen for t in (_prompt(task, e.question), " " + e.solution)]

    def example(i: int) -> tuple[str, str]:
        e = task.train_example(i)
        return _prompt(task, e.question), " " + e.solution

    tokenizer = word_tokenizer(texts)
    if isinstance(config, BlockPretrainConfig):
        return pretrain_block(
            example, tokenizer, config, model_dir, log=_indented(log), data=TASK_CONFIG
        )
    return pretrain(example, tokenizer, config, model_dir, log=_indented(log), data=TASK_CONFIG)


def pretrain_steps(cfg: RetrainConfig) -> int:
    """The pretraining steps: those asked for, else the model's own."""
    steps = cfg.resolved().pretrain_steps
    assert steps is not None
    return steps


def unseen(
    task: WorkedExamples, cfg: RetrainConfig, start: int, count: int
) -> list[tuple[Problem, Any]]:
    """`count` train problems from `start` past the stretch of the stream pretraining read
    (problems the model never saw, as the test problems are), with their worked examples."""
    first = pretrain_steps(cfg) * MODELS[cfg.backbone].batch + start
    return [
        (Problem(f"train-{first + i}", e.question, str(e.answer), {}), e)
        for i, e in enumerate(task.examples("train", first, count))
    ]


def collect_trajectories(reg: Registry, task: Any, backbone: Any, cfg: RetrainConfig) -> None:
    """On-policy trajectories of `problems` unseen train problems into `work/trajectories`."""
    model = MODELS[cfg.backbone]
    sampling = Sampling(model.steps, model.gen_length, "fewshot", cfg.seed)
    steps = snapshot_steps(model.steps, SNAPSHOTS)
    problems = [problem for problem, _ in unseen(task, cfg, 0, cfg.problems)]
    description = collection_manifest(
        TASK, task, "train", model.backbone, backbone, sampling, cfg.samples, steps, len(problems)
    )
    capacity = Capacity(batch_rows=128)
    run = CollectConfig(
        task, backbone, description, problems, cfg.samples, steps, sampling, capacity
    )
    run_collection(run, reg, cfg.work / "trajectories")


def with_slips(task: Any, backbone: Any, cfg: RetrainConfig) -> list[Snapshot]:
    """Final states of `negatives` unseen train problems (after the collected ones), each
    written out right and with one slip (negatives.py), labelled by their final answers; each
    as long as the backbone's canvas for it (a block model's ends at a block boundary)."""
    model = MODELS[cfg.backbone]
    rng = random.Random(cfg.seed)
    out = []
    for problem, example in unseen(task, cfg, cfg.problems, cfg.negatives):
        prompt = backbone.encode(task.prompt(problem, "fewshot"))
        room = len(backbone.canvas(prompt, model.gen_length)) - len(prompt)
        wrong, answer = slip(example.solution, rng)
        for text, correct in ((example.solution, True), (wrong, answer == example.answer)):
            answer_ids = answer_tokens(backbone.tokenizer, " " + text, room)
            tokens = torch.tensor(prompt + answer_ids, dtype=torch.long)
            out.append(Snapshot(problem.id, tokens, len(prompt), model.steps, correct, True))
    return out


def train_scorer(
    reg: Registry,
    kind: str,
    task: Any,
    backbone: Any,
    snapshots: list,
    cfg: RetrainConfig,
    log: Log,
    options: dict[str, str] | None = None,
    name: str | None = None,
) -> None:
    """The PRM (every snapshot) or the ORM (final states, and worked solutions with and
    without a slip) into `work/NAME` (NAME: the kind unless given); `options` are scorer
    settings beside SCORER (a causal PRM's attention and readout)."""
    settings_of = {**SCORER, **(options or {})}
    scorer = reg.scorer(kind, shared={"backbone": backbone}, seed=cfg.seed, **settings_of)
    steps = cfg.orm_steps if kind == "orm" else cfg.scorer_steps
    if kind == "orm":
        snapshots = snapshots + with_slips(task, backbone, cfg)
    settings = TrainConfig(
        kind=kind,
        steps=steps,
        batch=32,
        lr=1e-3,
        warmup=min(50, steps // 2),
        val_every=100,
        groups=cfg.orm_groups if kind == "orm" else "all",
        seed=cfg.seed,
    )
    out = cfg.work / (name or kind)
    train(scorer, snapshots, settings, out, backbone.mask_id, log=_indented(log))


def publish(model_dir: Path, cfg: RetrainConfig) -> None:
    """The model's files and each scorer's best checkpoint, side by side in `out`."""
    for item in model_dir.iterdir():
        shutil.copy2(item, cfg.out / item.name)
    controls = tuple(CONTROL_SCORERS) if MODELS[cfg.backbone].controls else ()
    for kind in (*SCORER_KINDS, *controls):
        shutil.rmtree(cfg.out / kind, ignore_errors=True)
        shutil.copytree(cfg.work / kind / "best", cfg.out / kind)


def pretrained(model_dir: Path) -> dict | None:
    """The pretraining configuration and data of a finished model in `model_dir`, if any."""
    config = model_dir / "config.json"
    if not (config.exists() and (model_dir / "model.safetensors").exists()):
        return None
    written = json.loads(config.read_text())
    return {"pretrain": written.get("pretrain"), "data": written.get("data")}


def _indented(log: Log) -> Log:
    return lambda line: log(f"    {line}")
