"""`dllmbench report`: the paper's tables and figures from finished run directories.

`build_report(paths)` reads one or more run directories of one protocol and returns the
content of `report.json` (a `schema.Report`): the accuracy of every method at every budget
(copied from each run's `results.json`, so the numbers are the run's own), the pooled
independent curves (`pooled.pooled_curves` on the largest independent pool, every k), and
the diagnostics of `diagnostics` on the evidence `evidence` reads from the records.
`markdown(report)` renders `report.md` from it and `figures.render` the PNG figures, so
every number in the Markdown and the figures is in `report.json`.

A method whose records do not hold what its strategy declared (`evidence.unreadable`: cuts or
checkpoints not in their layout, a last cut whose `kept` does not give the candidates'
lineages) is left out of the pooled curves and the diagnostics, and listed in `skipped` with
why; its accuracy stays in `methods`, and the rest of the report is written.

Several run directories combine when they share a protocol (`PROTOCOL`: task and problems,
sampling and seed, backbone and scorers with their weights' hashes); their methods are listed
run by run, and a (method, budget) already listed by an earlier run is not repeated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllmbench.analysis import evidence
from dllmbench.analysis.agreement import agreement
from dllmbench.analysis.controls import PAPER
from dllmbench.analysis.controls_slicing import select_slicing
from dllmbench.analysis.report_markdown import markdown
from dllmbench.analysis.report_sections import (
    Options,
    budget_unit,
    budgets_of,
    diagnostics_section,
    methods_table,
    pooled_section,
)
from dllmbench.analysis.results import summarize_records
from dllmbench.core.errors import UserError
from dllmbench.core.schema import (
    REPORT_SCHEMA_VERSION,
    Controls,
    Report,
    SkippedMethod,
)
from dllmbench.core.shape import require_manifest
from dllmbench.storage.rundir import RunDir, manifest_differences

# the manifest keys that must match for run directories to combine
PROTOCOL = ("task", "sampling", "backbone", "scorers")


# -- loading and combining ------------------------------------------------------------------


def check_finished(path: Path) -> None:
    """One line when `path` is not a finished run directory."""
    if not path.is_dir():
        raise UserError(f"{path} is not a directory; give a run directory written by dllmbench run")
    if not (path / "manifest.json").is_file():
        raise UserError(
            f"{path} is not a run directory (no manifest.json); give a directory written by "
            "dllmbench run"
        )
    if not (path / "results.json").is_file():
        shares = any(path.glob("samples.shard-*-of-*.jsonl"))
        how = (
            f"merging its shares with dllmbench merge {path} (run any missing share first)"
            if shares
            else "running the same dllmbench run command again"
        )
        raise UserError(f"{path} is not a finished run (no results.json); finish it by {how}")


def _check_complete(run: evidence.RunData) -> None:
    """Every planned method has a record for every problem of the run (each problem id the
    manifest lists, as `merge` checks; their count in a run that lists none), and every
    record is of the run (`RunDir.refuse_strays`, as `merge` checks)."""
    RunDir(run.path).refuse_strays(run.records, run.manifest)
    ids = run.manifest["task"].get("problem_ids")
    if ids is None:
        done = sum(len(recs) for recs in run.by_method.values())
        planned = int(run.manifest["task"]["problems"]) * len(run.by_method)
    else:
        done = sum(str(p) in recs for recs in run.by_method.values() for p in ids)
        planned = len(ids) * len(run.by_method)
    if done < planned:
        raise UserError(
            f"{run.path} is not a finished run ({done} of {planned} records); finish it by "
            "running the same dllmbench run command again"
        )


def _check_results(run: evidence.RunData) -> None:
    """results.json is what `merge` writes from the records (at its own reference and
    resamples): one line when it is not, a file edited to say more than the records do."""
    ids = run.manifest["task"].get("problem_ids")
    if ids is None or run.results is None:
        return
    results = run.results
    fresh = summarize_records(
        RunDir(run.path),
        run.manifest,
        [str(p) for p in ids],
        reference=results.get("reference"),
        resamples=results["resamples"],
    )
    fresh = json.loads(json.dumps(fresh))
    differ = sorted(k for k in {*fresh, *results} if fresh.get(k) != results.get(k))
    if differ:
        raise UserError(
            f"{run.path / 'results.json'} is not what its records give ({', '.join(differ)} "
            f"differ); rewrite it from the records with: dllmbench merge {run.path}"
        )


def protocol_mismatch(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first protocol key on which two manifests differ (`key: old → new`), or None: a
    plugin's name before its options (another backbone, not its first option that differs)."""
    diffs = manifest_differences({k: a.get(k) for k in PROTOCOL}, {k: b.get(k) for k in PROTOCOL})
    named = [d for d in diffs if d.split(":", 1)[0] in {f"{k}.name" for k in PROTOCOL}]
    return (named or diffs or [None])[0]


