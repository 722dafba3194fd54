"""The sections of report.json, built from finished runs read back (`evidence.RunData`): the
accuracy of every method at every budget (copied from each run's results.json), the pooled
independent curves (`pooled.pooled_curves` on the largest independent pool, every k), and the
diagnostics of `diagnostics` on the evidence `evidence` reads from the records."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dllmbench.analysis import diagnostics, evidence, pooled, stats
from dllmbench.core.flops import format_flops
from dllmbench.core.schema import (
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
    ReportMethod,
    ScorerSwapEntry,
    SMCEntry,
)

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
    return value.as_dict(DIGITS)


# -- accuracy by method and budget ----------------------------------------------------------


def method_budget(results: dict[str, Any], entry: dict[str, Any]) -> int:
    """The budget a results.json method entry ranks the method at."""
    return int(entry["budget"])


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


def budget_unit(run: evidence.RunData) -> str:
    """The unit of a run's budgets, `passes` or `flops` (results.json written before budgets
    in FLOPs: passes)."""
    return str(run.results.get("budget_unit", "passes"))


def budget_text(budget: int, unit: str) -> str:
    """A budget with its unit: `1040 passes`, `2.1 PFLOP`."""
    return format_flops(budget) if unit == "flops" else f"{budget} passes"


def budgets_of(runs: Sequence[evidence.RunData]) -> list[int]:
    found: set[int] = set()
    for run in runs:
        found.update(int(b) for b in run.results["budgets"])
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
        n = pool_size(m)
        if evidence.pool_key(m) != pool or n < 1:
            continue
        for kind, passes in m.get("cost", {}).items():
            per.setdefault(kind, passes / n)
    return CostModel(per)


def pool_size(method: dict[str, Any]) -> int:
    """The pool size of a method whose strategy declares nested pools (its size field's
    value); 0 for any other."""
    field = evidence.declared(method).get("nested")
    return int(method["strategy"]["config"].get(field, 0)) if field else 0


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
    pool_set: evidence.PoolSet,
    seed: int,
    resamples: int,
    level: float,
    options: Options,
    invalid_votes: bool = False,
) -> Curves:
    """selector → (pool size, points at k = 1..size, bootstrap intervals). The scorer-less
    selectors come from the whole pool; on a shorter prefix only its scorers' selectors.
    `invalid_votes` adds Majority@k with invalid answers voting (`majority:invalid=vote`)."""
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
            invalid_votes=invalid_votes and size == full,
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
        n = pool_size(m)
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
    if name == "majority" and config.get("invalid", "drop") == "vote":
        return pooled.MAJORITY_INVALID_VOTE
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
    # Majority@k with invalid answers voting, only where a run's method votes so
    invalid_votes = any(
        pooled_selector(m["selector"]) == pooled.MAJORITY_INVALID_VOTE
        for r in runs
        for m in r.manifest["methods"]
    )
    curves = _curves(pool_set, seed, resamples, level, options, invalid_votes)
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


def bucket_entry(b: diagnostics.BucketAUC) -> BucketEntry:
    """A mask bucket's ROC-AUC as report.json (and controls.json) hold it."""
    return BucketEntry(
        low=b.low,
        high=b.high,
        n=b.n,
        positives=b.positives,
        auc=None if b.auc is None else round(b.auc, DIGITS),
        interval=interval(b.interval),
    )


def kendall_entry(kind: str, states: Sequence[diagnostics.ScoredState], boot: Boot) -> KendallEntry:
    """Within-problem Kendall τ over states of one kind: its median over problems with its
    bootstrap interval (the medians of resampled problems), and its mean."""
    tau = diagnostics.within_problem_kendall(states)
    defined = [t for t in tau.per_problem.values() if not np.isnan(t)]
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    return KendallEntry(
        states=kind,
        count=len(states),
        median=rounded(tau.median),
        interval=interval(stats.median_interval(defined, **opts)),
        mean=rounded(tau.mean),
        problems=tau.problems,
        undefined=tau.undefined,
    )


def _discrimination(
    scorer: str, kind: str, states: Sequence[evidence.State], boot: Boot
) -> DiscriminationEntry:
    """ROC-AUC by mask bucket over every state; Kendall τ apart for each kind of state."""
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    scored = [s.scored for s in states]
    return DiscriminationEntry(
        scorer=scorer,
        states=kind,
        count=len(scored),
        positives=sum(bool(s.label) for s in scored),
        roc_auc_by_mask=[bucket_entry(b) for b in diagnostics.auc_by_mask_bucket(scored, **opts)],
        kendall_tau=[
            kendall_entry(k, [s.scored for s in states if s.kind == k], boot)
            for k in evidence.STATE_KINDS
            if any(s.kind == k for s in states)
        ],
    )


