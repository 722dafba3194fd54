"""Heartbeats: every process running into a run directory says, every few seconds, that it is
alive and how far it got.

A process writes `heartbeat.json` (a whole run) or `heartbeat.shard-I-of-N.json` (share I of
N) from a background thread, every `BEAT_SECONDS`, whatever its main thread is doing (loading
a model, a long forward). The file says who (pid, host, a token new to each invocation), since
when, its state (`running`, then `finished` or `stopped`), the records it wrote and, for a
fixed share, the records it has to write. A process is taken for dead when its heartbeat is
older than `STALE_SECONDS` or, on the same host, when its pid is gone (or is a newer
process's, the pid reused); a process that ends in
any way Python sees (an error, Ctrl-C, SIGTERM) writes `stopped` at once. It also says what
its main thread does (`doing`: a forward, the claim lock, waiting for the others) and since
when its work last moved (`since`): a process whose heartbeat beats while it has been in one
forward or in the claim lock for longer than `STUCK_SECONDS` is stuck (`Beat.stuck`), and
its chunks are taken over as a dead process's are.

`dllmbench status` reads these files; the first process of a launched run and `dllmbench merge
--wait` watch them to stop, with one line, instead of waiting for a process that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dllmbench.storage.filesystem import temporary_name

BEAT_SECONDS = 5.0
STALE_SECONDS = 30.0  # no heartbeat for this long: the process is gone (or its host is)
# a process whose heartbeat beats but whose work has not moved for this long (one forward, or
# the claim lock, waited for or held) is stuck; a wait for a lock ends after this long too
STUCK_SECONDS = 120.0
STUCK_IN = {"forward": "a forward", "claim lock": "the claim lock"}  # what can get stuck
HEARTBEAT = re.compile(r"^heartbeat(?:\.shard-(\d+)-of-(\d+))?\.json$")


def heartbeat_name(suffix: str | None) -> str:
    """The heartbeat file of a share (`shard-I-of-N`) or of a whole run (None)."""
    return f"heartbeat.{suffix}.json" if suffix else "heartbeat.json"


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether process `pid` of this host runs (a zombie, killed but not yet reaped, does
    not) and, given when the invocation that wrote a heartbeat `started`, is still that
    process: one created after it holds the pid of one that ended (pids are reused), give or
    take `STALE_SECONDS` for a wall clock set forward since."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or process.create_time() <= started + STALE_SECONDS
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: alive
        return True


@dataclass
class Beat:
    """One heartbeat file's content."""

    share: str | None  # "I/N", or None for a whole run
    token: str  # new to each invocation: a relaunched share has another
    pid: int
    host: str
    started: float  # seconds since the epoch
    beat: float  # the last heartbeat, seconds since the epoch
    state: str = "running"  # running, finished, stopped
    records_written: int = 0  # by this invocation
    planned: int | None = None  # records this invocation has to write, when fixed
    launch: str | None = None  # the launcher's id of this launch (torchrun, Slurm), if any
    reason: str | None = None  # why a process of a launch was refused before it began
    doing: str | None = None  # what its main thread does: `STUCK_IN`'s, "waiting", None
    since: float | None = None  # when it began that, or last moved (a forward, a record)

    def stuck(self, now: float | None = None) -> float | None:
        """Seconds it has been stuck (in a forward or the claim lock, longer than
        `STUCK_SECONDS`) while its heartbeat beats; None when it is not."""
        now = time.time() if now is None else now
        if self.state != "running" or self.doing not in STUCK_IN or self.since is None:
            return None
        seconds = now - self.since
        return seconds if seconds > STUCK_SECONDS else None

    def working(self, now: float | None = None) -> bool:
        """Alive and not stuck: it can finish what it holds."""
        return self.alive(now) and self.stuck(now) is None

    def alive(self, now: float | None = None) -> bool:
        """Whether the process is running: it says so, its heartbeat is fresh, and (on this
        host) its pid exists and is not another process's since."""
        now = time.time() if now is None else now
        if self.state != "running" or now - self.beat > STALE_SECONDS:
            return False
        return self.host != socket.gethostname() or pid_alive(self.pid, self.started)

    @property
    def rate(self) -> float | None:
        """Records per second since it started."""
        elapsed = self.beat - self.started
        return self.records_written / elapsed if self.records_written and elapsed > 0 else None

    @property
    def who(self) -> str:
        return f"pid {self.pid} on {self.host}"

    @classmethod
    def from_dict(cls, data: Any) -> Beat | None:
        try:
            return cls(
                share=data.get("share"),
                token=str(data["token"]),
                pid=int(data["pid"]),
                host=str(data["host"]),
                started=float(data["started"]),
                beat=float(data["beat"]),
                state=str(data.get("state", "running")),
                records_written=int(data.get("records_written", 0)),
                planned=data.get("planned"),
                launch=data.get("launch"),
                reason=data.get("reason"),
                doing=data.get("doing"),
                since=None if data.get("since") is None else float(data["since"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None


def read_beat(path: Path) -> Beat | None:
    """The heartbeat in `path`; None when there is none or it is not one (a torn write is
    impossible: heartbeats are replaced whole)."""
    try:
        return Beat.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def read_beats(folder: Path) -> dict[str | None, Beat]:
    """Every heartbeat of the run directory, by share label (None: a whole run)."""
    out: dict[str | None, Beat] = {}
    for path in sorted(folder.glob("heartbeat*.json")):
        match = HEARTBEAT.match(path.name)
        beat = read_beat(path) if match else None
        if beat is not None:
            out[f"{match[1]}/{match[2]}" if match[1] else None] = beat  # type: ignore[index]
    return out


def launch_id(env: dict[str, str] | os._Environ[str]) -> str | None:
    """An id every process of one launch shares and the next launch does not, where the
    launcher gives one: torchrun's run id (and restart), Slurm's job and step."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun:{run_id}:{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return None


@dataclass
class Heartbeat:
    """This process's heartbeat: `start()` it, `update()` what it did, `stop(state)` at the
    end (use as a context manager: `stopped` unless `finish()` was called)."""

    path: Path
    share: str | None = None
    planned: int | None = None
    beat: Beat = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # called on the heartbeat's thread after each beat (the run saves its compute entry)
    on_beat: list[Callable[[], None]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        now = time.time()
        self.beat = Beat(
            share=self.share,
            token=secrets.token_hex(8),
            pid=os.getpid(),
            host=socket.gethostname(),
            started=now,
            beat=now,
            planned=self.planned,
            launch=launch_id(os.environ),
        )

    @property
    def token(self) -> str:
        return self.beat.token

    def start(self) -> Heartbeat:
        try:  # what an earlier invocation left: put back if this one never begins
            self._before: bytes | None = self.path.read_bytes()
        except OSError:
            self._before = None
        self._write()
        self._thread = threading.Thread(target=self._run, name="dllmbench-heartbeat", daemon=True)
        self._thread.start()
        return self

    def update(self, **fields: Any) -> None:
        with self._lock:
            for key, value in fields.items():
                setattr(self.beat, key, value)

    def doing(self, what: str | None) -> str | None:
        """Say what the main thread does from now (`STUCK_IN`'s, "waiting", None); returns
        what it did before."""
        with self._lock:
            before, self.beat.doing, self.beat.since = self.beat.doing, what, time.time()
        return before

    def moved(self) -> None:
        """The main thread's work moved on (a forward, a record): not stuck."""
        with self._lock:
            self.beat.since = time.time()

    def stop(self, state: str) -> None:
        """Stop beating and say how it ended (`finished` or `stopped`)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.update(state=state)
        self._write()

    def restore(self) -> None:
        """Stop, and leave the file as it was before `start` (an invocation refused before it
        began leaves the run directory as it was)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):
            if self._before is None:
                self.path.unlink()
            else:
                tmp = temporary_name(self.path)
                try:
                    tmp.write_bytes(self._before)
                    os.replace(tmp, self.path)
                except OSError:
                    tmp.unlink(missing_ok=True)
                    raise

    def _run(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._write()
            for call in list(self.on_beat):
                call()

    def _write(self) -> None:
        with self._lock:
            self.beat.beat = time.time()
            text = json.dumps(asdict(self.beat), indent=2) + "\n"
            tmp = temporary_name(self.path)
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError:  # a full or vanished disk: the run's own writes will say so
                with contextlib.suppress(OSError):
                    tmp.unlink()
