"""From records to results: accuracy with CIs, paired differences, pool diagnostics, and what
each method spent (passes and FLOPs per problem, measured, with intervals)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dllmbench.analysis.stats import (
    CONFIDENCE,
    RESAMPLES,
    Interval,
    bootstrap_ci,
    entropy_bits,
    paired_difference,
    unique_answers,
)
from dllmbench.core.schema import (
    SCHEMA_VERSION,
    CandidateRecord,
    DeltaEntry,
    IntervalEntry,
    MethodEntry,
    MethodResult,
    PoolEntry,
    Record,
    Results,
    SpendEntry,
)

if TYPE_CHECKING:
    from dllmbench.storage.rundir import RunDir

__all__ = ["SCHEMA_VERSION", "summarize"]


@dataclass(frozen=True)
class _Bootstrap:
    """The bootstrap settings every interval of one summary shares."""

    resamples: int
    level: float
    seed: int

    def interval(self, values: Sequence[float] | np.ndarray) -> IntervalEntry:
        return bootstrap_ci(
            values, resamples=self.resamples, level=self.level, seed=self.seed
        ).as_dict()

    def mean(self, values: Sequence[float]) -> IntervalEntry:
        """The mean of `values` with its interval; values all equal (an exact method's
        spend) have a point interval, exactly: the bootstrap law of a constant."""
        x = np.asarray(values, dtype=np.float64)
        if x.min() == x.max():
            return Interval(float(x[0]), float(x[0]), float(x[0]), exact=True).as_dict()
        return self.interval(x)

    def difference(self, a: Sequence[float], b: Sequence[float]) -> IntervalEntry:
        return paired_difference(
            a, b, resamples=self.resamples, level=self.level, seed=self.seed
        ).as_dict()


def summarize(
    records: Sequence[Record],
    methods: Sequence[MethodEntry],
    problem_ids: Sequence[str],
    *,
    budget: int,
    budgets: Sequence[int] | None = None,
    reference: str | None = None,
    resamples: int = RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = 0,
    unit: str = "passes",
) -> Results:
    """The content of results.json. Deterministic: no timings, records in problem order.

    `methods` are the method entries of the manifest (id, family, spec, ceiling, cost,
    budgets, and `capped` and `flops` where the manifest has them). `budgets` are the run's
    budgets (default `[budget]`); a method planned at several appears once per budget, budget
    by budget, with the same numbers but its share of that budget. A method entry without
    `budgets` is planned at `budget`. `unit`: the budgets' (the manifest's `budget_unit`),
    `passes` or `flops`; a share of a budget is of what the method plans in it.
    """
    order = {pid: i for i, pid in enumerate(problem_ids)}
    by_method: dict[str, dict[str, Record]] = {m["id"]: {} for m in methods}
    for rec in records:
        if rec["method"] in by_method and rec["problem"] in order:
            by_method[rec["method"]][rec["problem"]] = rec
    ids = [m["id"] for m in methods]
    if reference is None:
        reference = "Vanilla" if "Vanilla" in ids else (ids[0] if ids else None)
    ref_records = by_method.get(reference, {}) if reference is not None else {}
    boot = _Bootstrap(resamples, level, seed)
    planned_at = {m["id"]: m.get("budgets") or [budget] for m in methods}
    entries: dict[str, MethodResult] = {}
    for m in methods:
        recs = sorted(by_method[m["id"]].values(), key=lambda r: order[r["problem"]])
        entry = _method_result(m, recs, min(planned_at[m["id"]]), boot, unit)
        pools = [r["candidates"] for r in recs]
        if pools and max(len(p) for p in pools) > 1:
            entry["pool"] = _pool_entry(pools, boot)
        if reference is not None and m["id"] != reference:
            delta = _delta(recs, ref_records, boot)
            if delta is not None:
                entry["delta_vs_reference"] = delta
        entries[m["id"]] = entry
    run_budgets = sorted(budgets or [budget])
    out = [
        _at_budget(entries[m["id"]], b, unit)
        for b in run_budgets
        for m in methods
        if b in planned_at[m["id"]]
    ]
    return Results(
        schema_version=SCHEMA_VERSION,
        budget=budget,
        budgets=run_budgets,
        budget_unit=unit,
        reference=reference,
        resamples=resamples,
        level=level,
        methods=out,
    )


def _method_result(
    m: MethodEntry, recs: list[Record], budget: int, boot: _Bootstrap, unit: str
) -> MethodResult:
    """A method's accuracy and costs (no pool measures, no difference yet)."""
    correct = [float(r["correct"]) for r in recs]
    declared: Mapping[str, Any] = m  # `capped` and `flops`: absent from older manifests
    passes = [r["ledger"]["total_passes"] for r in recs]
    flops = [r["ledger"].get("total_flops") for r in recs]  # None: unknown, or not recorded
    planned = sum(m["cost"].values())
    flops_planned = declared.get("flops")  # per problem, priced when the run was planned
    result = MethodResult(
        id=m["id"],
        family=m.get("family"),
        spec=m["spec"],
        ceiling=m["ceiling"],
        budget=budget,
        problems=len(recs),
        accuracy=boot.interval(correct) if recs else None,
        passes_per_problem=float(np.mean(passes)) if recs else None,
        flops_per_problem=(
            float(np.mean(np.asarray(flops, np.float64))) if recs and None not in flops else None
        ),
        spend=_spend(passes, flops, boot) if recs else None,
        planned_passes=planned,
        planned_flops=flops_planned,
        share_of_budget=_share(planned, flops_planned, budget, unit),
        capped=bool(declared.get("capped", False)),
    )
    if declared.get("approximate"):
        result["approximate"] = True  # decoded with an approximate cache
    return result


