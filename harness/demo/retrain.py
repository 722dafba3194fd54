"""Rebuild the demo from a seed: the tiny dLLM, its trajectories, its PRM and ORM.

    dllmbench demo retrain --out DIR [--seed 0] [--quick]

Stages (each logged with its time): train the Dream-architecture model on the `arith` train
stream with the masked-diffusion loss; collect on-policy trajectories through the engine on
train problems the model never saw (the stretch of the stream after its pretraining); train
the PRM on every snapshot, and the ORM on the final states and on worked train solutions with
and without one slip (negatives.py), validating on held-out problems. The task, the backbone
and the scorers are all built through the registry. Everything is written under `out`
(scratch state in `out/build/`, so every stage resumes); never into the installed package.
`out` then runs as `--backbone tiny:model=OUT --scorer prm=prm:checkpoint=OUT/prm
--scorer orm=orm:checkpoint=OUT/orm`.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

import dllmbench
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem
from dllmbench.demo import (
    CONTROL_SCORERS,
    DEMO_TASK,
    SCORER_KINDS,
    TASK_CONFIG,
    TINY_DIR,
    RetrainConfig,
)
from dllmbench.demo.negatives import slip
from dllmbench.demo.pretrain import PretrainConfig, answer_tokens, pretrain, word_tokenizer
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
    if target == package or package in target.parents or target == TINY_DIR.resolve():
        raise UserError(
            f"--out {out} lies inside the installed package ({package}); "
            "write the demo elsewhere, e.g. --out demo-model"
        )


def retrain(cfg: RetrainConfig, log: Log = print) -> dict[str, Any]:
    """Every stage in turn; returns where the model and its scorers were written."""
    check_out(cfg.out)
    reg = registry()
    task = reg.task(TASK, seed=cfg.seed, **TASK_CONFIG)
    if not isinstance(task, WorkedExamples):
        raise UserError(f"task {TASK!r} gives no worked train examples to pretrain on")
    started = time.time()
    seconds: dict[str, float] = {}

    def stage(name: str, run: Callable[[], Any]) -> Any:
        log(f"[{time.time() - started:6.0f}s] {name}")
        begun = time.time()
        result = run()
        seconds[name] = round(time.time() - begun, 1)
        return result

    model_dir = stage("pretraining the tiny dLLM", lambda: pretrain_model(task, cfg, log))
    # sampled as the demo runs it: the tiny backbone's defaults, Dream's sampler as the paper
    # runs it
    backbone = reg.backbone(BACKBONE, model=str(model_dir))
    stage("collecting trajectories", lambda: collect_trajectories(reg, task, backbone, cfg))
    _, snapshots = load(cfg.work / "trajectories")
    for kind in SCORER_KINDS:

        def fit(kind: str = kind) -> None:
            train_scorer(reg, kind, task, backbone, snapshots, cfg, log)

        stage(f"training the {kind.upper()}", fit)
    for name, options in CONTROL_SCORERS.items():

        def fit_control(name: str = name, options: dict[str, str] = options) -> None:
            train_scorer(reg, "prm", task, backbone, snapshots, cfg, log, options, name)

        stage(f"training {name} (the PRM with {options})", fit_control)
    stage(f"writing {cfg.out}", lambda: publish(model_dir, cfg))
    log(f"[{time.time() - started:6.0f}s] done")
    return {
        "out": str(cfg.out),
        "task": DEMO_TASK,
        "steps": STEPS,
        "gen_length": GEN_LENGTH,
        "backbone": f"{BACKBONE}:model={cfg.out}",
        "scorers": {kind: f"{kind}={kind}:checkpoint={cfg.out / kind}" for kind in SCORER_KINDS},
        "seconds": seconds,
        "config": {**asdict(cfg), "out": str(cfg.out)},
    }


def _prompt(task: Any, question: str) -> str:
    """The task's own `fewshot` prompt text for a question, as the engine will give it."""
    return task.prompt(Problem("pretrain", question, None), "fewshot").text


def pretrain_model(task: WorkedExamples, cfg: RetrainConfig, log: Log) -> Path:
    """The Dream-format model in `work/model`; a finished identical pretraining is reused."""
    model_dir = cfg.work / "model"
    config = PretrainConfig(
        seed=cfg.seed,
        steps=cfg.pretrain_steps,
        batch=PRETRAIN_BATCH,
        lr=2e-3,
        intermediate=256,
        gen_length=GEN_LENGTH,
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
    return pretrain(example, tokenizer, config, model_dir, log=_indented(log), data=TASK_CONFIG)


def unseen(
    task: WorkedExamples, cfg: RetrainConfig, start: int, count: int
) -> list[tuple[Problem, Any]]:
    """`count` train problems from `start` past the stretch of the stream pretraining read
    (problems the model never saw, as the test problems are), with their worked examples."""
    first = cfg.pretrain_steps * PRETRAIN_BATCH + start
    return [
        (Problem(f"train-{first + i}", e.question, str(e.answer), {}), e)
        for i, e in enumerate(task.examples("train", first, count))
    ]


def collect_trajectories(reg: Registry, task: Any, backbone: Any, cfg: RetrainConfig) -> None:
    """On-policy trajectories of `problems` unseen train problems into `work/trajectories`."""
    sampling = Sampling(STEPS, GEN_LENGTH, "fewshot", cfg.seed)
    steps = snapshot_steps(STEPS, SNAPSHOTS)
    problems = [problem for problem, _ in unseen(task, cfg, 0, cfg.problems)]
    description = collection_manifest(
        TASK, task, "train", BACKBONE, backbone, sampling, cfg.samples, steps, len(problems)
    )
    capacity = Capacity(batch_rows=128)
    run = CollectConfig(
        task, backbone, description, problems, cfg.samples, steps, sampling, capacity
    )
    run_collection(run, reg, cfg.work / "trajectories")


def with_slips(task: Any, backbone: Any, cfg: RetrainConfig) -> list[Snapshot]:
    """Final states of `negatives` unseen train problems (after the collected ones), each
    written out right and with one slip (negatives.py), labelled by their final answers."""
    rng = random.Random(cfg.seed)
    out = []
    for problem, example in unseen(task, cfg, cfg.problems, cfg.negatives):
        prompt = backbone.encode(task.prompt(problem, "fewshot"))
        wrong, answer = slip(example.solution, rng)
        for text, correct in ((example.solution, True), (wrong, answer == example.answer)):
            answer_ids = answer_tokens(backbone.tokenizer, " " + text, GEN_LENGTH)
            tokens = torch.tensor(prompt + answer_ids, dtype=torch.long)
            out.append(Snapshot(problem.id, tokens, len(prompt), STEPS, correct, True))
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
    for kind in (*SCORER_KINDS, *CONTROL_SCORERS):
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
