"""On-policy trajectories for scorer training and diagnostics: `dllmbench collect`.

Each problem gets `n` independent trajectories through the engine (batched like any run);
the canvas of every trajectory is kept at chosen steps: step 0 (the all-mask canvas, the
paper's first snapshot), then steps spread over 1..T. The output directory holds:

- `collect.json`: what was collected (format, task, split, backbone, sampling, n, snapshot
  steps, rollouts R per state);
- `trajectories.jsonl`: one line per trajectory — problem id, index, final text, extracted
  answer, correctness, prompt length, and where its snapshots are (shard, first row);
- `snapshots-NNNNN.safetensors`: `tokens` [rows, width] int32 padded with −1, and `steps`
  [rows] int32; a trajectory's snapshots are consecutive rows, in step order. With R > 0
  rollouts, also `rollouts` [rows] int32: how many of the R rollouts from that state reached
  a correct answer (a final state: R when it is correct, else 0).

Rollouts (`--rollouts R`): from every snapshot state before T, R continuations of that exact
canvas to T, each with noise of its own (rollout r of trajectory i from snapshot k has lineage
(i, k, r); the trajectory itself keeps (i,)). They are denoised by the same `Trajectories`
search through `ops`, so the ledger charges them like any step and the method declares them
(n·R·Σ(T − s) more passes, s over the snapshot steps before T). They never join the pool,
which stays the n trajectories: the search keeps their final rows in `kept`, and the writer
grades them as each problem's record arrives, with the engine's own `Engine.judge` (the
backbone's decode, the task's extract and grade, `grade_many` where the task has it), the
way the pool's candidates are graded; then only the counts are kept.

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
from safetensors.torch import load_file

from dllmbench.api.ops import Ops
from dllmbench.core.errors import UserError
from dllmbench.core.schema import Record, TrajectoryLine
from dllmbench.core.tensorfile import save_tensors
from dllmbench.core.types import Pool, Problem, Rows
from dllmbench.execution.engine import Capacity, Engine, Sampling, sized_to_memory
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.provenance import config_data
from dllmbench.loading.registry import Registry
from dllmbench.storage.rundir import brief_differences, manifest_differences

# collect.json's `format`: 2 stores the all-mask canvas (step 0) as every trajectory's first
# snapshot; a collection without it (format 1, written before) is refused with one line
FORMAT = 2


def snapshot_steps(total_steps: int, count: int) -> list[int]:
    """Step 0 (the all-mask canvas), then `count` steps spread over 1..T, always including T
    (the final state)."""
    if count < 1:
        raise UserError(f"--snapshots must be >= 1, got {count}")
    if count > total_steps:
        raise UserError(
            f"--snapshots {count} is more than --steps {total_steps}: at most one snapshot a "
            f"step; give --snapshots {total_steps} or fewer"
        )
    spread = {max(1, round(total_steps * (i + 1) / count)) for i in range(count)}
    return [0, *sorted(spread)]


@dataclass
class Kept:
    """The snapshots of one problem's trajectories: the canvas of all n at each step, and
    with rollouts, their final rows (until graded) and then their correct counts."""

    prompt_len: int
    snapshots: list[tuple[int, torch.Tensor]]  # (step, tokens [n, canvas])
    rollouts: Rows | None = None  # final rollout rows, snapshot-major: [k][i][r]
    correct: np.ndarray | None = None  # [n, snapshots before T]: correct rollouts per state


class Trajectories:
    """n independent trajectories, keeping the canvas at each snapshot step in `kept`
    (problem id → `Kept`) until the writer takes it; with `rollouts` R > 0, R continuations
    to T of every snapshot state before T, kept beside them for the writer to grade."""

    prefix_field: ClassVar[str | None] = None
    scorers: tuple[str, ...] = ()

    def __init__(self, n: int, steps: list[int], rollouts: int = 0):
        if rollouts < 0:
            raise UserError(f"--rollouts must be >= 0, got {rollouts}")
        self.n, self.steps, self.rollouts = n, steps, rollouts
        self.config = {"n": n, "steps": steps, "rollouts": rollouts}
        self.kept: dict[str, Kept] = {}

    def cost(self, total_steps: int) -> dict[str, int]:
        rollout_steps = sum(total_steps - s for s in self.steps if s < total_steps)
        return {"denoise": self.n * total_steps + self.n * self.rollouts * rollout_steps}

    def pool_size(self) -> int:
        return self.n

    def rows_per_problem(self, total_steps: int) -> int:
        """The rows one problem holds at most: its n, and R rollouts of each at every
        snapshot before the end."""
        return self.n * (1 + self.rollouts * sum(s < total_steps for s in self.steps))

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem: Problem, ops: Ops) -> Pool:
        rows = ops.start(problem, copies=self.n, stream="collect")
        snapshots, states, done = [], [], 0
        for step in self.steps:
            if step > done:
                rows = await ops.denoise(rows, step - done)
                done = step
            snapshots.append((step, rows.tokens.clone()))
            if step < ops.T and self.rollouts:
                states.append(rows)
        if done < ops.T:
            rows = await ops.denoise(rows, ops.T - done)
        kept = Kept(rows.prompt_len, snapshots)
        if states:
            kept.rollouts = await ops.denoise(rollout_rows(states, self.rollouts))
        self.kept[problem.id] = kept
        return ops.pool(rows)


def _cached_tokens(cfg: CollectConfig, problems: list[Problem], kept: Trajectories) -> int:
    """What one problem may hold in a backbone's KV cache, in tokens (as a run sizes it): its
    rows × the canvas of the longest prompt. Sized on a GPU only: nothing is encoded here on a
    CPU."""
    if not problems or torch.device(getattr(cfg.backbone, "device", "cpu")).type != "cuda":
        return 0
    style = cfg.sampling.prompt_style
    prompt = max(len(cfg.backbone.encode(cfg.task.prompt(p, style))) for p in problems)
    rows = kept.rows_per_problem(cfg.sampling.total_steps)
    return rows * (prompt + cfg.sampling.gen_length)


def rollout_rows(states: list[Rows], r: int) -> Rows:
    """R children of every row of every state, state-major ([k][i][r]); child r of row i of
    state k has lineage (i, k, r), so each draws its own noise, unlike any other rollout's
    and unlike the trajectory's own continuation (lineage (i,))."""
    parts = []
    for k, state in enumerate(states):
        n = len(state)
        # (i,) → (i, k): the k-th of len(states) copies of each row; then (i, k, r)
        marked = state.repeat(len(states)).take([i * len(states) + k for i in range(n)])
        parts.append(marked.repeat(r))
    return Rows.concat(*parts)


