"""The processes of a launched run (torchrun, `accelerate launch`, a Slurm job step) share the
problems by claiming chunks as they go (`storage/claims.py`); the first process, which merges,
watches the others' heartbeats from the start.

    while a chunk is free, or held by a process that is gone:
        claim it; run its problems (records already written are skipped)
    the first process: until every chunk is done, wait, taking over any chunk whose holder dies

A process of the launch that never writes a heartbeat (`STARTUP_SECONDS`), or that stops
before it claimed anything, stops the first process with one line: the launch lost a process
before it began.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem
from dllmbench.storage.claims import Chunk, Claims, claimed_tokens
from dllmbench.storage.heartbeat import BEAT_SECONDS, STUCK_IN, Beat, read_beats
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard

STARTUP_SECONDS = 60.0  # a process of the launch with no heartbeat by then is not coming
LAUNCH_SKEW = 10.0  # processes of one launch start within this many seconds of each other
# a heartbeat of the same launch id whose last beat is older than this process by more than
# this is of an earlier launch under that id (a requeued Slurm job, a repeated rendezvous id)
RELAUNCH_SECONDS = 120.0
POLL_SECONDS = 1.0
SAY_EVERY = 60.0  # seconds between the first process's "waiting for …" lines

Pair = tuple[str, str]


def say(line: str) -> None:
    print(f"dllmbench: {line}", file=sys.stderr, flush=True)


@dataclass
class ClaimedWork:
    """The problems this process runs, claimed chunk by chunk; `skip` holds every (problem,
    method) written by anyone (the engine reads it as it admits each problem)."""

    claims: Claims
    problems: dict[str, Problem]
    methods: list[str]
    skip: set[Pair]
    rundir: RunDir
    tell: Callable[[str], None] = say
    dropped: int = 0  # records not written: their chunk was taken over from this process
    _pending: dict[int, set[Pair]] = field(default_factory=dict)
    _chunk_of: dict[str, int] = field(default_factory=dict)
    _lost: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        for chunk in self.claims.chunks():
            for pid in chunk.problems:
                self._chunk_of[pid] = chunk.index

    def _todo(self, chunk: Chunk) -> set[Pair]:
        return {(p, m) for p in chunk.problems for m in self.methods} - self.skip

    def complete(self) -> set[int]:
        """Chunks whose records are all written (by this launch or an earlier run)."""
        return {c.index for c in self.claims.chunks() if not self._todo(c)}

    def stream(self) -> Feed:
        """This process's problems: chunk after chunk, claimed when the engine wants more."""
        return Feed(self)

    def write(self, record: dict[str, Any], keep: Callable[[dict[str, Any]], None]) -> bool:
        """`keep(record)` (write it) under the claim lock, if this process still holds the
        record's chunk; else drop it (the chunk was taken over while this process was stuck
        or looked gone: its new holder writes the record, perhaps has and merged) and say so
        once per chunk. Returns whether it was written."""
        k = self._chunk_of.get(record["problem"])
        if k is None:
            keep(record)
            return True
        with self.claims.holding(k) as held:
            if held:
                keep(record)
                return True
        self.dropped += 1
        self._pending.pop(k, None)
        if k not in self._lost:
            self._lost.add(k)
            self.tell(
                f"share {self.claims.share}: chunk {k + 1} was taken over from this process "
                "(stuck, or taken for gone); its records are not written here again"
            )
        return False

    def recorded(self, record: dict[str, Any]) -> None:
        """A record of this process is written: its chunk is done with its last."""
        k = self._chunk_of.get(record["problem"])
        todo = self._pending.get(k) if k is not None else None
        if todo is None:
            return
        todo.discard((record["problem"], record["method"]))
        if not todo:
            del self._pending[k]  # type: ignore[arg-type]
            self.claims.finish(k)  # type: ignore[arg-type]

    def waiting_for(self) -> str:
        """What the first process waits for, in words."""
        complete = self.complete()
        held = [c for c in self.claims.chunks() if not c.done and c.index not in complete]
        if not held:
            return "the other processes to end"
        shares = sorted({str(c.share) for c in held})
        return f"{len(held)} chunk(s) held by share {', '.join(shares)}"

    def finished(self) -> bool:
        """Whether every chunk of the run is done."""
        complete = self.complete()
        return all(c.done or c.index in complete for c in self.claims.chunks())


class Feed:
    """The engine's problems for a launched process: each chunk's, claimed as the engine
    admits. It ends (StopIteration) when nothing can be claimed now: every chunk is done or
    held by a live process, or this process holds its share of what remains; the engine asks
    again as problems finish, so a capped feed goes on once this process's chunks are done."""

    def __init__(self, work: ClaimedWork) -> None:
        self.work = work
        self._queued: deque[Problem] = deque()

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Problem:
        work = self.work
        while not self._queued:
            got = work.claims.claim(work.complete())
            if got is None:
                raise StopIteration
            chunk, takeover = got
            if takeover:  # what the gone holder wrote is not written again
                work.skip |= {(r["problem"], r["method"]) for r in work.rundir.read_records()}
                work.tell(f"share {work.claims.share}: took over chunk {chunk.index + 1}")
            todo = work._todo(chunk)
            if not todo:
                work.claims.finish(chunk.index)
                continue
            work._pending[chunk.index] = todo
            self._queued.extend(work.problems[pid] for pid in chunk.problems)
        return self._queued.popleft()


