"""Progress of long commands on stderr: a live bar on a terminal, plain lines in a log.

When stderr is not a terminal (a job log, a pipe, CI), a bar would print nothing useful, so
`Progress` writes one line whenever another tenth of the work is done and at least every
`every_seconds` while the command runs, even when nothing finished in between:

    dllmbench: arith × methods: 390/1300 (30%), 6.10/s, ETA 2m 29s

stdout stays clean for `--json`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn
from rich.progress import Progress as Bar
from rich.progress import Task as BarTask
from rich.text import Text


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def rate_and_eta(done: int, first: int, total: int, elapsed: float) -> str:
    """`6.10/s, ETA 2m 29s` from the records finished in `elapsed` seconds (those found done
    at the start, `first`, excluded); `12s elapsed` before the first one."""
    finished = done - first
    if finished <= 0 or elapsed <= 0:
        return f"{duration(elapsed)} elapsed"
    rate = finished / elapsed
    return f"{rate:.2f}/s, ETA {duration((total - done) / rate)}"


class _RateColumn(ProgressColumn):
    """The bar's records per second and time left, as the log lines say them."""

    def __init__(self, progress: Progress):
        super().__init__()
        self.progress = progress

    def render(self, task: BarTask) -> Text:
        elapsed = time.monotonic() - self.progress._started
        done = int(task.completed)
        return Text(rate_and_eta(done, self.progress.first, int(task.total or 0), elapsed))


class Progress:
    """One task's progress: `start(description, total, done)`, then `advance(n)`. On a
    terminal, a bar with records done, records per second and the time left.

    Use it as a context manager; `log(line)` prints a line without breaking the bar.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        live: bool | None = None,
        every_seconds: float = 30.0,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every_seconds = every_seconds
        self.description, self.total, self.done, self.first = "", 0, 0, 0
        self._started = self._last_line = time.monotonic()
        self._next_tenth = 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Bar | None = None
        self._job: Any = None
        if self.live:
            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                _RateColumn(self),
                console=Console(file=self.stream),
                transient=True,
            )

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif self.description and exc[0] is None:
            self._line(final=True)

    def start(self, description: str, total: int, done: int = 0) -> None:
        self.description, self.total, self.done, self.first = description, total, done, done
        self._started = self._last_line = time.monotonic()
        self._next_tenth = self._tenths(done) + 1
        if self._bar is not None:
            self._job = self._bar.add_task(description, total=total, completed=done)
            return
        self._line()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._job, n)
            return
        with self._lock:
            self.done += n
            if self._next_tenth <= self._tenths(self.done) < 10:  # the last line says "done"
                self._next_tenth = self._tenths(self.done) + 1
                self._line()

    def log(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line)
        else:
            print(line, file=self.stream, flush=True)

    def _tenths(self, done: int) -> int:
        return 10 * done // self.total if self.total else 10

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.every_seconds)):
            with self._lock:
                if time.monotonic() - self._last_line >= self.every_seconds:
                    self._line()

    def _line(self, final: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self._started
        self._last_line = now
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        text = f"dllmbench: {self.description}: {self.done}/{self.total}{pct}"
        if final:
            text += f", done in {duration(elapsed)}"
        else:
            text += f", {rate_and_eta(self.done, self.first, self.total, elapsed)}"
        print(text, file=self.stream, flush=True)
