"""A run directory's summary: results.json and leaderboard.md from every record in it."""

from __future__ import annotations

from typing import Any

from dllmbench.analysis.leaderboard import markdown
from dllmbench.analysis.results import summarize_records
from dllmbench.core.flops import format_flops
from dllmbench.core.schema import Results
from dllmbench.storage.rundir import RunDir


def summarize_run(
    rundir: RunDir,
    manifest: dict[str, Any],
    problem_ids: list[str],
    *,
    reference: str | None,
    resamples: int,
) -> Results:
    """Summarise every record of the run in `rundir` (its `manifest`, the problems in order)
    with `reference` and `resamples`, and write results.json and leaderboard.md."""
    results = summarize_records(
        rundir, manifest, problem_ids, reference=reference, resamples=resamples
    )
    rundir.write_results(results, markdown(results, title(manifest, len(problem_ids))))
    return results


def title(manifest: dict[str, Any], problems: int) -> str:
    task, budgets = manifest["task"], manifest["budgets"]
    if manifest.get("budget_unit") == "flops":
        budgets = [format_flops(b) for b in budgets]
    at = f"budgets {', '.join(map(str, budgets))}" if len(budgets) > 1 else f"budget {budgets[0]}"
    backbone = manifest["backbone"]["name"]
    return f"{task['name']} ({task['split']}, {problems} problems) · {backbone} · {at}"
