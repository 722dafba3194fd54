"""Sharded runs: a deterministic share of the problems per process, and the merge.

A run may be split into N shares. Share I of N (1-based) holds the problems whose index in
the task's problem order is congruent to I−1 modulo N. Each share appends to its own
`samples.shard-I-of-N.jsonl`, counts its compute in `compute.shard-I-of-N.json` and holds its
own lock (`rundir.RunDir`), so different shares run at once into one directory. A problem's
records do not depend on the share it is in: every random draw is keyed by (seed, problem,
lineage) (`keys.py`).

Shares come from `dllmbench run --shard I/N`, or from a launcher's environment (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK` as `torchrun` and `accelerate launch --multi_gpu` set them; the
`OMPI_COMM_WORLD_*`, `PMI_*` and `MV2_COMM_WORLD_*` of MPI as `accelerate launch --cpu
--mpirun_hostfile` sets them; Slurm's `SLURM_PROCID`/`SLURM_NTASKS` for the tasks of one
job step, and `SLURM_ARRAY_TASK_ID`/`_COUNT`/`_MIN` for an array job, whose tasks are fixed
shares that `dllmbench merge` joins). The processes of a launch claim the problems in chunks
as they go (`claims.py`) instead of a fixed share each, and the first merges.
`accelerate launch --cpu --num_processes N` without MPI starts one process only: that is one
line naming torchrun (`refuse_lone_launch`), never a quiet run of everything in one process.

`merge(path)` writes results.json, leaderboard.md and compute.json once every share is done,
and refuses with one line naming what is missing when one is not.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dllmbench.core.errors import UserError
from dllmbench.storage.filesystem import flock

T = TypeVar("T")

SHARD_FILE = re.compile(r"^samples\.shard-(\d+)-of-(\d+)\.jsonl$")
COMPUTE_FILE = re.compile(r"^compute\.shard-(\d+)-of-(\d+)\.json$")


@dataclass(frozen=True)
class Shard:
    """Share `index` (1-based) of `count`; `launched`: started by a launcher (the first
    process waits for the rest and merges)."""

    index: int
    count: int
    launched: bool = False
    local_rank: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ValueError(f"share {self.index}/{self.count}: want 1 <= I <= N")

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def suffix(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    @property
    def merges(self) -> bool:
        """Whether this process writes the results: the first of a launched run."""
        return self.launched and self.index == 1

    def share(self, items: Sequence[T]) -> list[T]:
        """This share's items: index i with i % count == index − 1, in their order."""
        return [x for i, x in enumerate(items) if i % self.count == self.index - 1]

    def others(self) -> list[Shard]:
        return [Shard(i, self.count) for i in range(1, self.count + 1) if i != self.index]


