"""report.md, rendered from report.json's content alone (`schema.Report`)."""

from __future__ import annotations

from collections.abc import Sequence

from dllmbench.analysis.leaderboard import (
    CAPPED_NOTE,
    DISAGREE_MARK,
    INVALID_VOTE_NOTE,
    disagree_note,
    disagrees,
    flops_cell,
    invalid_votes,
    passes_cell,
)
from dllmbench.analysis.report_sections import budget_text, selector_scorers
from dllmbench.core.flops import format_flops
from dllmbench.core.schema import (
    IntervalEntry,
    Report,
)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def ci_cell(entry: IntervalEntry | None) -> str:
    """An interval of a fraction in %: `value [low, high]`; – for none."""
    if entry is None:
        return "–"
    return f"{_pct(entry['value'])} [{_pct(entry['low'])}, {_pct(entry['high'])}]"


def delta_cell(entry: IntervalEntry | None) -> str:
    """A paired difference of fractions in signed points; – for none."""
    if entry is None:
        return "–"
    v, lo, hi = (100 * entry[k] for k in ("value", "low", "high"))
    return f"{v:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def p_value(entry: IntervalEntry | None) -> str:
    """The exact McNemar p-value of a paired difference of 0/1 outcomes, with its
    discordant counts (`+better/−worse`), † when it and the interval disagree; – where the
    outcomes are not 0/1."""
    if entry is None or "mcnemar_p" not in entry:
        return "–"
    mark = f" {DISAGREE_MARK}" if disagrees(entry) else ""
    return f"{entry['mcnemar_p']:.3g} (+{entry['better']}/−{entry['worse']}){mark}"


def number_cell(entry: IntervalEntry | None, digits: int = 2) -> str:
    """An interval of a number as it is, to `digits`; – for none."""
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
        "FLOPs",
        "acc % [95% CI]",
        f"Δ vs {ref} (pp)",
        "McNemar p",
        "oracle %",
        "unique",
    )
    lines = [
        "## Accuracy by method and budget",
        "",
        "Intervals are 95% percentile bootstrap intervals over problems, computed exactly "
        "from the bootstrap law of 0/1 outcomes (binomial for an accuracy, trinomial for a "
        f"paired difference). McNemar p: the exact two-sided test of Δ vs {ref} on the "
        f"problems the two disagree on (+ solved by the method only, − by {ref} only). "
        "passes and FLOPs: what the method spent per problem, measured means over problems "
        "(their intervals are `spend` in report.json; the pareto figure draws them).",
        "",
    ]
    for budget in report["budgets"]:
        rows = []
        for m in (m for m in report["methods"] if m["budget"] == budget):
            pool = m.get("pool")
            name = f"{m['id']} (ceiling)" if m["ceiling"] else m["id"]
            rows.append(
                (
                    name,
                    f"`{m['spec']}`",
                    passes_cell(m),
                    flops_cell(m),
                    ci_cell(m["accuracy"]),
                    delta_cell(m.get("delta_vs_reference")),
                    p_value(m.get("delta_vs_reference")),
                    _pct(pool["oracle"]["value"]) if pool else "–",
                    f"{pool['unique_answers']:.2f}" if pool else "–",
                )
            )
        at = budget_text(budget, report.get("budget_unit", "passes"))
        lines += [f"### Budget {at} per problem", "", *md_table(headers, rows)]
    if any(m.get("capped") for m in report["methods"]):
        lines += [CAPPED_NOTE, ""]
    if any(disagrees(m.get("delta_vs_reference")) for m in report["methods"]):
        lines += [disagree_note(report["level"]), ""]
    if any(invalid_votes(m["spec"]) for m in report["methods"]):
        lines += [INVALID_VOTE_NOTE, ""]
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
            row.append("–" if p is None else f"{ci_cell(p['accuracy'])}{mark}")
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
            auc = "–" if bucket["auc"] is None else number_cell(bucket["interval"], 3)
            cells.append(f"{auc} (n={bucket['n']})" if bucket["n"] else "–")
        low, high = (
            entries[0]["roc_auc_by_mask"][b]["low"],
            entries[0]["roc_auc_by_mask"][b]["high"],
        )
        rows.append([f"[{low:.1f}, {high:.1f}{']' if b == 9 else ')'}", *cells])
    lines += md_table(headers, rows)
    lines += [
        "Within-problem Kendall τ-b between score and correctness, over problems with both "
        "correct and incorrect states, one kind of state at a time (never mixed): a guided "
        "run's first-segment states (partial, before the first cut) apart from its final "
        "states (the kept branch, fully decoded). The median has a 95% bootstrap interval "
        "over problems. The paper's statistic (median 0.44, mean 0.397) is τ on fully "
        "decoded independent samples: here the `final` row of the `final` states (the "
        "independent pools' candidates); the guided rows are not the paper's.",
        "",
    ]
    taus = [
        (
            e["scorer"],
            e["states"],
            KINDS.get(tau["states"], tau["states"]),
            str(tau["count"]),
            str(tau["problems"]),
            _tau(tau["median"], tau["interval"]),
            _tau(tau["mean"]),
            str(tau["undefined"]),
        )
        for e in entries
        for tau in e["kendall_tau"]
    ]
    headers = ("scorer", "states", "kind", "states n", "problems", "median τ", "mean τ")
    return lines + md_table((*headers, "undefined"), taus)


# the kinds of state a Kendall τ is taken over (report.json's `states` of `kendall_tau`)
KINDS = {
    "first_segment": "first segment",
    "later_segment": "later segment",
    "final": "final",
}