def load_runs(paths: Sequence[str | Path]) -> list[evidence.RunData]:
    """The finished runs at `paths`, refused with one line if one is unfinished or if their
    protocols differ."""
    runs = []
    for raw in paths:
        path = Path(raw)
        check_finished(path)
        run = evidence.load_run(path)
        require_manifest(run.manifest, path / "manifest.json")
        _check_complete(run)
        _check_results(run)
        if runs:
            diff = protocol_mismatch(runs[0].manifest, run.manifest)
            if diff is None and budget_unit(run) != budget_unit(runs[0]):
                diff = f"budgets in {budget_unit(runs[0])} → in {budget_unit(run)}"
            if diff is not None:
                raise UserError(
                    f"cannot combine {runs[0].path} and {path}: their protocols differ "
                    f"({diff}); report them separately"
                )
        runs.append(run)
    return runs


# -- the report -----------------------------------------------------------------------------


def readable(
    runs: Sequence[evidence.RunData],
) -> tuple[list[evidence.RunData], list[SkippedMethod]]:
    """Each run without the methods whose declared evidence cannot be read
    (`evidence.unreadable`), and those methods with why."""
    out, skipped = [], []
    for index, run in enumerate(runs):
        bad = evidence.unreadable(run)
        for mid, reason in bad.items():
            strategy = run.methods[mid]["spec"].split("+")[0]
            skipped.append(SkippedMethod(run=index, method=mid, strategy=strategy, reason=reason))
        out.append(evidence.leave_out(run, bad))
    return out, skipped


def skip_line(entry: SkippedMethod) -> str:
    """The one line saying a method was left out of the report's analyses, and why."""
    return (
        f"report: method {entry['method']!r} (strategy {entry['strategy']!r}) left out of the "
        f"pooled curves and diagnostics: {entry['reason']}"
    )


