"""Claimed chunks: the processes of a launched run share the problems as they go.

The run's problems, in the task's order, are cut into chunks of `CHUNK` problems. A process
that needs work takes the first chunk nobody holds, writing a claim to `claims.jsonl` under
the exclusive lock `.lock.claims`, so a fast process takes more chunks than a slow one. When
it has written every record of a chunk it says so (`done`). A chunk held by a process that is
gone (its heartbeat, `heartbeat.py`, is stale, says it stopped, or belongs to a newer
invocation of its share) is taken over by the next process that looks: records already written
for it are skipped, so no record is written twice and none is missing.

`claims.jsonl` is append-only: a first line with the chunk size, then one line per claim or
completion: `{"chunk": 3, "event": "claim", "share": "2/4", "token": "…", "time": "…"}`.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllmbench.storage.heartbeat import Beat, read_beats

CHUNK = 4  # problems per chunk: small, so work follows speed; the engine claims as it admits
CLAIMS = "claims.jsonl"
LOCK = ".lock.claims"


@dataclass
class Chunk:
    index: int
    problems: list[str]  # ids
    share: str | None = None  # the share that holds it (its last claim)
    token: str | None = None  # that claim's invocation
    done: bool = False
    claims: int = 0  # how many times it was claimed (more than once: taken over)


@dataclass
class Owner:
    """Whether the holder of a claim is alive: its share's heartbeat is this invocation's and
    fresh."""

    beats: dict[str | None, Beat]
    now: float | None = None

    def alive(self, chunk: Chunk) -> bool:
        beat = self.beats.get(chunk.share)
        return beat is not None and beat.token == chunk.token and beat.alive(self.now)


def chunked(ids: Sequence[str], size: int = CHUNK) -> list[list[str]]:
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


@dataclass
class Claims:
    """The claim file of the run directory `path` over the run's `problem_ids`; `share` and
    `token` name this process's claims."""

    path: Path
    problem_ids: Sequence[str]
    share: str | None = None
    token: str | None = None
    size: int = CHUNK
    _read: int = field(default=0, init=False)

    @property
    def file(self) -> Path:
        return self.path / CLAIMS

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def chunks(self) -> list[Chunk]:
        """Every chunk with its holder and whether it is done, from the claim file."""
        events, size = self._events()
        out = [Chunk(i, ids) for i, ids in enumerate(chunked(self.problem_ids, size))]
        for event in events:
            k = event.get("chunk")
            if not isinstance(k, int) or not 0 <= k < len(out):
                continue
            if event.get("event") == "claim":
                out[k].share, out[k].token = event.get("share"), event.get("token")
                out[k].claims += 1
            elif event.get("event") == "done":
                out[k].done = True
        return out

    def _events(self) -> tuple[list[dict[str, Any]], int]:
        """The claim file's events and its chunk size (this one's when there is no file)."""
        try:
            text = self.file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], self.size
        events, size = [], self.size
        for n, line in enumerate(text.splitlines()):
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a torn last line (a process killed mid-write)
            if n == 0 and isinstance(item, dict) and isinstance(item.get("chunk_size"), int):
                size = item["chunk_size"]
            elif isinstance(item, dict):
                events.append(item)
        return events, size

    def _append(self, *events: dict[str, Any]) -> None:
        new = not self.file.exists()
        with open(self.file, "a", encoding="utf-8") as fh:
            if new:
                fh.write(json.dumps({"chunk_size": self.size}) + "\n")
            for event in events:
                fh.write(json.dumps(event) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _event(self, chunk: int, kind: str) -> dict[str, Any]:
        time = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        return {
            "chunk": chunk,
            "event": kind,
            "share": self.share,
            "token": self.token,
            "time": time,
        }

    def claim(self, complete: set[int] | None = None) -> tuple[Chunk, bool] | None:
        """Take the first chunk nobody holds, else the first held by a process that is gone;
        None when every chunk is done or held by a live process. `complete`: chunks whose
        records are all written already (not claimed). Returns the chunk and whether it was
        taken over."""
        with self._locked():
            chunks = self.chunks()
            owner = Owner(read_beats(self.path))
            open_ = [c for c in chunks if not c.done and c.index not in (complete or set())]
            free = [c for c in open_ if c.share is None and c.token is None]
            dead = [c for c in open_ if c not in free and not owner.alive(c)]
            for chunk, takeover in [*((c, False) for c in free), *((c, True) for c in dead)]:
                self._append(self._event(chunk.index, "claim"))
                chunk.share, chunk.token = self.share, self.token
                return chunk, takeover
        return None

    def finish(self, chunk: int) -> None:
        with self._locked():
            self._append(self._event(chunk, "done"))


def claimed_tokens(path: Path) -> set[str]:
    """The invocations (tokens) that ever claimed a chunk in the run directory `path`."""
    events, _ = Claims(path, [])._events()
    return {str(e["token"]) for e in events if e.get("event") == "claim" and e.get("token")}


def abandoned(chunks: list[Chunk], beats: dict[str | None, Beat]) -> list[Chunk]:
    """Chunks not done whose holder is gone."""
    owner = Owner(beats)
    return [c for c in chunks if not c.done and c.token is not None and not owner.alive(c)]
