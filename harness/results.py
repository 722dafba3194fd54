"""From records to results: accuracy with CIs, paired differences, pool diagnostics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dllmbench.stats import Interval, bootstrap_ci, entropy_bits, paired_difference, unique_answers

SCHEMA_VERSION = 1


def summarize(
    records: Sequence[dict[str, Any]],
    methods: Sequence[dict[str, Any]],
    problem_ids: Sequence[str],
    *,
    budget: int,
    reference: str | None = None,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """The content of results.json. Deterministic: no timings, records in problem order.

    `methods` are the method descriptions of the manifest (id, spec, ceiling, cost).
    """
    order = {pid: i for i, pid in enumerate(problem_ids)}
    by_method: dict[str, dict[str, dict[str, Any]]] = {m["id"]: {} for m in methods}
    for rec in records:
        if rec["method"] in by_method and rec["problem"] in order:
            by_method[rec["method"]][rec["problem"]] = rec
    ids = [m["id"] for m in methods]
    if reference is None:
        reference = "Vanilla" if "Vanilla" in ids else (ids[0] if ids else None)
    ref_records = by_method.get(reference, {})

    out = []
    for m in methods:
        recs = sorted(by_method[m["id"]].values(), key=lambda r: order[r["problem"]])
        correct = np.array([float(r["correct"]) for r in recs])
        entry: dict[str, Any] = {
            "id": m["id"],
            "family": m.get("family"),
            "spec": m["spec"],
            "ceiling": m["ceiling"],
            "problems": len(recs),
            "accuracy": bootstrap_ci(correct, resamples=resamples, level=level, seed=seed).as_dict()
            if recs
            else None,
            "passes_per_problem": float(np.mean([r["ledger"]["total_passes"] for r in recs]))
            if recs
            else None,
            "planned_passes": sum(m["cost"].values()),
            "share_of_budget": round(sum(m["cost"].values()) / budget, 6),
        }
        pools = [r["candidates"] for r in recs]
        if pools and max(len(p) for p in pools) > 1:
            keys = [[c["key"] if c["valid"] else None for c in p] for p in pools]
            entry["pool"] = {
                "size": float(np.mean([len(p) for p in pools])),
                "oracle": bootstrap_ci(
                    [float(any(c["correct"] for c in p)) for p in pools],
                    resamples=resamples,
                    level=level,
                    seed=seed,
                ).as_dict(),
                "unique_answers": float(np.mean([unique_answers(k) for k in keys])),
                "entropy_bits": round(float(np.mean([entropy_bits(k) for k in keys])), 6),
            }
        if reference is not None and m["id"] != reference:
            common = [r for r in recs if r["problem"] in ref_records]
            if common:
                a = [float(r["correct"]) for r in common]
                b = [float(ref_records[r["problem"]]["correct"]) for r in common]
                diff = paired_difference(a, b, resamples=resamples, level=level, seed=seed)
                entry["delta_vs_reference"] = {**diff.as_dict(), "problems": len(common)}
        out.append(entry)
    return {
        "schema_version": SCHEMA_VERSION,
        "budget": budget,
        "reference": reference,
        "resamples": resamples,
        "level": level,
        "methods": out,
    }


def interval(d: dict[str, float]) -> Interval:
    return Interval(d["value"], d["low"], d["high"])
