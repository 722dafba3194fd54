"""`dllmbench report`: the paper's tables and figures from finished run directories.

`build_report(paths)` reads one or more run directories of one protocol and returns the
content of `report.json` (a `schema.Report`): the accuracy of every method at every budget
(copied from each run's `results.json`, so the numbers are the run's own), the pooled
independent curves (`pooled.pooled_curves` on the largest independent pool, every k), and
the diagnostics of `diagnostics` on the evidence `evidence` reads from the records.
`markdown(report)` renders `report.md` from it and `figures.render` the PNG figures, so
every number in the Markdown and the figures is in `report.json`.

Several run directories combine when they share a protocol (`PROTOCOL`: task and problems,
sampling and seed, backbone and scorers with their weights' hashes); their methods are listed
run by run, and a (method, budget) already listed by an earlier run is not repeated.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dllmbench.analysis import diagnostics, evidence, pooled
from dllmbench.core.errors import UserError
from dllmbench.core.schema import (
    REPORT_SCHEMA_VERSION,
    BucketEntry,
    DiagnosticsSection,
    DiscriminationEntry,
    IntervalEntry,
    KendallEntry,
    PoolDiversityEntry,
    PooledAgreement,
    PooledCurve,
    PooledSection,
    RemovalRiskEntry,
    Report,
    ReportMethod,
    ScorerSwapEntry,
    SMCEntry,
)
from dllmbench.storage.rundir import manifest_differences

# the manifest keys that must match for run directories to combine
PROTOCOL = ("task", "sampling", "backbone", "scorers")
DIGITS = 6
# Majority@k by answer counts only up to this many count vectors per (problem, k): then it
# costs no more than the Monte-Carlo pass it replaces (about 2000 vectors per 10,000 subsets,
# measured on the demo's pools of 34); past it the keyed Monte-Carlo estimate stands
COUNT_LIMIT = 2_000


@dataclass(frozen=True)
class Options:
    """Knobs of the pooled estimators (see `pooled.pooled_curves`)."""

    samples: int = pooled.SAMPLES
    exact_limit: int = pooled.EXACT_LIMIT
    count_limit: int = COUNT_LIMIT


def interval(value: pooled.Interval | None) -> IntervalEntry | None:
    if value is None:
        return None
    return IntervalEntry(
        value=round(value.value, DIGITS),
        low=round(value.low, DIGITS),
        high=round(value.high, DIGITS),
    )


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
        raise UserError(
            f"{path} is not a finished run (no results.json); finish it by running the same "
            "dllmbench run command again"
        )


def _check_complete(run: evidence.RunData) -> None:
    """Every planned method has a record for every problem of the run."""
    problems = int(run.manifest["task"]["problems"])
    done = sum(len(recs) for recs in run.by_method.values())
    planned = problems * len(run.by_method)
    if done < planned:
        raise UserError(
            f"{run.path} is not a finished run ({done} of {planned} records); finish it by "
            "running the same dllmbench run command again"
        )


def protocol_mismatch(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first protocol key on which two manifests differ (`key: old → new`), or None."""
    diffs = manifest_differences({k: a.get(k) for k in PROTOCOL}, {k: b.get(k) for k in PROTOCOL})
    return diffs[0] if diffs else None


def load_runs(paths: Sequence[str | Path]) -> list[evidence.RunData]:
    """The finished runs at `paths`, refused with one line if one is unfinished or if their
    protocols differ."""
    runs = []
    for raw in paths:
        path = Path(raw)
        check_finished(path)
        run = evidence.load_run(path)
        _check_complete(run)
        if runs:
            diff = protocol_mismatch(runs[0].manifest, run.manifest)
            if diff is not None:
                raise UserError(
                    f"cannot combine {runs[0].path} and {path}: their protocols differ "
                    f"({diff}); report them separately"
                )
        runs.append(run)
    return runs


# -- accuracy by method and budget ----------------------------------------------------------


