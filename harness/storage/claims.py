"""Claimed chunks: the processes of a launched run share the problems as they go.

The run's problems, in the task's order, are cut into chunks of `CHUNK` problems (fewer when
the processes outnumber the problems over `CHUNK`: `chunk_size`). A process that needs work
takes the first chunk nobody holds, writing a claim to `claims.jsonl` under the exclusive
lock `.lock.claims`, so a fast process takes more chunks than a slow one; it never holds more
than its share of what remains (`share_of`: the problems not done over the processes, at
least one chunk), so every process of the launch gets work at the start. When
it has written every record of a chunk it says so (`done`). A chunk held by a process that is
gone (its heartbeat, `heartbeat.py`, is stale, says it stopped, belongs to a newer
invocation of its share, or says it is stuck) is taken over by the next process that looks:
records already written for it are skipped, and a process writes a record only while it holds
the record's chunk (`holding`, under the lock), so no record is written twice and none is
missing, even when a stuck process moves again after its chunks were taken over.

The lock is waited for at most `STUCK_SECONDS`; then the process stops with one line naming
the holder, which writes who it is into `.lock.claims` while it holds it.

`claims.jsonl` is append-only: a first line with the chunk size, then one line per claim or
completion: `{"chunk": 3, "event": "claim", "share": "2/4", "token": "…", "time": "…"}`.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import random
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.storage.filesystem import append_whole, flock
from dllmbench.storage.heartbeat import STUCK_SECONDS, Beat, Heartbeat, read_beats

CHUNK = 4  # problems per chunk: small, so work follows speed; the engine claims as it admits
CLAIMS = "claims.jsonl"
LOCK = ".lock.claims"
LOCK_POLL_SECONDS = 0.1  # at most, between tries of a claim lock another process holds
HOLDER_BYTES = 512  # who holds the claim lock, in JSON padded with spaces


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
    """Whether the holder of a claim is alive: its share's heartbeat is this invocation's,
    fresh, and not stuck."""

    beats: dict[str | None, Beat]
    now: float | None = None

    def alive(self, chunk: Chunk) -> bool:
        """The holder runs and is not stuck (`Beat.working`): a chunk of a process stuck in a
        forward is taken over, and what it writes when it moves again is refused (`held`)."""
        beat = self.beats.get(chunk.share)
        return beat is not None and beat.token == chunk.token and beat.working(self.now)


def chunked(ids: Sequence[str], size: int = CHUNK) -> list[list[str]]:
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


def chunk_size(problems: int, processes: int) -> int:
    """Problems per chunk for `processes` sharing `problems`: `CHUNK`, or fewer so that each
    process's share holds at least one chunk (every process gets work when problems >=
    processes)."""
    return max(1, min(CHUNK, problems // max(1, processes)))


def share_of(open_problems: int, processes: int) -> int:
    """The problems one process may hold at once: its share of those not done yet, rounded
    down (so that the first processes to claim leave a chunk for each of the others)."""
    return open_problems // max(1, processes)


@dataclass
class Claims:
    """The claim file of the run directory `path` over the run's `problem_ids`; `share` and
    `token` name this process's claims."""

    path: Path
    problem_ids: Sequence[str]
    share: str | None = None
    token: str | None = None
    size: int = CHUNK
    processes: int = 1  # of the launch: each holds at most its share of what remains
    heart: Heartbeat | None = None  # this process's: says when it waits for the claim lock
    _offset: int = field(default=0, init=False)  # of the claim file, read so far
    _seen: list[dict[str, Any]] = field(default_factory=list, init=False)
    _size: int | None = field(default=None, init=False)  # the file's chunk size

    @property
    def file(self) -> Path:
        return self.path / CLAIMS

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold `.lock.claims`: waited for at most `STUCK_SECONDS`, then one line naming its
        holder (which writes who it is into the file while it holds it). The heartbeat says
        this process is in the claim lock meanwhile, so a hang here shows."""
        before = self.heart.doing("claim lock") if self.heart is not None else None
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            start = time.monotonic()
            while True:
                try:
                    flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.path)
                    break
                except BlockingIOError:
                    waited = time.monotonic() - start
                    if waited >= STUCK_SECONDS:
                        raise self._held_too_long(fd, waited) from None
                    time.sleep(random.uniform(0.01, LOCK_POLL_SECONDS))
            me = {"share": self.share, "pid": os.getpid(), "host": socket.gethostname()}
            text = json.dumps({**me, "since": time.time()}).encode()
            os.pwrite(fd, text.ljust(HOLDER_BYTES), 0)  # over the last holder's: no truncate
            yield
        finally:
            os.close(fd)  # closing releases the lock
            if self.heart is not None:
                self.heart.doing(before)

    def _held_too_long(self, fd: int, waited: float) -> UserError:
        """The line for a claim lock not had in `waited` seconds, naming its holder."""
        try:
            holder = json.loads(os.pread(fd, HOLDER_BYTES, 0) or b"{}")
            who = f"share {holder['share']} (pid {holder['pid']} on {holder['host']})"
            held = f" for {time.time() - float(holder['since']):.0f} s"
            kill = f"end it (kill {holder['pid']} on {holder['host']})"
        except (OSError, ValueError, KeyError, TypeError):
            who, held, kill = "another process", "", "end the process that hangs"
        return UserError(
            f"the claim lock of {self.path} ({LOCK}) has been held by {who}{held}: this process "
            f"waited {waited:.0f} s for it, so that process hangs; {kill}, then launch the same "
            "command again to resume (the records written are kept)"
        )

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
        """The claim file's events and its chunk size (this one's when there is no file).
        The file only grows: each call reads what was appended since the last."""
        try:
            with open(self.file, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self._offset:  # replaced: read it anew
                    self._offset, self._seen, self._size = 0, [], None
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            self._offset, self._seen, self._size = 0, [], None
            return [], self.size
        whole = data.rfind(b"\n") + 1  # a torn last line is read once it is whole
        for line in data[:whole].splitlines():
            first = self._offset == 0 and self._size is None
            try:
                item = json.loads(line)
            except ValueError:
                item = None  # a line torn by a process killed mid-write
            if first and isinstance(item, dict) and isinstance(item.get("chunk_size"), int):
                self._size = item["chunk_size"]
            elif isinstance(item, dict):
                self._seen.append(item)
            if first and self._size is None:
                self._size = self.size  # a first line that gives none
        self._offset += whole
        return self._seen, self.size if self._size is None else self._size

    def _append(self, *events: dict[str, Any]) -> None:
        """Append `events`, fsynced; a write that fails (a full disk: one line) is cut off."""
        new = not self.file.exists()
        lines = [json.dumps(e) + "\n" for e in events]
        if new:
            lines.insert(0, json.dumps({"chunk_size": self.size}) + "\n")
        append_whole(self.file, "".join(lines).encode("utf-8"))

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
        None when every chunk is done or held by a live process, or when this process holds
        its share of what remains already (it claims again once it has finished some; with
        nothing held it may always take one chunk). `complete`: chunks whose records are all
        written already (not claimed). Returns the chunk and whether it was taken over."""
        with self._locked():
            chunks = self.chunks()
            owner = Owner(read_beats(self.path))
            open_ = [c for c in chunks if not c.done and c.index not in (complete or set())]
            free = [c for c in open_ if c.share is None and c.token is None]
            held = [c for c in open_ if c.share is not None or c.token is not None]
            dead = [c for c in held if not owner.alive(c)]
            mine = sum(len(c.problems) for c in held if self.token and c.token == self.token)
            share = share_of(sum(len(c.problems) for c in open_), self.processes)
            for chunk, takeover in [*((c, False) for c in free), *((c, True) for c in dead)]:
                if mine and mine + len(chunk.problems) > share:
                    return None
                self._append(self._event(chunk.index, "claim"))
                chunk.share, chunk.token = self.share, self.token
                return chunk, takeover
        return None

    @contextmanager
    def holding(self, chunk: int) -> Iterator[bool]:
        """Under the claim lock: whether this process still holds `chunk` (its claim is the
        chunk's last, and the chunk is not done). A record written inside is written only by
        the chunk's holder: a process that was stuck, or looked gone, and moves again after
        its chunk was taken over (and perhaps merged) writes none of it again."""
        with self._locked():
            chunks = self.chunks()
            found = chunks[chunk] if 0 <= chunk < len(chunks) else None
            yield found is not None and found.token == self.token and not found.done

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
