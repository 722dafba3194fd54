"""One invocation of `dllmbench run` writing into a run directory: each record appended at
once; its compute entry saved before each record (synced every `save_every` seconds) and when
it ends, however it ends; and its end: the summary of a whole run, or a share's end (the first
process of a launched run, once every chunk is done, checks that every record is there and
writes the results once).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from dllmbench.core.ledger import Ledger
from dllmbench.running.merge import check_complete
from dllmbench.storage.heartbeat import Heartbeat
from dllmbench.storage.rundir import RunDir


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
        self.rundir.save_invocation(self.entry(), durable)
        if durable:
            self._saved = time.monotonic()

    def keep(self, record: dict[str, Any]) -> None:
        # the entry first: every pass of a written record is in a saved entry, whenever a
        # kill comes (synced to disk every `save_every` seconds, written each time)
        self.save(durable=time.monotonic() - self._saved >= self.save_every)
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
        return self

    def __exit__(self, *exc: object) -> None:
        self.save()  # an interrupted or failed invocation is counted too
        if self._merged or self.rundir.shard is None:
            # with what every record spent, and this entry as saved last
            self.rundir.write_compute(accounted=True)

    def conclude(
        self, summarize: Callable[[], dict[str, Any]], problem_ids: list[str]
    ) -> dict[str, Any] | None:
        """After the engine ran: the results of a whole run; None for a share that does not
        merge; the merged results for the first process of a launched run (which has waited
        for every chunk), once every record is there."""
        shard = self.rundir.shard
        self.finished = True
        if shard is None:
            return summarize()
        self.save()
        if not shard.merges:
            return None
        check_complete(self.rundir, self.manifest, problem_ids)
        results = summarize()
        self._merged = True
        return results
