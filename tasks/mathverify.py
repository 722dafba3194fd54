"""math-verify grading in worker processes, under a hard time limit per grade.

math-verify (sympy underneath) can spend unbounded time or memory on a pathological answer:
`3` against `9^{9^{9^{9}}}` never returns. Each grade therefore runs in a persistent worker
process (`_verify_worker.py`), and a grade that has not answered within its limit is counted
wrong at once: its worker is killed and a fresh one starts on the next grade. A worker that
crashes twice on one answer counts the same way. Workers have a memory limit of their own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from dllmbench.core.errors import UserError

STARTUP_SECONDS = 120.0  # importing sympy and math-verify; never charged to a grade


@cache
def _source() -> str:
    return (Path(__file__).with_name("_verify_worker.py")).read_text(encoding="utf-8")


def _kill(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Worker:
    """One math-verify process, started on first use and after each time-out or crash."""

    def __init__(self, memory_mb: int):
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen | None = None
        self._buffer = b""
        self.restarts = 0

    def _readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None at the deadline or when it has died."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:  # epoll: any descriptor number
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _start(self) -> None:
        if importlib.util.find_spec("math_verify") is None:
            raise UserError("math500: grading needs math-verify; pip install math-verify")
        self._buffer = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _source(), str(self.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # math-verify logs every unparsable answer
            start_new_session=True,
            cwd="/",
        )
        if self._readline(time.monotonic() + STARTUP_SECONDS) is None:
            self.stop()
            raise UserError(
                "math500: the math-verify worker did not start; check that "
                f"`{sys.executable} -c 'import math_verify'` works"
            )

    def stop(self) -> None:
        _kill(self.proc)
        self.proc = None

    def verify(self, gold: str, answer: str, timeout: float) -> tuple[bool, str]:
        """(correct, how): how is "graded", "timeout" or "crashed".

        A worker that died without answering is replaced and the grade tried once more, as it
        may have died before this answer reached it; a second crash counts as wrong.
        """
        ok, how = self._verify(gold, answer, timeout)
        if how == "crashed":
            ok, how = self._verify(gold, answer, timeout)
        return ok, how

    def _verify(self, gold: str, answer: str, timeout: float) -> tuple[bool, str]:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        request = {"gold": gold, "answer": answer, "timeout": timeout}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.stop()
            return False, "crashed"
        line = self._readline(time.monotonic() + timeout)
        if line is None:
            died = self.proc.poll() is not None
            self.stop()
            return False, "crashed" if died else "timeout"
        try:
            return bool(json.loads(line)["ok"]), "graded"
        except (ValueError, KeyError):
            self.stop()
            return False, "crashed"


def _stop_all(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


class VerifyPool:
    """Up to `size` workers shared by threads; `verify` blocks until one is free."""

    def __init__(self, size: int, memory_mb: int):
        self.size = max(1, size)
        self.workers = [Worker(memory_mb) for _ in range(self.size)]
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for worker in self.workers:
            self._idle.put(worker)
        self._finalizer = weakref.finalize(self, _stop_all, self.workers)

    def verify(self, gold: str, answer: str, timeout: float) -> tuple[bool, str]:
        worker = self._idle.get()
        try:
            return worker.verify(gold, answer, timeout)
        finally:
            self._idle.put(worker)

    def verify_many(self, pairs: Sequence[tuple[str, str]], timeout: float) -> list[bool]:
        with ThreadPoolExecutor(self.size) as pool:
            results = pool.map(lambda p: self.verify(p[0], p[1], timeout)[0], pairs)
            return list(results)

    def close(self) -> None:
        self._finalizer()
