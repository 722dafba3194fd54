"""One invocation of `dllmbench run` writing into a run directory: each record appended at
once; its compute entry saved before each record (synced every `save_every` seconds), on each
heartbeat (every `BEAT_SECONDS`, from the heartbeat's thread, whatever the main thread is
doing: a SIGKILL loses at most the passes charged since the last beat) and when it ends,
however it ends; and its end: the summary of a whole run, or a share's end (the first
process of a launched run, once every chunk is done, checks that every record is there and
writes the results once).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.ledger import Ledger
from dllmbench.running.merge import check_complete
from dllmbench.storage.heartbeat import Heartbeat
from dllmbench.storage.rundir import RunDir

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM that arrive inside wait until it ends, then act as they would have
    (the handler that was there before runs): what is done inside is done whole. Python runs
    a signal's handler between any two statements, so without this a record could be on disk
    and not counted in compute.json. In the main thread only (where handlers run); a handler
    not set from Python is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    before = {s: h for s in INTERRUPTS if (h := signal.getsignal(s)) is not None}
    for signum in before:
        signal.signal(signum, lambda s, frame: caught.append(s))
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])  # to the handler restored: it runs now


class Invocation:
    """Use as a context manager around the engine's run; `keep` is its `on_record`."""

    def __init__(
        self,
        rundir: RunDir,
        ledger: Ledger,
        manifest: dict[str, Any],
        on_record: Callable[[dict[str, Any]], None] | None = None,
        save_every: float = 5.0,
        heart: Heartbeat | None = None,
    ):
        self.rundir, self.ledger, self.manifest = rundir, ledger, manifest
        self.on_record = on_record
        self.save_every = save_every  # seconds between durable saves of the compute entry
        self.heart = heart
        self.written = 0
        self.finished = False
        self._saved = -save_every
        self._start = time.monotonic()
        self._waited = 0.0  # seconds spent waiting for other processes, not working
        self._merged = False
        self._saving = threading.Lock()  # the main thread and the heartbeat's both save
        self._ended = False  # the last save is done: the heartbeat's thread saves no more
        self._moved: tuple[int, int] = (0, 0)  # passes charged and records, at the last beat

    def entry(self) -> dict[str, Any]:
        shard = self.rundir.shard
        elapsed = time.monotonic() - self._start
        return {
            "created": self.manifest["created"],
            "finished": self.finished,
            "records_written": self.written,
            "shard": None if shard is None else shard.label,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": None if self.heart is None else self.heart.token,
            # where this invocation's records start: compute.json attributes each record
            "samples": self.rundir.samples_path.name,
            "offset": self.rundir.samples_offset,
            "wall_seconds": round(elapsed - self._waited, 6),
            "waited_seconds": round(self._waited, 6),
            "passes": self.ledger.passes(),
            "flops": self.ledger.flops(),
            "physical": self.ledger.physical(),
        }

    def save(self, durable: bool = True) -> None:
        with self._saving:
            self.rundir.save_invocation(self.entry(), durable)
        if durable:
            self._saved = time.monotonic()

    def beat(self) -> None:
        """On the heartbeat's thread: save the entry as it stands (the passes charged so far,
        records or not), unsynced as between records. The ledger changes under it, so a read
        that meets a change, or a disk that refuses, waits for the next beat."""
        with self._saving:
            if self._ended:
                return
            with contextlib.suppress(RuntimeError, OSError, UserError):
                self._moving()
                self.rundir.save_invocation(self.entry(), durable=False)

    def _moving(self) -> None:
        """Tell the heartbeat when the work moved (a pass charged, a record written) since the
        last beat: a forward that does not end shows as stuck (`Beat.stuck`)."""
        if self.heart is None or self.heart.beat.doing != "forward":
            return
        moved = (sum(self.ledger.charged.values()), self.written)
        if moved != self._moved:
            self._moved = moved
            self.heart.moved()

    def keep(self, record: dict[str, Any]) -> None:
        # the entry first: every pass of a written record is in a saved entry, whenever a
        # kill comes (synced to disk every `save_every` seconds, written each time)
        self.save(durable=time.monotonic() - self._saved >= self.save_every)
        with interrupts_held():  # on disk and counted, or neither, whenever Ctrl-C comes
            self.rundir.append(record)
            self.written += 1
            if self.heart is not None:
                self.heart.update(records_written=self.written)
        if self.on_record is not None:
            self.on_record(record)

    def waiting(self, seconds: float) -> None:
        """`seconds` spent waiting for other processes (not counted as work)."""
        self._waited += seconds

    def __enter__(self) -> Invocation:
        if self.heart is not None:
            self.heart.doing("forward")
            self.heart.on_beat.append(self.beat)
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self.heart is not None:
            self.heart.doing(None)
            if self.beat in self.heart.on_beat:
                self.heart.on_beat.remove(self.beat)
        with self._saving:
            self._ended = True
        try:
            self.save()  # an interrupted or failed invocation is counted too
            shard = self.rundir.shard
            late = shard is not None and self.rundir.results_path.exists()
            if self._merged or shard is None or late:
                # with what every record spent, and this entry as saved last (a process of
                # a run merged while it was stuck counts its passes there too)
                self.rundir.write_compute(accounted=True)
        except (OSError, UserError):
            if exc is None:
                raise
            # already failing (a full disk, most often): that error is the one to say; the
            # entry saved on the last heartbeat stands

    def conclude(
        self, summarize: Callable[[], dict[str, Any]], problem_ids: list[str]
    ) -> dict[str, Any] | None:
        """After the engine ran: the results of a whole run; None for a share that does not
        merge; the merged results for the first process of a launched run (which has waited
        for every chunk), once every record is there."""
        shard = self.rundir.shard
        self.finished = True
        self.save()
        if shard is not None and not shard.merges:
            return None
        if shard is not None:
            check_complete(self.rundir, self.manifest, problem_ids)
        # compute.json accounting for every record before results.json: a kill between the
        # two leaves no results.json beside a compute.json that does not account for it
        self.rundir.write_compute(accounted=True)
        results = summarize()
        self._merged = True
        return results