def method_budget(results: dict[str, Any], entry: dict[str, Any]) -> int:
    """The budget a results.json method entry belongs to (a single-budget run: the run's)."""
    return int(entry.get("budget", results["budget"]))


def methods_table(runs: Sequence[evidence.RunData]) -> list[ReportMethod]:
    """Every results.json method entry with its budget and run index; a (method, budget)
    an earlier run already listed is left out."""
    out: list[ReportMethod] = []
    seen: set[tuple[str, int]] = set()
    for index, run in enumerate(runs):
        for entry in run.results["methods"]:
            budget = method_budget(run.results, entry)
            if (entry["id"], budget) in seen:
                continue
            seen.add((entry["id"], budget))
            out.append(ReportMethod(**{**entry, "budget": budget, "run": index}))
    return out


def budgets_of(runs: Sequence[evidence.RunData]) -> list[int]:
    found: set[int] = set()
    for run in runs:
        found.update(int(b) for b in run.results.get("budgets", [run.results["budget"]]))
    return sorted(found)


# -- pooled independent curves --------------------------------------------------------------


def selector_scorers(selector: str) -> tuple[str, ...]:
    """The scorers a pooled selector reads: `argmax:s` and `weighted_majority:s` read s."""
    family, _, scorer = selector.partition(":")
    return (scorer,) if family in ("argmax", "weighted_majority") and scorer else ()


@dataclass(frozen=True)
class CostModel:
    """Passes per problem of an independent method of k candidates, from the pool's methods'
    declared costs (`Method.cost`, in the manifest): each kind is linear in the pool size n
    (denoising n·T·passes-per-step, a scorer n passes), so one candidate costs cost[kind] / n.
    """

    per_candidate: dict[str, float]  # kind → passes per candidate

    def passes(self, selector: str, k: int) -> int:
        kinds = ["denoise", *(f"score:{s}" for s in selector_scorers(selector))]
        return round(k * sum(self.per_candidate.get(kind, 0.0) for kind in kinds))


def cost_model(manifest: dict[str, Any], pool: str) -> CostModel:
    """Per-candidate passes of each kind, from the manifest's methods of the pool `pool`."""
    per: dict[str, float] = {}
    for m in manifest["methods"]:
        n = int(m["strategy"]["config"].get("n", 0))
        if evidence.pool_key(m) != pool or n < 1:
            continue
        for kind, passes in m.get("cost", {}).items():
            per.setdefault(kind, passes / n)
    return CostModel(per)


def _largest_pool(runs: Sequence[evidence.RunData]) -> tuple[int, str, evidence.PoolSet] | None:
    """(run index, pool key, pools) of the largest independent pool of size ≥ 2."""
    best = None
    for index, run in enumerate(runs):
        for key, pool_set in evidence.independent_pools(run).items():
            size = min(len(p) for p in pool_set.pools)
            if size >= 2 and (best is None or size > best[0]):
                best = (size, index, key, pool_set)
    return None if best is None else best[1:]


def scored_prefix(pool_set: evidence.PoolSet, scorer: str) -> int:
    """The largest n such that the first n candidates of every pool carry `scorer`."""
    sizes = []
    for pool in pool_set.pools:
        n = 0
        while n < len(pool) and scorer in pool[n].scores:
            n += 1
        sizes.append(n)
    return min(sizes)


def _curve_groups(pool_set: evidence.PoolSet) -> dict[int, list[str]]:
    """Pool size → scorers, one pooled_curves call each: the whole pool with the scorers
    every candidate carries, and each other scorer on the largest prefix that carries it."""
    size = min(len(p) for p in pool_set.pools)
    groups: dict[int, list[str]] = {size: []}
    scorers = sorted({s for pool in pool_set.pools for c in pool for s in c.scores})
    for scorer in scorers:
        n = scored_prefix(pool_set, scorer)
        if n >= 1:
            groups.setdefault(n, []).append(scorer)
    return groups


Curves = dict[str, tuple[int, list[pooled.PooledPoint], list[pooled.Interval]]]