def discrimination(runs: Sequence[evidence.RunData], boot: Boot) -> list[DiscriminationEntry]:
    """Each scorer's ROC-AUC by mask bucket and within-problem Kendall τ (by kind of state),
    on the guided runs' scored states and on the final candidates of the independent pools;
    a state the runs share counts once (`evidence.merge_states`)."""
    out = []
    for scorer in sorted(runs[0].manifest.get("scorers") or {}):
        guided = evidence.merge_states([evidence.guided_states(run, scorer) for run in runs])
        final = evidence.merge_states([evidence.candidate_states(run, scorer) for run in runs])
        for kind, states in (("guided", guided), ("final", final)):
            if states:
                out.append(_discrimination(scorer, kind, states, boot))
    return out


def _shared_methods(
    runs: Sequence[evidence.RunData], what: str
) -> Iterator[tuple[evidence.RunData, str, list[str]]]:
    """(run, pool key, method ids) of each strategy run declaring `what` (cuts, particles),
    once across runs."""
    seen: set[str] = set()
    for run in runs:
        groups: dict[str, list[str]] = {}
        for mid, entry in run.methods.items():
            if evidence.declared(entry).get(what):
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
            kind = pool_kind(run.methods[mids[0]])
            out.append(_diversity(name, kind, mids, pool_set, boot))
    return out


def pool_kind(method: dict[str, Any]) -> str:
    """`independent` for plain samples, `guided` for a strategy that declares cuts or
    particles, `other` for the rest (sampler ensembles, HEX, remasking)."""
    found = evidence.declared(method)
    if evidence.plain(method):
        return "plain"
    return "guided" if found.get("cuts") or found.get("particles") else "other"


def removal(runs: Sequence[evidence.RunData], boot: Boot) -> list[RemovalRiskEntry]:
    """Removal risk of the first cut of each strategy run that declares pruning cuts, with
    the bootstrap interval of its rate over the cuts (one per problem)."""
    out = []
    for run, key, mids in _shared_methods(runs, "cuts"):
        events = evidence.pruning_events(run, method=mids[0])
        if not events:
            continue
        risk = diagnostics.removal_risk(events)
        each = [diagnostics.removal_risk([event]) for event in events]
        opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
        ci = stats.ratio_interval([r.lost for r in each], [r.at_risk for r in each], **opts)
        out.append(
            RemovalRiskEntry(
                pool=key,
                methods=mids,
                events=risk.events,
                at_risk=risk.at_risk,
                lost=risk.lost,
                rate=rounded(risk.rate),
                interval=interval(ci),
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


def rounded(value: float | None) -> float | None:
    """`value` to the report's digits; None stays None."""
    return None if value is None else round(value, DIGITS)


def with_recorded_ess(
    checkpoints: Sequence[diagnostics.CheckpointStats], recorded: Sequence[float | None]
) -> list[diagnostics.CheckpointStats]:
    """Each checkpoint's diagnostics with the ESS its strategy recorded (from unrounded
    weights) in place of the one recomputed from the weights as recorded (6 digits); after
    resampling the ESS is K either way."""
    out = []
    for s, ess in zip(checkpoints, recorded, strict=True):
        if ess is not None:
            s = replace(s, ess_before=ess, ess_after=float(s.n) if s.resampled else ess)
        out.append(s)
    return out


def smc(runs: Sequence[evidence.RunData]) -> list[SMCEntry]:
    """ESS before and after each checkpoint, β, resampling and ancestors of each SMC run."""
    out = []
    for run, key, mids in _shared_methods(runs, "particles"):
        checkpoints = evidence.smc_checkpoints(run, method=mids[0])
        if not checkpoints:
            continue
        summary = diagnostics.smc_diagnostics(checkpoints)
        checked = with_recorded_ess(summary.checkpoints, evidence.recorded_ess(run, mids[0]))
        per_run = evidence.checkpoints_per_run(run, mids[0])
        out.append(
            SMCEntry(
                pool=key,
                methods=mids,
                checkpoints=len(checked),
                ess_before=round(float(np.mean([s.ess_before for s in checked])), DIGITS),
                ess_after=round(float(np.mean([s.ess_after for s in checked])), DIGITS),
                resample_rate=round(summary.resample_rate, DIGITS),
                beta={
                    "mean": round(summary.beta_mean, DIGITS),
                    "min": round(summary.beta_min, DIGITS),
                    "max": round(summary.beta_max, DIGITS),
                },
                distinct_ancestors=rounded(summary.mean_distinct_ancestors),
                ancestor_perplexity=rounded(summary.mean_ancestor_perplexity),
                by_checkpoint=_by_checkpoint(checked, per_run),
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
        removal_risk=removal(runs, boot),
        particles=smc(runs),
        scorer_swap=scorer_swap(runs, boot),
    )