def _spend(passes: list[int], flops: list[int | None], boot: _Bootstrap) -> SpendEntry:
    """Passes and FLOPs per problem, measured: the means of the records' ledgers with their
    intervals over problems; FLOPs None when a record's are unknown."""
    known = [f for f in flops if f is not None]
    return SpendEntry(
        passes=boot.mean(passes),
        flops=boot.mean(known) if len(known) == len(flops) else None,
    )


def _share(passes: int, flops: int | None, budget: int, unit: str) -> float:
    """The share of `budget` a method plans to spend, in the budget's `unit` (unknown FLOPs:
    none)."""
    planned = passes if unit == "passes" else flops or 0
    return round(planned / budget, 6)


def _at_budget(entry: MethodResult, budget: int, unit: str) -> MethodResult:
    """A method's entry at one of its budgets: the same numbers, its share of that budget."""
    out = MethodResult(**entry)  # a copy, keys in the same order
    out["budget"] = budget
    out["share_of_budget"] = _share(
        entry["planned_passes"], entry.get("planned_flops"), budget, unit
    )
    return out


def _pool_entry(pools: list[list[CandidateRecord]], boot: _Bootstrap) -> PoolEntry:
    """Pool diagnostics over the problems: size, oracle, distinct answers, entropy."""
    answer_keys = [[c["key"] if c["valid"] else None for c in p] for p in pools]
    oracle = [float(any(c["correct"] for c in p)) for p in pools]
    return PoolEntry(
        size=round(float(np.mean([len(p) for p in pools])), 6),
        oracle=boot.interval(oracle),
        unique_answers=round(float(np.mean([unique_answers(k) for k in answer_keys])), 6),
        entropy_bits=round(float(np.mean([entropy_bits(k) for k in answer_keys])), 6),
    )


def _delta(
    recs: list[Record], ref_records: dict[str, Record], boot: _Bootstrap
) -> DeltaEntry | None:
    """The paired difference to the reference over the problems both have; None if none."""
    common = [r for r in recs if r["problem"] in ref_records]
    if not common:
        return None
    a = [float(r["correct"]) for r in common]
    b = [float(ref_records[r["problem"]]["correct"]) for r in common]
    return DeltaEntry(**boot.difference(a, b), problems=len(common))


def summarize_records(
    rundir: RunDir,
    manifest: dict[str, Any],
    problem_ids: list[str],
    *,
    reference: str | None,
    resamples: int,
) -> Results:
    """The results of every record in `rundir` so far (nothing written)."""
    task, budgets = manifest["task"], manifest["budgets"]
    results = summarize(
        rundir.read_records(),
        manifest["methods"],
        problem_ids,
        budget=manifest["budget"],
        budgets=budgets,
        reference=reference,
        resamples=resamples,
        seed=manifest["sampling"]["seed"],
        unit=manifest.get("budget_unit", "passes"),
    )
    results["task"] = {"name": task["name"], "split": task["split"], "problems": len(problem_ids)}
    results["steps"] = manifest["sampling"]["total_steps"]
    return results