def _curves(
    pool_set: evidence.PoolSet, seed: int, resamples: int, level: float, options: Options
) -> Curves:
    """selector → (pool size, points at k = 1..size, bootstrap intervals). The scorer-less
    selectors come from the whole pool; on a shorter prefix only its scorers' selectors."""
    full = min(len(p) for p in pool_set.pools)
    out: Curves = {}
    for size, scorers in _curve_groups(pool_set).items():
        curves = pooled.pooled_curves(
            pool_set.prefix(size).pools,
            seed=seed,
            scorers=scorers,
            exact_limit=options.exact_limit,
            count_limit=options.count_limit if size == full else 0,
            samples=options.samples,
        )
        for selector, points in curves.items():
            if size != full and not set(selector_scorers(selector)) & set(scorers):
                continue
            boot = pooled.curve_intervals(points, resamples=resamples, level=level, seed=seed)
            out[selector] = (size, points, boot)
    return out


def _agreement(
    run: evidence.RunData,
    pool: str,
    curves: Curves,
    problems: Sequence[str],
) -> list[PooledAgreement]:
    """Each planned method of the pool whose selector is a deterministic pooled selector and
    whose size is the curve's pool size: the pooled value at k = n against the run's."""
    out = []
    for m in run.manifest["methods"]:
        if evidence.pool_key(m) != pool or m["selector"]["name"] == "random":
            continue
        selector = pooled_selector(m["selector"])
        n = int(m["strategy"]["config"].get("n", 0))
        if selector not in curves or curves[selector][0] != n:
            continue
        point = curves[selector][1][n - 1]
        by_problem = {
            r["problem"]: float(r["correct"]) for r in run.records if r["method"] == m["id"]
        }
        ran = [by_problem.get(p) for p in problems]
        out.append(
            PooledAgreement(
                method=m["id"],
                selector=selector,
                k=n,
                pooled=round(point.mean, DIGITS),
                run=round(float(np.mean([x or 0.0 for x in ran])), DIGITS),
                equal=list(point.per_problem) == ran,
            )
        )
    return out


def pooled_selector(selector: dict[str, Any]) -> str | None:
    """The pooled selector name of a manifest selector entry; None when it has none."""
    name, config = selector["name"], selector.get("config", {})
    if name in ("oracle", "random", "majority"):
        return name
    if name == "argmax":
        return f"argmax:{config.get('scorer')}"
    if name == "weighted_majority":
        return f"weighted_majority:{config.get('by')}"
    return None


def pooled_section(
    runs: Sequence[evidence.RunData], seed: int, resamples: int, level: float, options: Options
) -> PooledSection | None:
    """The pooled curves of the largest independent pool, with passes per point and the
    agreement with the run's methods at k = n; None when no pool has two candidates."""
    found = _largest_pool(runs)
    if found is None:
        return None
    index, key, pool_set = found
    run = runs[index]
    curves = _curves(pool_set, seed, resamples, level, options)
    costs = cost_model(run.manifest, key)
    out_curves = [
        PooledCurve(
            selector=selector,
            pool_size=size,
            points=[
                {
                    "k": p.k,
                    "passes": costs.passes(selector, p.k),
                    "accuracy": interval(ci),
                    "exact": p.exact,
                    "stderr": round(p.stderr, DIGITS),
                }
                for p, ci in zip(points, boot, strict=True)
            ],
        )
        for selector, (size, points, boot) in curves.items()
    ]
    return PooledSection(
        pool=key,
        run=index,
        size=min(len(p) for p in pool_set.pools),
        problems=len(pool_set.pools),
        samples=options.samples,
        exact_limit=options.exact_limit,
        count_limit=options.count_limit,
        curves=out_curves,
        agreement=_agreement(run, key, curves, pool_set.problems),
    )