def stop_main_thread() -> None:
    """Raise KeyboardInterrupt (`Terminated`) in the main thread, from another thread, now:
    SIGTERM sent to the main thread, whose handler `run` installs (`terminated_on_sigterm`),
    whatever SIGINT's disposition (a background task of a batch script, `cmd &`, ignores
    SIGINT, and `_thread.interrupt_main()` then does nothing). A real signal also ends a
    wait in a system call (a sleep, a lock) at once. Without a Python handler for SIGTERM
    (which would kill the process), the main thread is interrupted as by Ctrl-C."""
    if callable(signal.getsignal(signal.SIGTERM)):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
    else:
        _thread.interrupt_main()


def process_started() -> float:
    """When this process started (seconds since the epoch): the launch's processes started
    together, whatever their imports took."""
    return psutil.Process().create_time()


@dataclass
class Watch:
    """A launched process's watch over the others of its launch, in a thread from the start:
    one that never shows a heartbeat, or stops before it claimed any work (refused, or lost
    while it loaded), stops this process (the main thread is interrupted; `failure` says
    why). The first process, which merges, also says when one stopped holding chunks."""

    rundir: RunDir
    shard: Shard
    launch: str | None
    started: float = field(default_factory=process_started)
    failure: UserError | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _gone: set[str] = field(default_factory=set)
    _stuck: set[str] = field(default_factory=set)  # tokens of processes said to be stuck

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, name="dllmbench-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_SECONDS / 2):
            problem = self.check(time.time())
            if problem is not None:
                self.failure = problem
                stop_main_thread()
                return

    def others_ended(self, now: float | None = None) -> bool:
        """Whether every other process of this launch has ended (finished, stopped or gone),
        or is stuck (its chunks were taken over, and it writes no record when it moves
        again): their compute entries are then final, but a stuck one's."""
        now = time.time() if now is None else now
        beats = read_beats(self.rundir.path)
        for other in self.shard.others():
            beat = beats.get(other.label)
            if not self.ours(beat) or (beat is not None and beat.working(now)):
                return False
        return True

    def ours(self, beat: Beat | None) -> bool:
        """Whether a heartbeat is of a process of this launch: the same launch id, and (a
        Slurm requeue and `torchrun --rdzv-id NAME` repeat the id) beating after this process
        started, give or take the clocks of other nodes; without ids, started with it."""
        if beat is None:
            return False
        if beat.launch is not None and self.launch is not None:
            return beat.launch == self.launch and beat.beat >= self.started - RELAUNCH_SECONDS
        return beat.started >= self.started - LAUNCH_SKEW

    def check(self, now: float) -> UserError | None:
        """What stops the run now, if anything."""
        beats = read_beats(self.rundir.path)
        claimed = claimed_tokens(self.rundir.path)
        for other in self.shard.others():
            beat = beats.get(other.label)
            if not self.ours(beat):
                if now - self.started > STARTUP_SECONDS:
                    return UserError(
                        f"share {other.label} of this launch has written no heartbeat in "
                        f"{STARTUP_SECONDS:.0f} s: it did not start or died at once; the "
                        f"records written are kept in {self.rundir.path}: launch the same "
                        "command again to resume"
                    )
                continue
            assert beat is not None
            stuck = beat.stuck(now)
            if stuck is not None and beat.alive(now):
                self._say_stuck(other.label, beat, stuck)
                continue
            if beat.alive(now) or beat.state == "finished":
                continue
            if beat.token not in claimed:
                if beat.reason:  # refused: its own line says what differs and what to do
                    return UserError(
                        f"share {other.label} ({beat.who}) of this launch was refused: "
                        f"{beat.reason}"
                    )
                return UserError(
                    f"share {other.label} ({beat.who}) stopped before it claimed any work; "
                    f"the records written are kept in {self.rundir.path}: launch the same "
                    "command again to resume"
                )
            if other.label not in self._gone and self.shard.merges:
                self._gone.add(other.label)
                say(f"share {other.label} ({beat.who}) stopped; its chunks are taken over")
        return None

    def _say_stuck(self, label: str, beat: Beat, seconds: float) -> None:
        """One line, once per process, for one whose heartbeat beats while its work does not
        move (a forward or the claim lock for longer than `STUCK_SECONDS`)."""
        if beat.token in self._stuck:
            return
        self._stuck.add(beat.token)
        say(
            f"share {label} ({beat.who}) is stuck: in {STUCK_IN[str(beat.doing)]} for "
            f"{seconds:.0f} s while its heartbeat beats; its chunks are taken over (end it: "
            f"kill {beat.pid} on {beat.host})"
        )
