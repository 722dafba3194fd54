"""The budget ledger: every forward pass of every model, charged to the method that owns it.

A *pass* is one forward of a dLLM-scale model over one row. Passes are charged by
(problem, method, kind) with kind `denoise` or `score:<scorer>`. Physical forwards (batched
calls) and seconds are recorded per kind as well, so passes can be checked against time.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from dllmbench.errors import CostMismatch
from dllmbench.schema import LedgerEntry
from dllmbench.types import Owners


class Ledger:
    def __init__(self) -> None:
        self._passes: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._forwards: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._seconds: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.physical_forwards: Counter[str] = Counter()
        self.physical_seconds: Counter[str] = Counter()
        self.physical_rows: Counter[str] = Counter()

    def charge(self, problem_id: str, owners: Iterable[Owners], kind: str, passes: int) -> None:
        """Charge `passes` passes of `kind` per row to every owner of that row."""
        for row_owners in owners:
            for method in row_owners:
                self._passes[problem_id, method][kind] += passes

    def record_forward(self, kind: str, rows: list[tuple[str, Owners]], seconds: float) -> None:
        """One batched physical forward over `rows` (problem id, owners) that took `seconds`."""
        self.physical_forwards[kind] += 1
        self.physical_seconds[kind] += seconds
        self.physical_rows[kind] += len(rows)
        share = seconds / max(len(rows), 1)
        touched: set[tuple[str, str]] = set()
        for problem_id, owners in rows:
            for method in owners:
                self._seconds[problem_id, method][kind] += share
                touched.add((problem_id, method))
        for key in touched:
            self._forwards[key][kind] += 1

    def spent(self, problem_id: str, method: str) -> dict[str, int]:
        return dict(self._passes.get((problem_id, method), {}))

    def check(self, problem_id: str, method: str, planned: Mapping[str, int]) -> None:
        """Raise CostMismatch unless what `method` spent on the problem equals its plan."""
        spent = {k: v for k, v in self.spent(problem_id, method).items() if v}
        want = {k: v for k, v in planned.items() if v}
        if spent != want:
            raise CostMismatch(method, problem_id, want, spent)

    def entry(self, problem_id: str, method: str) -> LedgerEntry:
        """The record of one (problem, method): passes by kind, forwards, seconds."""
        key = (problem_id, method)
        passes = dict(sorted(self._passes.get(key, {}).items()))
        return LedgerEntry(
            passes=passes,
            total_passes=sum(passes.values()),
            forwards=dict(sorted(self._forwards.get(key, {}).items())),
            seconds={k: round(v, 6) for k, v in sorted(self._seconds.get(key, {}).items())},
        )

    def release(self, problem_id: str, method: str) -> None:
        """Forget a finished (problem, method) once its record is written."""
        for table in (self._passes, self._forwards, self._seconds):
            table.pop((problem_id, method), None)

    def physical(self) -> dict[str, dict[str, float]]:
        return {
            kind: {
                "forwards": self.physical_forwards[kind],
                "rows": self.physical_rows[kind],
                "seconds": round(self.physical_seconds[kind], 6),
            }
            for kind in sorted(self.physical_forwards)
        }
