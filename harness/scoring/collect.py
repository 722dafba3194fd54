"""On-policy trajectories for scorer training and diagnostics: `dllmbench collect`.

Each problem gets `n` independent trajectories through the engine (batched like any run);
the canvas of every trajectory is kept at chosen steps. The output directory holds:

- `collect.json`: what was collected (task, split, backbone, sampling, n, snapshot steps);
- `trajectories.jsonl`: one line per trajectory — problem id, index, final text, extracted
  answer, correctness, prompt length, and where its snapshots are (shard, first row);
- `snapshots-NNNNN.safetensors`: `tokens` [rows, width] int32 padded with −1, and `steps`
  [rows] int32; a trajectory's snapshots are consecutive rows, in step order.

Shards are written as problems finish, so an interrupted collection resumes where it
stopped (problems already in trajectories.jsonl are skipped). The snapshots travel from the
strategy to the writer through the strategy's own `kept` table, not through the records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dllmbench.api.ops import Ops
from dllmbench.core.errors import UserError
from dllmbench.core.schema import Record, TrajectoryLine
from dllmbench.core.types import Pool, Problem
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.provenance import config_data
from dllmbench.loading.registry import Registry
from dllmbench.storage.rundir import manifest_differences


def snapshot_steps(total_steps: int, count: int) -> list[int]:
    """`count` steps spread over 1..T, always including T (the final state)."""
    if count < 1:
        raise UserError(f"--snapshots must be >= 1, got {count}")
    return sorted({max(1, round(total_steps * (i + 1) / count)) for i in range(count)})


@dataclass
class Kept:
    """The snapshots of one problem's trajectories: the canvas of all n at each step."""

    prompt_len: int
    snapshots: list[tuple[int, torch.Tensor]]  # (step, tokens [n, canvas])


class Trajectories:
    """n independent trajectories, keeping the canvas at each snapshot step in `kept`
    (problem id → `Kept`) until the writer takes it."""

    prefix_field: ClassVar[str | None] = None
    scorers: tuple[str, ...] = ()

    def __init__(self, n: int, steps: list[int]):
        self.n, self.steps = n, steps
        self.config = {"n": n, "steps": steps}
        self.kept: dict[str, Kept] = {}

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.n * total_steps}

    def pool_size(self) -> int:
        return self.n

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        rows = ops.start(problem, copies=self.n, stream="collect")
        snapshots, done = [], 0
        for step in self.steps:
            if step > done:
                rows = await ops.denoise(rows, step - done)
                done = step
            snapshots.append((step, rows.tokens.clone()))
        if done < ops.T:
            rows = await ops.denoise(rows, ops.T - done)
        self.kept[problem.id] = Kept(rows.prompt_len, snapshots)
        return ops.pool(rows)


@dataclass
class CollectConfig:
    task: Any
    backbone: Any
    description: dict[str, Any]
    problems: list[Problem]
    n: int
    steps: list[int]
    sampling: Sampling
    capacity: Capacity
    shard_problems: int = 64


def done_problems(out: Path) -> set[str]:
    """Problems whose trajectories are already written."""
    index = out / "trajectories.jsonl"
    if not index.exists():
        return set()
    return {json.loads(line)["problem"] for line in index.read_text().splitlines()}


def run_collection(
    cfg: CollectConfig, reg: Registry, out: Path, advance: Callable[[], None] | None = None
) -> dict[str, int]:
    """Collect into `out`, resuming what is there; `advance()` after each problem."""
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "collect.json"
    meta = json.loads(json.dumps(cfg.description))
    if meta_path.exists():
        diffs = manifest_differences(json.loads(meta_path.read_text()), meta)
        if diffs:
            raise UserError(
                f"{out} holds another collection; choose another --out. "
                f"Differences: {'; '.join(diffs)}"
            )
    else:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    done = done_problems(out)
    shard = len(list(out.glob("snapshots-*.safetensors")))
    todo = [p for p in cfg.problems if p.id not in done]
    trajectories = Trajectories(cfg.n, cfg.steps)
    method = Method("collect", MethodSpec("collect"), trajectories, reg.selector("first"))
    written = 0
    for start in range(0, len(todo), cfg.shard_problems):
        chunk = todo[start : start + cfg.shard_problems]
        engine = Engine(
            backbone=cfg.backbone,
            scorers={},
            task=cfg.task,
            methods=[method],
            sampling=cfg.sampling,
            capacity=cfg.capacity,
        )
        records = engine.run(chunk, on_record=(lambda _r: advance()) if advance else None)
        _write_shard(out, shard, records, trajectories.kept)
        shard += 1
        written += sum(len(r["candidates"]) for r in records)
    return {"problems": len(cfg.problems), "skipped": len(done), "trajectories": written}