# -- diagnostics ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Boot:
    """The bootstrap settings every interval of a report shares (the runs' own)."""

    seed: int
    resamples: int
    level: float

    def interval(self, values: Sequence[float]) -> IntervalEntry | None:
        opts = {"resamples": self.resamples, "level": self.level, "seed": self.seed}
        return interval(pooled.bootstrap_interval(values, **opts))


def merge_new(lists: Sequence[Sequence[Any]]) -> list[Any]:
    """The items of the first list, then of each later list what the earlier lists do not
    already hold (as multisets): a strategy run two run directories share counts once."""
    out: list[Any] = []
    for items in lists:
        have = Counter(out)
        for item in items:
            if have[item] > 0:
                have[item] -= 1
            else:
                out.append(item)
    return out


def _bucket(b: diagnostics.BucketAUC) -> BucketEntry:
    return BucketEntry(
        low=b.low,
        high=b.high,
        n=b.n,
        positives=b.positives,
        auc=None if b.auc is None else round(b.auc, DIGITS),
        interval=interval(b.interval),
    )


def _discrimination(
    scorer: str, kind: str, states: list[diagnostics.ScoredState], boot: Boot
) -> DiscriminationEntry:
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    tau = diagnostics.within_problem_kendall(states)
    return DiscriminationEntry(
        scorer=scorer,
        states=kind,
        count=len(states),
        positives=sum(bool(s.label) for s in states),
        roc_auc_by_mask=[_bucket(b) for b in diagnostics.auc_by_mask_bucket(states, **opts)],
        kendall_tau=KendallEntry(
            mean=None if tau.mean is None else round(tau.mean, DIGITS),
            problems=tau.problems,
            undefined=tau.undefined,
        ),
    )


def discrimination(runs: Sequence[evidence.RunData], boot: Boot) -> list[DiscriminationEntry]:
    """Each scorer's ROC-AUC by mask bucket and within-problem Kendall τ, on the guided runs'
    scored states and on the final candidates of the independent pools."""
    out = []
    for scorer in sorted(runs[0].manifest.get("scorers") or {}):
        guided = merge_new([evidence.scored_states(run, scorer=scorer) for run in runs])
        final = merge_new([evidence.final_states(run, scorer) for run in runs])
        for kind, states in (("guided", guided), ("final", final)):
            if states:
                out.append(_discrimination(scorer, kind, states, boot))
    return out


def _shared_methods(
    runs: Sequence[evidence.RunData], strategies: Sequence[str]
) -> Iterator[tuple[evidence.RunData, str, list[str]]]:
    """(run, pool key, method ids) of each strategy run of `strategies`, once across runs."""
    seen: set[str] = set()
    for run in runs:
        groups: dict[str, list[str]] = {}
        for mid, entry in run.methods.items():
            if entry["strategy"]["name"] in strategies:
                groups.setdefault(evidence.pool_key(entry), []).append(mid)
        for key, mids in groups.items():
            if key not in seen:
                seen.add(key)
                yield run, key, mids


def _diversity(
    name: str, kind: str, mids: list[str], pool_set: evidence.PoolSet, boot: Boot
) -> PoolDiversityEntry:
    per = diagnostics.pool_diversity(pool_set.pools).per_problem
    return PoolDiversityEntry(
        pool=name,
        kind=kind,
        methods=mids,
        size=min(len(p) for p in pool_set.pools),
        problems=len(per),
        oracle=boot.interval([p.oracle for p in per]),
        unique_answers=boot.interval([p.unique_valid for p in per]),
        entropy_bits=boot.interval([p.entropy_bits for p in per]),
    )


def pools(runs: Sequence[evidence.RunData], boot: Boot) -> list[PoolDiversityEntry]:
    """Oracle@K, unique valid answers and answer entropy of every pool of two or more
    candidates (one per strategy spec: methods with one spec share a pool), independent and
    guided side by side."""
    out, seen = [], set()
    for run in runs:
        by_method = evidence.pools_by_method(run)
        groups: dict[str, list[str]] = {}
        for mid, entry in run.methods.items():
            groups.setdefault(entry["spec"].split("+")[0], []).append(mid)
        for name, mids in groups.items():
            pool_set = by_method[mids[0]]
            if name in seen or min((len(p) for p in pool_set.pools), default=0) < 2:
                continue
            seen.add(name)
            strategy = run.methods[mids[0]]["strategy"]["name"]
            kind = "independent" if strategy == "independent" else "guided"
            out.append(_diversity(name, kind, mids, pool_set, boot))
    return out