def _tau(value: float | None, ci: IntervalEntry | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:+.3f}" + ("" if ci is None else f" [{ci['low']:+.3f}, {ci['high']:+.3f}]")


def md_pools(report: Report) -> list[str]:
    pools = report["diagnostics"]["pools"]
    if not pools:
        return []
    rows = [
        (
            f"`{p['pool']}`",
            p["kind"],
            str(p["size"]),
            ci_cell(p["oracle"]),
            number_cell(p["unique_answers"]),
            number_cell(p["entropy_bits"]),
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
            "–" if e["rate"] is None else ci_cell(e["interval"]),
        )
        for e in entries
    ]
    return [
        "### Removal risk at the first cut in the run",
        "",
        "At the first cut each guided run made: cuts where some first-segment lineage's own "
        "continuation is correct (at risk), and those that removed every such lineage (lost). "
        "This is what the runs did, not the paper's offline counterfactual (top-M cuts at the "
        "initial, middle and final stored states), which `dllmbench diagnose` computes from a "
        "collection and `report --controls` adds below. The rate's 95% interval resamples "
        "the problems (one cut each).",
        "",
        *md_table(("pool", "cuts", "at risk", "lost", "rate % [95% CI]"), rows),
    ]


def md_smc(report: Report) -> list[str]:
    entries = report["diagnostics"]["particles"]
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
    acc = [(name, ci_cell(ci)) for name, ci in swap["accuracy"].items()]
    diffs = [(f"{d['a']} − {d['b']}", delta_cell(d), p_value(d)) for d in swap["differences"]]
    note = [disagree_note(report["level"]), ""] if any(map(disagrees, swap["differences"])) else []
    return [
        "### Scorer swap",
        "",
        f"The first {swap['size']} candidates of the `{swap['pool']}` pool reranked by each "
        "scorer (argmax) and at random (expected), with paired differences in points.",
        "",
        *md_table(("selector", "acc % [95% CI]"), acc),
        *md_table(("difference", "pp [95% CI]", "McNemar p"), diffs),
        *note,
    ]


def md_controls(report: Report) -> list[str]:
    """The scorer controls over a collection's stored states (dllmbench diagnose)."""
    controls = report.get("controls")
    if not controls:
        return []
    from dllmbench.analysis.controls_markdown import sections

    col = controls["collection"]
    return [
        "## Scorer controls over stored trajectories",
        "",
        f"From the collection `{col['path']}` ({col['task']['split']} split, "
        f"{col['problems']} problems × {col['n']} independent trajectories, {col['states']} "
        "stored states), sampled as the runs were.",
        "",
        *sections(controls),
    ]


def md_agreement(report: Report) -> list[str]:
    """`--exact`: each method's answers beside exact decoding's."""
    entry = report.get("agreement")
    if not entry:
        return []
    rows = [
        [
            m["id"],
            str(m["problems"]),
            _pct(m["same_answer"]),
            "–" if m["same_candidate"] is None else _pct(m["same_candidate"]),
            _pct(m["accuracy"]),
            _pct(m["exact_accuracy"]),
        ]
        for m in entry["methods"]
    ]
    return [
        "## Agreement with exact decoding",
        "",
        f"This run was decoded with an approximate cache; `{entry['exact_run']}` ran the same "
        "methods exactly, with the same keys. Same answer: the share of problems whose selected "
        "answer is the exact run's; same candidates: the share of candidates (matched by "
        "lineage) whose answer is.",
        "",
        *md_table(
            ["method", "problems", "same answer %", "same candidates %", "acc %", "exact acc %"],
            rows,
        ),
        "",
    ]


def md_skipped(report: Report) -> list[str]:
    """The methods left out of the pooled curves and diagnostics, each with why."""
    skipped = report.get("skipped") or []
    if not skipped:
        return []
    return [
        "Left out of the pooled curves and the diagnostics, their records not holding what "
        "their strategies declare (their accuracy above is the run's):",
        "",
        *(
            f"- `{s['method']}` (strategy `{s['strategy']}`, run {s['run']}): {s['reason']}"
            for s in skipped
        ),
        "",
    ]


def markdown(report: Report) -> str:
    """report.md: every table of the report, and the figures it links."""
    task = report["task"]
    runs = ", ".join(f"`{r['path']}`" for r in report["runs"])
    if report.get("budget_unit", "passes") == "flops":
        budgets = f"{', '.join(map(format_flops, report['budgets']))} per problem"
    else:
        budgets = f"{', '.join(map(str, report['budgets']))} passes per problem"
    lines = [
        f"# {task['name']} ({task['split']}, {task['problems']} problems) · "
        f"{report['backbone']} · T = {report['steps']} · seed {report['seed']}",
        "",
        f"Runs: {runs}. Budgets: {budgets}. "
        f"Intervals: {round(100 * report['level'])}% percentile bootstrap over problems, exact "
        "for 0/1 outcomes (the binomial law of an accuracy, the trinomial law of a paired "
        f"difference), else from {report['resamples']} resamples (the Monte-Carlo error of "
        "their ends is `mc_error` in report.json).",
        "",
        *md_methods(report),
        *md_agreement(report),
        *md_skipped(report),
        *md_pooled(report),
        "## Diagnostics",
        "",
        *md_discrimination(report),
        *md_pools(report),
        *md_removal(report),
        *md_smc(report),
        *md_swap(report),
        *md_controls(report),
    ]
    if report["figures"]:
        lines += ["## Figures", ""]
        lines += [f"![{name}]({file})" for name, file in report["figures"].items()]
    return "\n".join(lines).rstrip() + "\n"