def parse_shard(text: str) -> Shard:
    """argparse type of `--shard I/N`."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"want I/N with 1 <= I <= N, e.g. 1/4; got {text!r}")
    return Shard(int(match[1]), int(match[2]))


DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also accepts "²" and "٢"


def _env_int(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    """The first of `names` set in `env`, as a whole number; one line when it is set to
    something else."""
    for name in names:
        raw = env.get(name, "").strip()
        if not raw:
            continue
        if not DIGITS.fullmatch(raw):
            raise UserError(f"{name}={raw!r} in the environment is not a whole number; unset it")
        return int(raw)
    return None


RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
# Slurm: the tasks of one job step (srun --ntasks N), and the tasks of an array job
SLURM_TASK = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
SLURM_ARRAY = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")


def _checked(rank: int, world: int, what: str) -> None:
    if rank >= world:
        raise UserError(f"{what} says rank {rank} of {world} processes; want rank < world")


def from_launcher(env: Mapping[str, str]) -> Shard | None:
    """The share a launcher's environment gives this process; None outside a launcher (or a
    launch of one process). In order: torchrun's and accelerate's `RANK`/`WORLD_SIZE` (and
    MPI's), then the tasks of a Slurm job step (`SLURM_PROCID`/`SLURM_NTASKS`: started
    together, so the first waits for the rest and merges), then a Slurm array job
    (`SLURM_ARRAY_TASK_ID`/`_COUNT`/`_MIN`: a fixed share each, run when the scheduler
    pleases; `dllmbench merge` joins them, as after `--shard`)."""
    world = _env_int(env, WORLD)
    if world is not None:
        if world < 2:
            return None
        if env.get("WORLD_SIZE") and not env.get("MASTER_ADDR"):
            # torchrun and accelerate set the rendezvous address beside the ranks
            raise UserError(
                f"WORLD_SIZE={env['WORLD_SIZE']} is set but no launcher started this process "
                "(MASTER_ADDR is unset); unset WORLD_SIZE and RANK, or launch with "
                "torchrun --nproc_per_node N -m dllmbench run …"
            )
        rank = _env_int(env, RANK)
        if rank is None:
            named = next(name for name in WORLD if env.get(name, "").strip())
            ranks = next(r for w, r in zip(WORLD, RANK, strict=True) if w == named)
            raise UserError(
                f"{named}={world} is set but {ranks} is not: this process cannot tell which of "
                f"the {world} processes it is; launch with torchrun --nproc_per_node {world} -m "
                f"dllmbench run … (it sets both), or unset {named}"
            )
        _checked(rank, world, "the launcher")
        return Shard(rank + 1, world, launched=True, local_rank=_env_int(env, LOCAL) or 0)
    procid, ntasks, localid = (_env_int(env, (name,)) for name in SLURM_TASK)
    if ntasks is not None and ntasks >= 2:
        _checked(procid or 0, ntasks, "Slurm")
        return Shard((procid or 0) + 1, ntasks, launched=True, local_rank=localid or 0)
    task, count, first = (_env_int(env, (name,)) for name in SLURM_ARRAY)
    if task is not None and count is not None and count >= 2:
        return _array_share(task, count, first or 0, env)
    return None


def _array_share(task: int, count: int, first: int, env: Mapping[str, str]) -> Shard:
    """The share of Slurm array task `task` of `count` numbered from `first`: tasks evenly
    spaced by `SLURM_ARRAY_TASK_STEP` (`--array=1-5:2`: 1, 3, 5 are shares 1, 2, 3); an array
    that is not (`--array=1,4,9`) is refused, in every task, with one line."""
    step = _env_int(env, ("SLURM_ARRAY_TASK_STEP",)) or 1
    last = _env_int(env, ("SLURM_ARRAY_TASK_MAX",))
    spaced = last is None or last - first == step * (count - 1)
    index = (task - first) // step + 1
    if not spaced or (task - first) % step or not 1 <= index <= count:
        through = "" if last is None else f" through {last}"
        raise UserError(
            f"Slurm array task {task} (tasks {first}{through} by {step}, {count} tasks) is not "
            f"one of its {count} evenly spaced shares; number the array's tasks evenly, e.g. "
            f"--array=1-{count}"
        )
    return Shard(index, count)


def resolve(requested: Shard | None, env: Mapping[str, str] | None = None) -> Shard | None:
    """The share this process runs: `--shard`, else the launcher's; None for a whole run.
    A launcher that was asked for several processes but started this one alone is an error."""
    env = os.environ if env is None else env
    launched = from_launcher(env)
    if requested is not None and launched is not None:
        raise UserError(
            f"--shard {requested.label} under a launcher of {launched.count} processes; "
            "give one or the other"
        )
    if launched is None:
        refuse_lone_launch(env)
    return requested or launched


def refuse_lone_launch(env: Mapping[str, str]) -> None:
    """`accelerate launch` asked for several processes (or machines) but started one: on a
    CPU it starts several only through MPI (`--mpirun_hostfile`). It then sets MASTER_ADDR for
    a rendezvous and no WORLD_SIZE; running on as one process would quietly run everything
    here, so say which command works."""
    accelerate = any(k.startswith("ACCELERATE_") for k in env)
    if accelerate and env.get("MASTER_ADDR") and "WORLD_SIZE" not in env:
        raise UserError(
            "accelerate launch started one process where several were asked for (on a CPU "
            "it starts several only through MPI); launch with torchrun instead, e.g. "
            "torchrun --nproc_per_node 2 -m dllmbench run …"
        )


def claim_device(shard: Shard | None) -> None:
    """A launched process on a GPU machine works on `cuda:LOCAL_RANK`: made the current
    device, which a backbone's `cuda` means."""
    if shard is None or not shard.launched:
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(shard.local_rank % torch.cuda.device_count())


# -- the files of a share --------------------------------------------------------------------
def lock_name(shard: Shard) -> str:
    return f".lock.{shard.suffix}"


def samples_name(shard: Shard) -> str:
    return f"samples.{shard.suffix}.jsonl"


def compute_name(shard: Shard) -> str:
    return f"compute.{shard.suffix}.json"


def shards_in(path: Path, kind: str = "samples") -> list[Shard]:
    """The shares that have a samples file (`kind` "samples") or a compute file ("compute")
    in the run directory, in (N, I) order."""
    found = []
    pattern = SHARD_FILE if kind == "samples" else COMPUTE_FILE
    for p in path.glob(f"{kind}.shard-*-of-*.json*"):
        match = pattern.match(p.name)
        if match and 1 <= int(match[1]) <= int(match[2]):
            found.append(Shard(int(match[1]), int(match[2])))
    return sorted(found, key=lambda s: (s.count, s.index))


def running_shares(path: Path) -> list[Shard]:
    """The shares whose lock a process holds now, in (N, I) order."""
    found = []
    for p in path.glob(".lock.shard-*-of-*"):
        match = re.fullmatch(r"\.lock\.shard-(\d+)-of-(\d+)", p.name)
        if match and 1 <= int(match[1]) <= int(match[2]):
            found.append(Shard(int(match[1]), int(match[2])))
    return [s for s in sorted(found, key=lambda s: (s.count, s.index)) if running(path, s)]


def running(path: Path, shard: Shard) -> bool:
    """Whether a process holds the share's lock now (probed with a shared lock, at once
    given back; a share starting meanwhile retries its own lock for a moment)."""
    try:
        fd = os.open(path / lock_name(shard), os.O_RDONLY)
    except OSError:
        return False
    try:
        flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing gives a probe's lock back
    return False


def last_invocation(path: Path, shard: Shard) -> dict[str, Any] | None:
    """The share's latest compute entry, or None when it has none (yet)."""
    try:
        data = json.loads((path / compute_name(shard)).read_text(encoding="utf-8"))
        return data["invocations"][-1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