def rollout_counts(labels: list[bool], n: int, states: int, r: int) -> np.ndarray:
    """[n, states]: how many of the R rollouts of trajectory i from state k were correct,
    from the rollouts' grades in `rollout_rows` order ([k][i][r])."""
    if len(labels) != n * states * r:
        raise ValueError(f"{len(labels)} rollout grades for {n}×{states}×{r} rollouts")
    grid = np.asarray(labels, dtype=np.int64).reshape(states, n, r)
    return grid.sum(axis=2).T


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
    rollouts: int = 0  # R continuations to T of every snapshot state before T


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
        diffs = manifest_differences(read_meta(out), meta)
        if diffs:
            raise UserError(
                f"{out} holds another collection; choose another --out. "
                f"Differences: {brief_differences(diffs)}"
            )
    else:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    done = done_problems(out)
    shard = len(list(out.glob("snapshots-*.safetensors")))
    todo = [p for p in cfg.problems if p.id not in done]
    trajectories = Trajectories(cfg.n, cfg.steps, cfg.rollouts)
    method = Method("collect", MethodSpec("collect"), trajectories, reg.selector("first"))
    capacity = sized_to_memory(cfg.capacity, cfg.backbone, _cached_tokens(cfg, todo, trajectories))
    written = 0
    for start in range(0, len(todo), cfg.shard_problems):
        chunk = todo[start : start + cfg.shard_problems]
        engine = Engine(
            backbone=cfg.backbone,
            scorers={},
            task=cfg.task,
            methods=[method],
            sampling=cfg.sampling,
            capacity=capacity,
        )
        finished = _grading(engine, trajectories, chunk, advance)
        records = engine.run(chunk, on_record=finished)
        _write_shard(out, shard, records, trajectories.kept, cfg.rollouts)
        shard += 1
        written += sum(len(r["candidates"]) for r in records)
    return {"problems": len(cfg.problems), "skipped": len(done), "trajectories": written}


