"""One invocation of `dllmbench run` writing into a run directory: each record appended at
once; its compute entry saved as it goes (every `save_every` seconds) and when it ends,
however it ends; and its end: the summary of a whole run, or a share's end (the first share
of a launched run waits for the others, checks that every record is there and writes the
results once).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from dllmbench.core.ledger import Ledger
from dllmbench.running.merge import check_complete
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Waiter


def _iso(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return moment.isoformat(timespec="seconds")


class Invocation:
    """Use as a context manager around the engine's run; `keep` is its `on_record`."""

    def __init__(
        self,
        rundir: RunDir,
        ledger: Ledger,
        manifest: dict[str, Any],
        on_record: Callable[[dict[str, Any]], None] | None = None,
        save_every: float = 5.0,
    ):
        self.rundir, self.ledger, self.manifest = rundir, ledger, manifest
        self.on_record = on_record
        self.save_every = save_every  # seconds between saves of the compute entry
        self.written = 0
        self.finished = False
        self._saved = -save_every
        self._start = time.monotonic()
        self._merged = False

    def entry(self) -> dict[str, Any]:
        shard = self.rundir.shard
        return {
            "created": self.manifest["created"],
            "finished": self.finished,
            "records_written": self.written,
            "shard": None if shard is None else shard.label,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "wall_seconds": round(time.monotonic() - self._start, 6),
            "passes": self.ledger.passes(),
            "physical": self.ledger.physical(),
        }

    def save(self) -> None:
        self.rundir.save_invocation(self.entry())
        self._saved = time.monotonic()

    def keep(self, record: dict[str, Any]) -> None:
        self.rundir.append(record)
        self.written += 1
        if time.monotonic() - self._saved >= self.save_every:
            self.save()
        if self.on_record is not None:
            self.on_record(record)

    def __enter__(self) -> Invocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.save()  # an interrupted or failed invocation is counted too
        if self._merged:
            self.rundir.write_compute()  # with this entry as saved last

    def conclude(
        self, summarize: Callable[[], dict[str, Any]], problem_ids: list[str]
    ) -> dict[str, Any] | None:
        """After the engine ran: the results of a whole run; None for a share that does not
        merge; the merged results for the first share of a launched run, once every share
        finished (an error naming a share that stopped without)."""
        shard = self.rundir.shard
        if shard is None:
            results = summarize()
            self.finished = True
            return results
        self.finished = True
        self.save()  # the share is done: the others' waiter reads this
        if not shard.merges:
            return None
        # a share's entry at least as new as this process is of this launch
        Waiter(self.rundir.path, shard, _iso(_process_start() - 2)).wait()
        for child in shard.children:
            child.wait()
        check_complete(self.rundir, self.manifest, problem_ids)
        results = summarize()
        self._merged = True
        return results


def _process_start() -> float:
    """When this process started (seconds since the epoch)."""
    import psutil

    return psutil.Process().create_time()
