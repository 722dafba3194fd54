"""Progress of long commands on stderr: a live bar on a terminal, plain lines in a log.

When stderr is not a terminal (a job log, a pipe, CI), a bar would print nothing useful, so
`Progress` writes one line whenever another tenth of the work is done and at least every
`every_seconds` while the command runs, even when nothing finished in between:

    dllmbench: arith: 50 problems × 9 methods: 90/450 records (20%), 0.97/s, ETA 6m 11s

The rate and the time left show from the first item finished. Items may differ in cost (a
record at four times the budget takes about four times as long): given each item's work,
the time left is the work left at the work done per second so far, not the items left at the
items per second.

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
from rich.table import Column
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


def rate_and_eta(
    done: int,
    first: int,
    total: int,
    elapsed: float,
    work: tuple[float, float, float] | None = None,
) -> str:
    """`6.10/s, ETA 2m 29s` from the items finished in `elapsed` seconds (those found done at
    the start, `first`, excluded); `12s elapsed` before the first one. With `work` (done,
    done at the start, total), the time left is the work left at the work done per second;
    without, every item weighs the same."""
    finished = done - first
    if finished <= 0 or elapsed <= 0:
        return f"{duration(elapsed)} elapsed"
    work_done, work_first, work_total = work or (done, first, total)
    left = elapsed * max(work_total - work_done, 0) / max(work_done - work_first, 1e-9)
    return f"{finished / elapsed:.2f}/s, ETA {duration(left)}"


class _RateColumn(ProgressColumn):
    """The bar's records per second and time left, as the log lines say them."""

    def __init__(self, progress: Progress, table_column: Column | None = None):
        super().__init__(table_column=table_column)
        self.progress = progress

    def render(self, task: BarTask) -> Text:
        return Text(self.progress.rate())


class Progress:
    """One task's progress: `start(description, total, done)`, then `advance(n)`. On a
    terminal, a bar with items done, items per second and the time left.

    Items of different cost: `start(..., work=W)` with the work of all `total` items, then
    `advance(n, work=w)` with the work of the `n` finished; the time left is then the work left
    at the work done per second. `unit` names what is counted (`records`).

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
        self.unit = ""
        # work done, done at the start, and of every item; None: each item weighs one
        self.work: list[float] | None = None
        self._started = self._last_line = time.monotonic()
        self._next_tenth = 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Bar | None = None
        self._job: Any = None
        if self.live:
            # on a narrow terminal the description gives way (an ellipsis), never the numbers
            whole = Column(no_wrap=True)
            self._bar = Bar(
                TextColumn(
                    "[bold]{task.description}",
                    table_column=Column(no_wrap=True, overflow="ellipsis"),
                ),
                BarColumn(bar_width=20),
                MofNCompleteColumn(table_column=whole),
                _RateColumn(self, table_column=whole),
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

    def start(
        self,
        description: str,
        total: int,
        done: int = 0,
        *,
        work: float | None = None,
        unit: str = "",
    ) -> None:
        """`total` items, `done` of them finished before (not counted in the rate); `work`:
        the work of all `total` items (those done before count as their share of it)."""
        self.description, self.total, self.done, self.first = description, total, done, done
        self.unit = unit
        before = 0.0 if work is None or not total else work * done / total
        self.work = None if work is None else [before, before, float(work)]
        self._started = self._last_line = time.monotonic()
        self._next_tenth = self._tenths(done) + 1
        if self._bar is not None:
            self._job = self._bar.add_task(description, total=total, completed=done)
            return
        self._line()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def advance(self, n: int = 1, work: float | None = None) -> None:
        """`n` more items finished, of `work` together (unknown: the mean item's)."""
        with self._lock:
            self.done += n
            if self.work is not None:
                mean = self.work[2] / self.total if self.total else 0.0
                self.work[0] += n * mean if work is None else work
            if self._bar is not None:
                self._bar.advance(self._job, n)
                return
            if self._next_tenth <= self._tenths(self.done) < 10:  # the last line says "done"
                self._next_tenth = self._tenths(self.done) + 1
                self._line()

    def rate(self) -> str:
        """`6.10/s, ETA 2m 29s` as of now; `12s elapsed` before the first item finished."""
        work = None if self.work is None else (self.work[0], self.work[1], self.work[2])
        elapsed = time.monotonic() - self._started
        return rate_and_eta(self.done, self.first, self.total, elapsed, work)

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
        self._last_line = now
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        unit = f" {self.unit}" if self.unit else ""
        text = f"dllmbench: {self.description}: {self.done}/{self.total}{unit}{pct}"
        if final:
            text += f", done in {duration(now - self._started)}"
        else:
            text += f", {self.rate()}"
        print(text, file=self.stream, flush=True)