def _grading(
    engine: Engine,
    trajectories: Trajectories,
    problems: list[Problem],
    advance: Callable[[], None] | None,
) -> Callable[[Record], None]:
    """What to do as each problem's record arrives: grade its rollouts the way the engine
    graded its pool (`Engine.judge`) and keep only their counts; then `advance()`."""
    by_id = {p.id: p for p in problems}
    n, r = trajectories.n, trajectories.rollouts

    def finished(record: Record) -> None:
        kept = trajectories.kept[record["problem"]]
        if kept.rollouts is not None:
            labels = engine.judge(by_id[record["problem"]], kept.rollouts).labels
            kept.correct = rollout_counts(labels, n, len(kept.rollouts) // (n * r), r)
            kept.rollouts = None
        if advance:
            advance()

    return finished


def _write_shard(
    out: Path, shard: int, records: list[Record], kept: dict[str, Kept], rollouts: int = 0
) -> None:
    """One shard of snapshots and the index lines of its trajectories; `kept` entries of
    the written problems are taken out. With rollouts, each snapshot's correct count too."""
    rows: list[torch.Tensor] = []
    steps: list[int] = []
    correct: list[int] = []
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
            # the snapshots before T come first (steps ascending) and have rollout counts;
            # the final state's is its own correctness, R or 0
            counted = 0 if problem.correct is None else problem.correct.shape[1]
            for j, (step, tokens) in enumerate(problem.snapshots):
                rows.append(tokens[i])
                steps.append(step)
                if rollouts and j < counted:
                    correct.append(int(problem.correct[i, j]))  # type: ignore[index]
                elif rollouts:
                    correct.append(rollouts if cand["correct"] else 0)
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), -1, dtype=torch.int32)
    for j, r in enumerate(rows):
        tokens[j, : len(r)] = r.to(torch.int32)
    name = out / f"snapshots-{shard:05d}.safetensors"
    tensors = {"tokens": tokens, "steps": torch.tensor(steps, dtype=torch.int32)}
    if rollouts:
        tensors["rollouts"] = torch.tensor(correct, dtype=torch.int32)
    save_tensors(tensors, name)
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
    correct: bool  # the trajectory's final correctness
    final: bool
    # the share of the collection's R rollouts from this state that reached a correct answer
    # (a final state: its own correctness, 0 or 1); None when collected without rollouts
    value: float | None = None
    index: int = 0  # the trajectory's index among its problem's


def read_meta(path: Path) -> dict[str, Any]:
    """A collection's collect.json; one line when `path` is not a collection, or is one
    of an older format."""
    meta_path = path / "collect.json"
    if not meta_path.is_file():
        raise UserError(
            f"{path} is not a collection (no collect.json); make one with dllmbench collect"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{meta_path} cannot be read ({exc}); collect again into a new --out"
        ) from exc
    found = meta.get("format", 1) if isinstance(meta, dict) else None
    if found != FORMAT:
        raise UserError(
            f"{path} is a collection of format {found}, this dllmbench reads format {FORMAT} "
            "(the all-mask canvas stored as step 0); collect again into a new --out"
        )
    return meta


def load(path: Path) -> tuple[dict[str, Any], list[Snapshot]]:
    """Every snapshot of a collection, labelled with its trajectory's final correctness and,
    when the collection has rollouts, with the share of its rollouts that were correct."""
    meta = read_meta(path)
    r = int(meta.get("rollouts", 0))
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
                    int(shard["rollouts"][j]) / r if r else None,
                    int(t["index"]),
                )
            )
    return meta, out


def mask_ratios(snapshots: list[Snapshot], mask_id: int) -> np.ndarray:
    """The share of each state's generated positions still masked, in float64 from integer
    counts (masked / generated, one correctly rounded division): a state exactly at a bucket
    edge (14 of 20 positions: 0.7) equals the edge i/10 and falls in the bucket it opens
    (`diagnostics.mask_buckets`). A state with no generated position has 0."""
    masked = np.array(
        [int((s.tokens[s.prompt_len :] == mask_id).sum()) for s in snapshots], np.int64
    )
    generated = np.array([s.tokens.numel() - s.prompt_len for s in snapshots], np.int64)
    return masked / np.maximum(generated, 1)


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
    rollouts: int = 0,
) -> dict[str, Any]:
    """The content of collect.json: what was collected, compared on resume."""
    return {
        "format": FORMAT,
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
        "rollouts": rollouts,
    }
