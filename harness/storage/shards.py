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
shares that `dllmbench merge` joins). Under a launcher, the first process waits for every share and
merges. `accelerate launch --cpu --num_processes N` without MPI starts one process only; that
process then starts the other N−1 itself (`spawn_rest`).

`merge(path)` writes results.json, leaderboard.md and compute.json once every share is done,
and refuses with one line naming what is missing when one is not.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dllmbench.core.errors import UserError

T = TypeVar("T")

SHARD_FILE = re.compile(r"^samples\.shard-(\d+)-of-(\d+)\.jsonl$")
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Shard:
    """Share `index` (1-based) of `count`; `launched`: started by a launcher (the first
    process waits for the rest and merges)."""

    index: int
    count: int
    launched: bool = False
    local_rank: int = 0
    # processes this one started (accelerate's CPU launcher without MPI), waited for
    children: tuple[subprocess.Popen[bytes], ...] = field(default=(), compare=False)

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
        rank = _env_int(env, RANK) or 0
        _checked(rank, world, "the launcher")
        return Shard(rank + 1, world, launched=True, local_rank=_env_int(env, LOCAL) or 0)
    procid, ntasks, localid = (_env_int(env, (name,)) for name in SLURM_TASK)
    if ntasks is not None and ntasks >= 2:
        _checked(procid or 0, ntasks, "Slurm")
        return Shard((procid or 0) + 1, ntasks, launched=True, local_rank=localid or 0)
    task, count, first = (_env_int(env, (name,)) for name in SLURM_ARRAY)
    if task is not None and count is not None and count >= 2:
        index = task - (first or 0) + 1
        if not 1 <= index <= count:
            raise UserError(
                f"Slurm array task {task} (first {first or 0}, {count} tasks) is not one of "
                f"its {count} shares; number the array's tasks consecutively, e.g. "
                f"--array=1-{count}"
            )
        return Shard(index, count)
    return None


def resolve(requested: Shard | None, env: Mapping[str, str] | None = None) -> Shard | None:
    """The share this process runs: `--shard`, else the launcher's, else accelerate's CPU
    launch of several processes that started only this one (the rest are started here)."""
    env = os.environ if env is None else env
    launched = from_launcher(env)
    if requested is not None and launched is not None:
        raise UserError(
            f"--shard {requested.label} under a launcher of {launched.count} processes; "
            "give one or the other"
        )
    if requested is not None or launched is not None:
        return requested or launched
    count = accelerate_cpu_processes(env)
    return spawn_rest(count) if count > 1 else None


def accelerate_cpu_processes(env: Mapping[str, str]) -> int:
    """The `--num_processes` of an `accelerate launch --cpu` that started this process
    alone (accelerate starts several CPU processes only through MPI); 1 otherwise."""
    if env.get("ACCELERATE_USE_CPU", "").lower() not in ("true", "1") or "MASTER_ADDR" not in env:
        return 1
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return 1
    argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if "launch" not in argv:
        return 1
    from accelerate.commands.launch import launch_command_parser

    ours = argv[argv.index("launch") + 1 :]
    try:
        args, _ = launch_command_parser().parse_known_args(ours)
    except SystemExit:
        return 1
    return int(args.num_processes or 1)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the share ends when its starter does


def spawn_rest(count: int) -> Shard:
    """Start shares 2..count as copies of this command and return share 1 (which merges)."""
    children = []
    for rank in range(1, count):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(count), LOCAL_RANK=str(rank))
        env["LOCAL_WORLD_SIZE"] = str(count)
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "dllmbench", *sys.argv[1:]],
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        )
    return Shard(1, count, launched=True, children=tuple(children))


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


def shards_in(path: Path) -> list[Shard]:
    """The shares that have a samples file in the run directory, in (N, I) order."""
    found = []
    for p in path.glob("samples.shard-*-of-*.jsonl"):
        match = SHARD_FILE.match(p.name)
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
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
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


@dataclass
class Waiter:
    """The first process of a launched run, waiting for the other shares to finish."""

    path: Path
    shard: Shard
    started: str  # this launch's `created` (ISO): a share's entry as new is of this launch
    say: Callable[[str], None] = lambda line: print(f"dllmbench: {line}", file=sys.stderr)
    seen: set[int] = field(default_factory=set)  # shares seen running

    def wait(self) -> None:
        """Return when every other share has finished; one line if one stopped without."""
        pending = self.shard.others()
        last_said = time.monotonic()
        while pending:
            pending = [s for s in pending if not self._finished(s)]
            if pending and time.monotonic() - last_said > 60:
                self.say(f"waiting for share {', '.join(s.label for s in pending)}")
                last_said = time.monotonic()
            if pending:
                time.sleep(POLL_SECONDS)

    def _finished(self, other: Shard) -> bool:
        child = self._child(other)
        if running(self.path, other):
            self.seen.add(other.index)
            return False
        entry = last_invocation(self.path, other)
        if entry is not None and entry.get("finished"):
            return True
        code = None if child is None else child.poll()
        ours = entry is not None and str(entry.get("created", "")) >= self.started
        if other.index in self.seen or ours or code is not None:
            why = f" (exit status {code})" if code else ""
            raise UserError(
                f"share {other.label} stopped without finishing{why}; its records are kept "
                f"in {self.path}: launch the same command again to resume"
            )
        return False

    def _child(self, other: Shard) -> subprocess.Popen[bytes] | None:
        children = self.shard.children
        return children[other.index - 2] if len(children) >= other.index - 1 else None


def stop_children(shard: Shard | None) -> None:
    """End the shares this process started (on an error or Ctrl-C of the first)."""
    for child in shard.children if shard else ():
        if child.poll() is None:
            child.terminate()
    for child in shard.children if shard else ():
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
