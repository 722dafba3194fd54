"""The budget ledger: every forward pass of every model, charged to the method that owns it.

A *pass* is one forward of a dLLM-scale model over one row. Passes are charged by
(problem, method, kind) with kind `denoise` or `score:<scorer>`, each with the FLOPs that
forward computed (`dllmbench.core.flops`; None where the model's shape is unknown). Physical
forwards (batched calls), seconds and tokens are recorded per kind as well, so passes can be
checked against time. A method may spend exactly what it declared (`check`) or at most its cap
(`cap`): a charge over the cap is refused as it happens (`OverCap`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from dllmbench.core.errors import CostMismatch, OverCap
from dllmbench.core.schema import LedgerEntry
from dllmbench.core.types import Owners


class Ledger:
    def __init__(self) -> None:
        self._passes: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._forwards: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._seconds: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.physical_forwards: Counter[str] = Counter()
        self.physical_seconds: Counter[str] = Counter()
        self.physical_rows: Counter[str] = Counter()
        # tokens the batches computed (rows × the widest row) and the rows' own tokens
        self.physical_tokens: Counter[str] = Counter()
        self.real_tokens: Counter[str] = Counter()
        self.charged: Counter[str] = Counter()  # passes charged to every method, by kind
        self._flops: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._unknown: dict[tuple[str, str], set[str]] = defaultdict(set)  # kinds lacking FLOPs
        self.charged_flops: Counter[str] = Counter()
        self.physical_flops: Counter[str] = Counter()  # the rows' own work, each row once
        self._caps: dict[str, tuple[dict[str, int], str]] = {}  # method → (cap by kind, plugin)

    def cap(self, method: str, cap: Mapping[str, int], plugin: str) -> None:
        """`method` may spend at most `cap` passes of each kind per problem (a kind it does not
        name: none); `plugin` is the strategy named when it spends more."""
        self._caps[method] = ({k: int(v) for k, v in cap.items() if v}, plugin)

    def charge(
        self,
        problem_id: str,
        owners: Iterable[Owners],
        kind: str,
        passes: int,
        flops: int | None = 0,
    ) -> None:
        """Charge `passes` passes of `kind` and `flops` FLOPs (None: unknown) per row to every
        owner of that row. A capped owner going over its cap raises `OverCap`."""
        for row_owners in owners:
            for method in row_owners:
                key = (problem_id, method)
                self._passes[key][kind] += passes
                if flops is None:
                    self._unknown[key].add(kind)
                else:
                    self._flops[key][kind] += flops
                    self.charged_flops[kind] += flops
                if method in self._caps:
                    self._within_cap(problem_id, method, kind)
            self.charged[kind] += passes * len(row_owners)

    def _within_cap(self, problem_id: str, method: str, kind: str) -> None:
        cap, plugin = self._caps[method]
        spent = self._passes[problem_id, method]
        if spent[kind] > cap.get(kind, 0):
            raise OverCap(method, plugin, problem_id, cap, {k: v for k, v in spent.items() if v})

    def record_forward(
        self,
        kind: str,
        rows: list[tuple[str, Owners]],
        seconds: float,
        tokens: tuple[int, int] = (0, 0),
        flops: int | None = None,
    ) -> None:
        """One batched physical forward over `rows` (problem id, owners) that took `seconds`;
        `tokens`: the tokens it computed (rows × the widest row) and the rows' own; `flops`:
        the rows' own work, padding not counted (None: unknown)."""
        if flops is not None:
            self.physical_flops[kind] += flops
        self.physical_forwards[kind] += 1
        self.physical_tokens[kind] += tokens[0]
        self.real_tokens[kind] += tokens[1]
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
        """Raise CostMismatch unless what `method` spent on the problem equals its plan, or,
        for a capped method, lies within its cap (each kind at most the cap's)."""
        spent = {k: v for k, v in self.spent(problem_id, method).items() if v}
        want = {k: v for k, v in planned.items() if v}
        if method in self._caps:
            if any(v > want.get(k, 0) for k, v in spent.items()):
                raise OverCap(method, self._caps[method][1], problem_id, want, spent)
        elif spent != want:
            raise CostMismatch(method, problem_id, want, spent)

    def entry(self, problem_id: str, method: str) -> LedgerEntry:
        """The record of one (problem, method): passes by kind, forwards, seconds."""
        key = (problem_id, method)
        passes = dict(sorted(self._passes.get(key, {}).items()))
        unknown = self._unknown.get(key, set())
        flops = {k: v for k, v in sorted(self._flops.get(key, {}).items()) if k not in unknown}
        return LedgerEntry(
            passes=passes,
            total_passes=sum(passes.values()),
            flops=flops,
            total_flops=None if unknown else sum(flops.values()),
            forwards=dict(sorted(self._forwards.get(key, {}).items())),
            seconds={k: round(v, 6) for k, v in sorted(self._seconds.get(key, {}).items())},
        )

    def release(self, problem_id: str, method: str) -> None:
        """Forget a finished (problem, method) once its record is written."""
        for table in (self._passes, self._forwards, self._seconds, self._flops, self._unknown):
            table.pop((problem_id, method), None)

    def physical(self) -> dict[str, dict[str, float]]:
        """Per kind: forwards, rows, seconds, tokens computed and real, and their ratio
        (`padding`: 1.0 is no padding)."""
        out = {}
        for kind in sorted(self.physical_forwards):
            out[kind] = {
                "forwards": self.physical_forwards[kind],
                "rows": self.physical_rows[kind],
                "seconds": round(self.physical_seconds[kind], 6),
                "tokens": self.physical_tokens[kind],
                "real_tokens": self.real_tokens[kind],
            }
            if self.real_tokens[kind]:
                out[kind]["padding"] = round(self.physical_tokens[kind] / self.real_tokens[kind], 6)
            if kind in self.physical_flops:
                out[kind]["flops"] = self.physical_flops[kind]
        return out

    def passes(self) -> dict[str, int]:
        """Passes charged by kind, summed over every (problem, method) of the ledger's life."""
        return dict(sorted(self.charged.items()))

    def flops(self) -> dict[str, int]:
        """FLOPs charged by kind (known shapes only), over the ledger's life."""
        return dict(sorted(self.charged_flops.items()))