def removal(runs: Sequence[evidence.RunData]) -> list[RemovalRiskEntry]:
    """Removal risk of the first cut of each PRM-guided strategy run."""
    out = []
    for run, key, mids in _shared_methods(runs, ("prm_guided",)):
        events = evidence.pruning_events(run, method=mids[0])
        if not events:
            continue
        risk = diagnostics.removal_risk(events)
        rate = None if risk.rate is None else round(risk.rate, DIGITS)
        out.append(
            RemovalRiskEntry(
                pool=key,
                methods=mids,
                events=risk.events,
                at_risk=risk.at_risk,
                lost=risk.lost,
                rate=rate,
            )
        )
    return out


def _by_checkpoint(stats: Sequence[diagnostics.CheckpointStats], per_run: int) -> list[dict]:
    """Mean ESS before and after at each checkpoint index, over the problems."""
    if per_run < 1 or len(stats) % per_run:
        return []
    rows = [stats[j::per_run] for j in range(per_run)]
    return [
        {
            "index": j,
            "ess_before": round(float(np.mean([s.ess_before for s in row])), DIGITS),
            "ess_after": round(float(np.mean([s.ess_after for s in row])), DIGITS),
        }
        for j, row in enumerate(rows)
    ]


def _optional(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def smc(runs: Sequence[evidence.RunData]) -> list[SMCEntry]:
    """ESS before and after each checkpoint, β, resampling and ancestors of each SMC run."""
    out = []
    for run, key, mids in _shared_methods(runs, ("smc",)):
        checkpoints = evidence.smc_checkpoints(run, method=mids[0])
        if not checkpoints:
            continue
        summary = diagnostics.smc_diagnostics(checkpoints)
        config = run.methods[mids[0]]["strategy"]["config"]
        steps = int(run.manifest["sampling"]["total_steps"])
        per_run = -(-steps // int(config.get("every", steps))) - 1
        out.append(
            SMCEntry(
                pool=key,
                methods=mids,
                checkpoints=len(summary.checkpoints),
                ess_before=round(summary.mean_ess_before, DIGITS),
                ess_after=round(summary.mean_ess_after, DIGITS),
                resample_rate=round(summary.resample_rate, DIGITS),
                beta={
                    "mean": round(summary.beta_mean, DIGITS),
                    "min": round(summary.beta_min, DIGITS),
                    "max": round(summary.beta_max, DIGITS),
                },
                distinct_ancestors=_optional(summary.mean_distinct_ancestors),
                ancestor_perplexity=_optional(summary.mean_ancestor_perplexity),
                by_checkpoint=_by_checkpoint(summary.checkpoints, per_run),
            )
        )
    return out


def scorer_swap(runs: Sequence[evidence.RunData], boot: Boot) -> ScorerSwapEntry | None:
    """The largest independent pool prefix every scorer scored, reranked by each scorer and
    at random, with paired differences; None without a scored pool of two or more."""
    found = _largest_pool(runs)
    if found is None:
        return None
    _, key, pool_set = found
    scorers = sorted({s for pool in pool_set.pools for c in pool for s in c.scores})
    size = min((scored_prefix(pool_set, s) for s in scorers), default=0)
    if size < 2:
        return None
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    swap = diagnostics.scorer_swap(pool_set.prefix(size).pools, scorers, **opts)
    return ScorerSwapEntry(
        pool=key,
        size=size,
        accuracy={name: interval(ci) for name, ci in swap.accuracy.items()},
        differences=[{"a": a, "b": b, **interval(ci)} for (a, b), ci in swap.differences.items()],
    )


def diagnostics_section(
    runs: Sequence[evidence.RunData], seed: int, resamples: int, level: float
) -> DiagnosticsSection:
    boot = Boot(seed, resamples, level)
    return DiagnosticsSection(
        discrimination=discrimination(runs, boot),
        pools=pools(runs, boot),
        removal_risk=removal(runs),
        smc=smc(runs),
        scorer_swap=scorer_swap(runs, boot),
    )


# -- the report -----------------------------------------------------------------------------


def build_report(paths: Sequence[str | Path], options: Options | None = None) -> Report:
    """The content of report.json for the run directories at `paths`."""
    options = options or Options()
    runs = load_runs(paths)
    first = runs[0]
    seed = int(first.manifest["sampling"]["seed"])
    resamples = int(first.results["resamples"])
    level = float(first.results["level"])
    task = first.results.get("task") or {
        "name": first.manifest["task"]["name"],
        "split": first.manifest["task"]["split"],
        "problems": first.manifest["task"]["problems"],
    }
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
        methods=methods_table(runs),
        pooled=pooled_section(runs, seed, resamples, level, options),
        diagnostics=diagnostics_section(runs, seed, resamples, level),
        figures={},
    )


def write_json(path: Path, report: Report) -> None:
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")


# -- report.md ------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(entry: IntervalEntry | None) -> str:
    if entry is None:
        return "–"
    return f"{_pct(entry['value'])} [{_pct(entry['low'])}, {_pct(entry['high'])}]"


def _delta(entry: IntervalEntry | None) -> str:
    if entry is None:
        return "–"
    v, lo, hi = (100 * entry[k] for k in ("value", "low", "high"))
    return f"{v:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def _num(entry: IntervalEntry | None, digits: int = 2) -> str:
    if entry is None:
        return "–"
    return f"{entry['value']:.{digits}f} [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return [*lines, ""]


def md_methods(report: Report) -> list[str]:
    """One table per budget: every method's accuracy, Δ vs the reference, pool measures."""
    ref = report["reference"] or "reference"
    headers = (
        "method",
        "configuration",
        "passes",
        "acc % [95% CI]",
        f"Δ vs {ref} (pp)",
        "oracle %",
        "unique",
    )
    lines = ["## Accuracy by method and budget", ""]
    for budget in report["budgets"]:
        rows = []
        for m in (m for m in report["methods"] if m["budget"] == budget):
            pool = m.get("pool")
            name = f"{m['id']} (ceiling)" if m["ceiling"] else m["id"]
            passes = m["passes_per_problem"]
            rows.append(
                (
                    name,
                    f"`{m['spec']}`",
                    "–" if passes is None else f"{passes:.0f}",
                    _ci(m["accuracy"]),
                    _delta(m.get("delta_vs_reference")),
                    _pct(pool["oracle"]["value"]) if pool else "–",
                    f"{pool['unique_answers']:.2f}" if pool else "–",
                )
            )
        lines += [f"### Budget {budget} passes per problem", "", *md_table(headers, rows)]
    return lines


def md_pooled(report: Report) -> list[str]:
    """The pooled curves, one row per k, and their agreement with the run at k = n."""
    section = report["pooled"]
    if section is None:
        return []
    from dllmbench.analysis.figures import selector_label

    curves = section["curves"]
    lines = [
        "## Pooled independent curves",
        "",
        f"Expected accuracy of each selector on a uniformly random k-subset of the "
        f"`{section['pool']}` pool ({section['size']} candidates on each of "
        f"{section['problems']} problems), with 95% bootstrap intervals over problems. "
        "passes: what an independent method of k candidates costs (k·T), and with a "
        "selector that reads a scorer (k·T + k). "
        "`*`: a Monte-Carlo estimate (± its standard error).",
        "",
    ]
    largest = max(c["pool_size"] for c in curves)
    plain = next(c for c in curves if not selector_scorers(c["selector"]))
    scored = next((c for c in curves if selector_scorers(c["selector"])), None)
    headers = ["k", "passes", "with a scorer", *(selector_label(c["selector"]) for c in curves)]
    rows = []
    for k in range(1, largest + 1):
        row = [str(k), str(plain["points"][k - 1]["passes"])]
        row.append(
            str(scored["points"][k - 1]["passes"]) if scored and k <= scored["pool_size"] else "–"
        )
        for c in curves:
            p = c["points"][k - 1] if k <= c["pool_size"] else None
            mark = "" if p is None or p["exact"] else f" * ±{_pct(p['stderr'])}"
            row.append("–" if p is None else f"{_ci(p['accuracy'])}{mark}")
        rows.append(row)
    lines += md_table(headers, rows)
    if section["agreement"]:
        lines += [
            "At k = n the pooled estimate is the selector on the whole pool: it equals "
            "the method the run planned on that pool, problem by problem.",
            "",
        ]
        agree = [
            (
                a["method"],
                a["selector"],
                str(a["k"]),
                _pct(a["pooled"]),
                _pct(a["run"]),
                "yes" if a["equal"] else "no",
            )
            for a in section["agreement"]
        ]
        lines += md_table(("method", "selector", "k = n", "pooled %", "run %", "equal"), agree)
    return lines


def md_discrimination(report: Report) -> list[str]:
    entries = report["diagnostics"]["discrimination"]
    if not entries:
        return []
    lines = [
        "### Scorer discrimination",
        "",
        "ROC-AUC of each scorer's score against the correctness of the final answer, by the "
        "mask ratio of the scored state (guided states: the guided runs' stored segment "
        "scores; final: final candidates of the independent pools, mask 0), with 95% "
        "bootstrap intervals over problems; n states in each bucket.",
        "",
    ]
    headers = ["mask ratio", *(f"{e['scorer']} ({e['states']})" for e in entries)]
    rows = []
    for b in range(10):
        cells = []
        for e in entries:
            bucket = e["roc_auc_by_mask"][b]
            auc = "–" if bucket["auc"] is None else _num(bucket["interval"], 3)
            cells.append(f"{auc} (n={bucket['n']})" if bucket["n"] else "–")
        low, high = (
            entries[0]["roc_auc_by_mask"][b]["low"],
            entries[0]["roc_auc_by_mask"][b]["high"],
        )
        rows.append([f"[{low:.1f}, {high:.1f}{']' if b == 9 else ')'}", *cells])
    lines += md_table(headers, rows)
    lines += [
        "Within-problem Kendall τ-b between score and correctness, over problems with "
        "both correct and incorrect states:",
        "",
    ]
    taus = [
        (
            e["scorer"],
            e["states"],
            str(e["count"]),
            str(e["kendall_tau"]["problems"]),
            "–" if e["kendall_tau"]["mean"] is None else f"{e['kendall_tau']['mean']:.3f}",
            str(e["kendall_tau"]["undefined"]),
        )
        for e in entries
    ]
    return lines + md_table(
        ("scorer", "states", "states n", "problems", "mean τ", "undefined"), taus
    )


def md_pools(report: Report) -> list[str]:
    pools = report["diagnostics"]["pools"]
    if not pools:
        return []
    rows = [
        (
            f"`{p['pool']}`",
            p["kind"],
            str(p["size"]),
            _ci(p["oracle"]),
            _num(p["unique_answers"]),
            _num(p["entropy_bits"]),
            ", ".join(p["methods"]),
        )
        for p in pools
    ]
    return [
        "### Pools",
        "",
        "Oracle@K, unique valid answers and answer entropy (bits) per problem, means with 95% "
        "bootstrap intervals; independent and guided pools side by side.",
        "",
        *md_table(
            ("pool", "kind", "K", "Oracle@K %", "unique answers", "entropy bits", "methods"), rows
        ),
    ]


def md_removal(report: Report) -> list[str]:
    entries = report["diagnostics"]["removal_risk"]
    if not entries:
        return []
    rows = [
        (
            f"`{e['pool']}`",
            str(e["events"]),
            str(e["at_risk"]),
            str(e["lost"]),
            "–" if e["rate"] is None else _pct(e["rate"]),
        )
        for e in entries
    ]
    return [
        "### Removal risk",
        "",
        "At the first cut of each guided run: cuts where some first-segment lineage's own "
        "continuation is correct (at risk), and those that removed every such lineage (lost).",
        "",
        *md_table(("pool", "cuts", "at risk", "lost", "rate %"), rows),
    ]


def md_smc(report: Report) -> list[str]:
    entries = report["diagnostics"]["smc"]
    if not entries:
        return []

    def opt(x: float | None) -> str:
        return "–" if x is None else f"{x:.2f}"

    rows = [
        (
            f"`{e['pool']}`",
            str(e["checkpoints"]),
            f"{e['ess_before']:.2f}",
            f"{e['ess_after']:.2f}",
            _pct(e["resample_rate"]),
            f"{e['beta']['mean']:.2f} [{e['beta']['min']:.2f}, {e['beta']['max']:.2f}]",
            opt(e["distinct_ancestors"]),
            opt(e["ancestor_perplexity"]),
        )
        for e in entries
    ]
    headers = (
        "pool",
        "checkpoints",
        "ESS before",
        "ESS after",
        "resampled %",
        "β mean [min, max]",
        "distinct ancestors",
        "ancestor perplexity",
    )
    return [
        "### SMC",
        "",
        "Means over every intermediate checkpoint of every problem; "
        "ancestors over the checkpoints that resampled.",
        "",
        *md_table(headers, rows),
    ]


def md_swap(report: Report) -> list[str]:
    swap = report["diagnostics"]["scorer_swap"]
    if swap is None:
        return []
    acc = [(name, _ci(ci)) for name, ci in swap["accuracy"].items()]
    diffs = [(f"{d['a']} − {d['b']}", _delta(d)) for d in swap["differences"]]
    return [
        "### Scorer swap",
        "",
        f"The first {swap['size']} candidates of the `{swap['pool']}` pool reranked by each "
        "scorer (argmax) and at random (expected), with paired differences in points.",
        "",
        *md_table(("selector", "acc % [95% CI]"), acc),
        *md_table(("difference", "pp [95% CI]"), diffs),
    ]


def markdown(report: Report) -> str:
    """report.md: every table of the report, and the figures it links."""
    task = report["task"]
    runs = ", ".join(f"`{r['path']}`" for r in report["runs"])
    lines = [
        f"# {task['name']} ({task['split']}, {task['problems']} problems) · "
        f"{report['backbone']} · T = {report['steps']} · seed {report['seed']}",
        "",
        f"Runs: {runs}. Budgets: {', '.join(map(str, report['budgets']))} passes per problem. "
        f"Intervals: {round(100 * report['level'])}% percentile bootstrap over problems "
        f"({report['resamples']} resamples).",
        "",
        *md_methods(report),
        *md_pooled(report),
        "## Diagnostics",
        "",
        *md_discrimination(report),
        *md_pools(report),
        *md_removal(report),
        *md_smc(report),
        *md_swap(report),
    ]
    if report["figures"]:
        lines += ["## Figures", ""]
        lines += [f"![{name}]({file})" for name, file in report["figures"].items()]
    return "\n".join(lines).rstrip() + "\n"


@dataclass(frozen=True)
class Written:
    out: Path
    files: tuple[str, ...]
    report: Report


def write_report(
    paths: Sequence[str | Path], out: str | Path | None = None, options: Options | None = None
) -> Written:
    """Build the report of the runs at `paths` and write report.json, report.md and the
    figures into `out` (default: RUN_DIR/report of the first run)."""
    from dllmbench.analysis import figures

    report = build_report(paths, options)
    folder = Path(out) if out is not None else Path(paths[0]) / "report"
    try:
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