def _write_shard(out: Path, shard: int, records: list[Record], kept: dict[str, Kept]) -> None:
    """One shard of snapshots and the index lines of its trajectories; `kept` entries of
    the written problems are taken out."""
    rows: list[torch.Tensor] = []
    steps: list[int] = []
    lines: list[TrajectoryLine] = []
    for record in records:
        problem = kept.pop(record["problem"])
        for i, cand in enumerate(record["candidates"]):
            lines.append(
                TrajectoryLine(
                    problem=record["problem"],
                    index=i,
                    text=cand["text"],
                    answer=cand["answer"],
                    correct=cand["correct"],
                    prompt_len=problem.prompt_len,
                    shard=shard,
                    row=len(rows),
                    snapshots=len(problem.snapshots),
                )
            )
            for step, tokens in problem.snapshots:
                rows.append(tokens[i])
                steps.append(step)
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), -1, dtype=torch.int32)
    for j, r in enumerate(rows):
        tokens[j, : len(r)] = r.to(torch.int32)
    name = out / f"snapshots-{shard:05d}.safetensors"
    save_file({"tokens": tokens, "steps": torch.tensor(steps, dtype=torch.int32)}, str(name))
    with open(out / "trajectories.jsonl", "a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@dataclass(frozen=True)
class Snapshot:
    problem: str
    tokens: torch.Tensor
    prompt_len: int
    step: int
    correct: bool
    final: bool
    index: int = 0  # the trajectory's index among its problem's


def read_meta(path: Path) -> dict[str, Any]:
    """A collection's collect.json; one line when `path` is not a collection."""
    meta_path = path / "collect.json"
    if not meta_path.is_file():
        raise UserError(
            f"{path} is not a collection (no collect.json); make one with dllmbench collect"
        )
    try:
        return json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{meta_path} cannot be read ({exc}); collect again into a new --out"
        ) from exc


def load(path: Path) -> tuple[dict[str, Any], list[Snapshot]]:
    """Every snapshot of a collection, labelled with its trajectory's final correctness."""
    meta = read_meta(path)
    shards: dict[int, dict[str, torch.Tensor]] = {}
    out = []
    for line in (path / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        shard = shards.get(t["shard"])
        if shard is None:
            shard = shards[t["shard"]] = load_file(
                str(path / f"snapshots-{t['shard']:05d}.safetensors")
            )
        for j in range(t["row"], t["row"] + t["snapshots"]):
            row = shard["tokens"][j]
            out.append(
                Snapshot(
                    t["problem"],
                    row[row >= 0].long(),
                    t["prompt_len"],
                    int(shard["steps"][j]),
                    bool(t["correct"]),
                    int(shard["steps"][j]) == meta["sampling"]["total_steps"],
                    int(t["index"]),
                )
            )
    return meta, out


def mask_ratios(snapshots: list[Snapshot], mask_id: int) -> np.ndarray:
    return np.array(
        [float((s.tokens[s.prompt_len :] == mask_id).float().mean()) for s in snapshots]
    )


def collection_manifest(
    task_name: str,
    task: Any,
    split: str,
    backbone_name: str,
    backbone: Any,
    sampling: Sampling,
    n: int,
    steps: list[int],
    problems: int,
) -> dict[str, Any]:
    """The content of collect.json: what was collected, compared on resume."""
    return {
        "task": {
            "name": task_name,
            "config": config_data(task),
            "split": split,
            "problems": problems,
        },
        "backbone": {"name": backbone_name, "config": config_data(backbone)},
        "sampling": {
            "total_steps": sampling.total_steps,
            "gen_length": sampling.gen_length,
            "prompt_style": sampling.prompt_style,
            "seed": sampling.seed,
        },
        "n": n,
        "snapshot_steps": steps,
    }