def load_controls(folder: str | Path, run: evidence.RunData) -> Controls:
    """controls.json of `dllmbench diagnose` in `folder`, refused with one line unless its
    collection was sampled as the run was (task, backbone weights, T, generated length and
    prompt) and each scorer it shares a name with the run has the run's weights."""
    file = Path(folder) / "controls.json"
    if not file.is_file():
        raise UserError(
            f"{folder} holds no controls.json; make it with dllmbench diagnose COLLECTION "
            f"--out {folder}"
        )
    try:
        controls = json.loads(file.read_text(encoding="utf-8"))
        collection = controls["collection"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{file} cannot be read ({exc!r}); make it again with diagnose") from exc
    manifest = run.manifest
    checks = {
        "task": (collection["task"]["name"], manifest["task"]["name"]),
        "task options": (collection["task"]["config"], manifest["task"]["config"]),
        "backbone": (collection["backbone"]["name"], manifest["backbone"]["name"]),
        "backbone weights": (
            controls.get("backbone_weights"),
            manifest["backbone"].get("weights"),
        ),
    }
    for key in ("total_steps", "gen_length", "prompt_style"):
        checks[key] = (collection["sampling"][key], manifest["sampling"][key])
    for name, entry in controls["scorers"].items():
        if name in manifest.get("scorers", {}):
            checks[f"scorer {name}"] = (
                entry.get("weights"),
                manifest["scorers"][name].get("weights"),
            )
    for what, (theirs, ours) in checks.items():
        if theirs != ours:
            if isinstance(theirs, dict) and isinstance(ours, dict):  # the keys that differ
                shown = ", ".join(
                    f"{k}: {theirs.get(k)!r} against {ours.get(k)!r}"
                    for k in sorted(set(theirs) | set(ours), key=str)
                    if theirs.get(k) != ours.get(k)
                )
            else:
                shown = f"{theirs!r} against {ours!r}"
            raise UserError(
                f"the controls in {folder} do not fit {run.path}: the collection's and the "
                f"run's {what} differ ({shown}); collect and diagnose as the run was sampled"
            )
    return controls


def build_report(
    paths: Sequence[str | Path],
    options: Options | None = None,
    controls: str | Path | None = None,
    exact: str | Path | None = None,
    slicing: str = PAPER,
    say: Callable[[str], None] | None = None,
) -> Report:
    """The content of report.json for the run directories at `paths`, with the scorer
    controls in the folder `controls` (dllmbench diagnose) if given, their snapshot
    `slicing` in front, and the first run's answers beside those of the exactly decoded run
    `exact` if given. `say` hears the name of each stage as it begins."""
    options = options or Options()
    tell = say or _quiet
    tell(f"reading {len(paths)} run director{'y' if len(paths) == 1 else 'ies'}")
    runs = load_runs(paths)
    read, skipped = readable(runs)  # the pooled curves and diagnostics read the evidence
    first = runs[0]
    seed = int(first.manifest["sampling"]["seed"])
    resamples = int(first.results["resamples"])
    level = float(first.results["level"])
    task = first.results.get("task") or {
        "name": first.manifest["task"]["name"],
        "split": first.manifest["task"]["split"],
        "problems": first.manifest["task"]["problems"],
    }
    tell("the pooled curves (most of a report's time: every k of the largest pool)")
    pooled = pooled_section(read, seed, resamples, level, options)
    tell("the diagnostics")
    diagnostics = diagnostics_section(read, seed, resamples, level)
    return Report(
        schema_version=REPORT_SCHEMA_VERSION,
        task=task,
        backbone=first.manifest["backbone"]["name"],
        steps=int(first.manifest["sampling"]["total_steps"]),
        seed=seed,
        level=level,
        resamples=resamples,
        reference=first.results.get("reference"),
        runs=[{"path": str(r.path), "budgets": budgets_of([r])} for r in runs],
        budgets=budgets_of(runs),
        budget_unit=budget_unit(first),
        methods=methods_table(runs),
        pooled=pooled,
        diagnostics=diagnostics,
        skipped=skipped,
        controls=None
        if controls is None
        else select_slicing(load_controls(controls, first), slicing, controls),
        agreement=None if exact is None else agreement(first, load_runs([exact])[0]),
        figures={},
    )


def _quiet(stage: str) -> None:
    """Hears nothing: a report built without `say`."""


def write_json(path: Path, report: Report) -> None:
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Written:
    out: Path
    files: tuple[str, ...]
    report: Report


def write_report(
    paths: Sequence[str | Path],
    out: str | Path | None = None,
    options: Options | None = None,
    controls: str | Path | None = None,
    exact: str | Path | None = None,
    slicing: str = PAPER,
    say: Callable[[str], None] | None = None,
) -> Written:
    """Build the report of the runs at `paths` (with the scorer controls in `controls`) and
    write report.json, report.md and the figures into `out` (default: RUN_DIR/report of the
    first run); `say` hears the name of each stage as it begins."""
    from dllmbench.analysis import figures

    report = build_report(paths, options, controls, exact, slicing, say)
    folder = Path(out) if out is not None else Path(paths[0]) / "report"
    try:
        (say or _quiet)("the figures")
        folder.mkdir(parents=True, exist_ok=True)
        report["figures"] = figures.render(report, folder)
        write_json(folder / "report.json", report)
        (folder / "report.md").write_text(markdown(report), encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot write the report to {folder} ({exc.strerror}); choose another --out"
        ) from exc
    files = ("report.md", "report.json", *report["figures"].values())
    return Written(folder, files, report)
