"""The report's PNG figures, drawn from report.json's content alone (`schema.Report`).

Figures are drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot,
so they render without a display and leave no global state behind. Each function returns
the figure, or None when the report has nothing to draw for it; `render` saves those that
exist and returns {figure name: file name}.

Every figure states what its points are means of (n), what its bars and bands are (the
report's bootstrap intervals over problems) and marks Monte-Carlo estimates; legends sit
outside the data, and labels are short (a strategy's name and the options that tell its
pools apart).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, FigureBase
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

from dllmbench.analysis.pooled import MAJORITY_INVALID_VOTE
from dllmbench.core.flops import format_flops
from dllmbench.core.schema import Report
from dllmbench.execution.method import parse_part

DPI = 120
KIND_COLORS = {"plain": "tab:blue", "guided": "tab:orange", "other": "tab:green"}
KIND_LABELS = {
    "plain": "independent samples",
    "guided": "guided search (cuts, particles)",
    "other": "other samplers (HEX, ensembles, remasking, …)",
}
SCORER_COLORS = ["tab:blue", "tab:red", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]
NO_SCORER = "0.15"  # Oracle@k, Majority@k: no scorer
REFERENCE = "0.55"  # Random@k, chance, thresholds
CAPTION = {"fontsize": 7.5, "color": "0.25"}
NOTE = 6.5  # font size of per-point annotations


def selector_label(selector: str) -> str:
    """A pooled selector's display name: ORM@k, Weighted Majority (ORM)@k, Majority@k, …"""
    family, _, scorer = selector.partition(":")
    if selector == MAJORITY_INVALID_VOTE:
        return "Majority (invalid answers vote)@k"
    if family == "argmax":
        return f"{scorer.upper()}@k"
    if family == "weighted_majority":
        return f"Weighted Majority ({scorer.upper()})@k"
    return f"{family.capitalize()}@k"


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _caption(fig: FigureBase, text: str) -> None:
    """A caption under the panels (the figure's shared x label, so the layout makes room)."""
    fig.supxlabel(text, **CAPTION)


def _level(report: Report) -> str:
    return f"{round(100 * report.get('level', 0.95)):g}%"


def _budgets_in(report: Report, unit: str) -> list[int]:
    """The report's budgets when they are in `unit` (passes, flops), else none: an axis in
    one unit marks only budgets in it."""
    return list(report["budgets"]) if report.get("budget_unit", "passes") == unit else []


def _budget_label(report: Report, budget: int) -> str:
    """A budget as a panel names it: `1040` (passes), `2.1 PFLOP`."""
    return format_flops(budget) if report.get("budget_unit") == "flops" else f"{budget}"


def _errors(value: float, low: float, high: float) -> list[list[float]]:
    return [[max(0.0, value - low)], [max(0.0, high - value)]]


def strategy_options(spec: str) -> tuple[str, dict[str, Any]]:
    """A spec's strategy name and options (`parse_part`): `smc:k=8,every=12+…` → ('smc', {…})."""
    return parse_part(spec.partition("+")[0])


def short_labels(specs: Sequence[str]) -> dict[str, str]:
    """A short label for each strategy spec: its name, and the options whose values tell it
    apart from the other specs of the same name (`prism n=19` beside `prism n=99`)."""
    parsed = {spec: strategy_options(spec) for spec in specs}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, options in parsed.values():
        by_name.setdefault(name, []).append(options)
    out = {}
    for spec, (name, options) in parsed.items():
        group = by_name[name]
        keys = sorted({k for o in group for k in o})
        differ = [k for k in keys if len({o.get(k) for o in group}) > 1]
        out[spec] = " ".join([name, *(f"{k}={options[k]}" for k in differ if k in options)])
    counts: dict[str, int] = {}
    for label in out.values():
        counts[label] = counts.get(label, 0) + 1
    return {spec: label if counts[label] == 1 else spec for spec, label in out.items()}


# -- pareto.png ------------------------------------------------------------------------------

SIZE_WORD = re.compile(r"@\d+|\b[A-Za-z]=\d+\b")  # the budget-specific parts of a method id
POOLED_GROUPS = ("oracle", "majority", "weighted_majority", "argmax")
POOLED_TITLES = {
    "oracle": "Oracle@k (ceiling)",
    "majority": "Majority@k",
    "weighted_majority": "Weighted Majority@k",
    "argmax": "best score@k (rerank)",
}


def method_label(method_id: str) -> tuple[str, str]:
    """(short name, budget-specific part) of a method id: 'PRM Guided K=8 b=12' →
    ('PRM Guided', 'K=8 b=12'); 'Majority@8' → ('Majority', '@8')."""
    short = " ".join(SIZE_WORD.sub(" ", method_id).split())
    details = " ".join(SIZE_WORD.findall(method_id))
    return short or method_id, details


def _scorer_colors(curves: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    scorers = dict.fromkeys(c["selector"].partition(":")[2] for c in curves)
    scorers.pop("", None)
    return {s: SCORER_COLORS[i % len(SCORER_COLORS)] for i, s in enumerate(scorers)}


def _pooled_panels(sub: FigureBase, report: Report) -> None:
    """One panel per pooled selector family; Random@k as a reference line in each."""
    pooled = report["pooled"]
    assert pooled is not None
    curves = pooled["curves"]
    families = list(dict.fromkeys(c["selector"].partition(":")[0] for c in curves))
    groups = [f for f in POOLED_GROUPS if f in families]
    groups += [f for f in families if f not in groups and f != "random"]
    if not groups:
        groups = ["random"]
    random = next((c for c in curves if c["selector"] == "random"), None)
    colors = _scorer_colors(curves)
    axes = sub.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    stderr = max((p["stderr"] for c in curves for p in c["points"]), default=0.0)
    monte_carlo = any(not p["exact"] for c in curves for p in c["points"])
    used: set[str] = set()
    for ax, group in zip(axes, groups, strict=True):
        members = [c for c in curves if c["selector"].partition(":")[0] == group]
        if random is not None and group != "random":
            xs = [p["passes"] for p in random["points"]]
            ys = [100 * p["accuracy"]["value"] for p in random["points"]]
            ax.plot(xs, ys, ls=":", lw=1.2, color=REFERENCE, label="Random@k (reference)")
        for curve in members:
            scorer = curve["selector"].partition(":")[2]
            color = colors.get(scorer, NO_SCORER)
            used.add(color)
            points = curve["points"]
            xs = [p["passes"] for p in points]
            acc = [p["accuracy"] for p in points]
            ys = [100 * a["value"] for a in acc]
            label = scorer.upper() if scorer else selector_label(curve["selector"])
            ax.plot(xs, ys, lw=1.3, color=color, label=label)
            ax.fill_between(
                xs,
                [100 * a["low"] for a in acc],
                [100 * a["high"] for a in acc],
                color=color,
                alpha=0.15,
                lw=0,
            )
            exact = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if p["exact"]]
            estimated = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if not p["exact"]]
            for pts, face in ((exact, color), (estimated, "white")):
                if pts:
                    px, py = zip(*pts, strict=True)
                    ax.plot(px, py, ls="none", marker="o", ms=3.2, mew=0.8, color=color, mfc=face)
        for budget in _budgets_in(report, "passes"):
            ax.axvline(budget, color=REFERENCE, lw=0.8, ls="--", zorder=0)
        ax.set_title(POOLED_TITLES.get(group, selector_label(group)), fontsize=9)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for budget in _budgets_in(report, "passes"):
        axes[0].annotate(
            f"{budget}",
            xy=(budget, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-2, -2),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=NOTE,
            color="0.3",
        )
    axes[0].set_ylabel("accuracy %", fontsize=8)
    sub.supxlabel(_spend_label(report, "passes"), fontsize=8)
    keys = [Line2D([], [], color=NO_SCORER, label="no scorer")] if NO_SCORER in used else []
    keys += [Line2D([], [], color=c, label=s.upper()) for s, c in colors.items() if c in used]
    keys += [
        Line2D([], [], ls=":", color=REFERENCE, label="Random@k (reference)"),
        Line2D([], [], ls="none", marker="o", color="0.3", label="exact"),
    ]
    if monte_carlo:
        keys.append(
            Line2D(
                [],
                [],
                ls="none",
                marker="o",
                color="0.3",
                mfc="white",
                label=f"Monte-Carlo estimate\n(s.e. ≤ {100 * stderr:.2f} percentage points)",
            )
        )
    keys.append(Patch(color="0.3", alpha=0.2, label=f"{_level(report)} CI"))
    sub.legend(handles=keys, loc="outside right upper", fontsize=7)
    sub.suptitle(
        f"Pooled independent samples: k of a pool of {pooled['size']} per problem, mean over "
        f"{pooled['problems']} problems\nbands: {_level(report)} bootstrap CIs over problems",
        fontsize=9,
    )


def _method_kinds(report: Report) -> dict[str, str]:
    """Method id → pool kind (plain, guided, other) from the diagnostics' pools; a method of
    no listed pool takes the kind of a pool with its strategy's name."""
    kinds: dict[str, str] = {}
    by_name: dict[str, str] = {}
    for pool in report["diagnostics"]["pools"]:
        by_name.setdefault(strategy_options(pool["pool"])[0], pool["kind"])
        for mid in pool["methods"]:
            kinds[mid] = pool["kind"]
    for m in report["methods"]:
        kinds.setdefault(m["id"], by_name.get(strategy_options(m["spec"])[0], "other"))
    return kinds


def _row_keys(methods: Sequence[Any]) -> dict[int, tuple[str, int]]:
    """id(method) → (family, j): the panels share a row per family, and a family with several
    methods at one budget takes one row for each."""
    keys: dict[int, tuple[str, int]] = {}
    seen: dict[tuple[str, int], int] = {}
    for m in methods:
        family = m["family"] or m["id"]
        j = seen.get((family, m["budget"]), 0)
        seen[(family, m["budget"])] = j + 1
        keys[id(m)] = (family, j)
    return keys


class Rows(NamedTuple):
    """The rows of the methods by budget: a row per method family (shared by the budgets; one
    per method where a family has several at one budget), ceilings last. Row i is labelled
    `name [i + 1]`, the number the methods at their spend are marked with."""

    of: dict[int, int]  # id(method) → its row
    names: list[str]  # in row order
    ceilings: int  # the last rows, the ceilings'


def method_rows(methods: Sequence[Any]) -> Rows:
    keys = _row_keys(methods)  # (family, j): the j-th method of its family at its budget
    families = list(dict.fromkeys(keys.values()))
    ceilings = {keys[id(m)] for m in methods if m["ceiling"]}
    families = [f for f in families if f not in ceilings] + [f for f in families if f in ceilings]
    first = {f: next(m for m in methods if keys[id(m)] == f) for f in families}
    names = {f: method_label(first[f]["id"])[0] for f in families}
    repeated = {n for n in names.values() if list(names.values()).count(n) > 1}
    names = {f: f"{n} ({first[f]['id']})" if n in repeated else n for f, n in names.items()}
    index = {f: i for i, f in enumerate(families)}
    return Rows(
        {id(m): index[keys[id(m)]] for m in methods},
        [names[f] for f in families],
        len(ceilings),
    )


def _method_panels(sub: FigureBase, report: Report, methods: Sequence[Any], rows: Rows) -> None:
    """One panel per budget: each method family on its own row (shared by the panels), its
    accuracy with its interval, and its size and passes per problem at the right."""
    kinds = _method_kinds(report)
    budgets = list(dict.fromkeys(m["budget"] for m in methods))
    axes = sub.subplots(1, len(budgets), sharey=True, sharex=True, squeeze=False)[0]
    for ax, budget in zip(axes, budgets, strict=True):
        at = [m for m in methods if m["budget"] == budget]
        for m in at:
            acc, y = m["accuracy"], rows.of[id(m)]
            color = KIND_COLORS.get(kinds[m["id"]], NO_SCORER)
            value = 100 * acc["value"]
            ax.errorbar(
                [value],
                [y],
                xerr=_errors(value, 100 * acc["low"], 100 * acc["high"]),
                fmt="o",
                color=color,
                mfc="white" if m["ceiling"] else color,
                ms=5,
                capsize=2,
                lw=1.2,
            )
            details = method_label(m["id"])[1]
            note = (
                f"{details}  {m['passes_per_problem']:g}"
                if details
                else f"{m['passes_per_problem']:g}"
            )
            ax.annotate(
                note,
                xy=(1.0, y),
                xycoords=("axes fraction", "data"),
                xytext=(3, 0),
                textcoords="offset points",
                ha="left",
                va="center",
                fontsize=NOTE,
                color="0.3",
                annotation_clip=False,
            )
        problems = sorted({m["problems"] for m in at})
        n = "/".join(str(p) for p in problems)
        ax.set_title(
            f"budget {_budget_label(report, budget)} (n = {n} problems)", fontsize=9, loc="left"
        )
        if 0 < rows.ceilings < len(rows.names):
            ax.axhline(len(rows.names) - rows.ceilings - 0.5, color=REFERENCE, lw=0.6)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.set_xlabel(f"accuracy % ({_level(report)} bootstrap CI over problems)", fontsize=8)
        ax.annotate(
            "size  passes",
            xy=(1.0, 1.0),
            xycoords="axes fraction",
            xytext=(3, 2),
            textcoords="offset points",
            ha="left",
            va="bottom",
            fontsize=NOTE,
            color="0.3",
        )
    labels = [f"{name} [{i + 1}]" for i, name in enumerate(rows.names)]
    axes[0].set_yticks(range(len(rows.names)), labels, fontsize=7.5)
    axes[0].set_ylim(len(rows.names) - 0.5, -0.5)
    lows = [100 * m["accuracy"]["low"] for m in methods]
    axes[0].set_xlim(max(0.0, 10 * math.floor(min(lows) / 10) - 2), 102)
    used = [k for k in KIND_COLORS if k in {kinds[m["id"]] for m in methods}]
    keys = [
        Line2D([], [], ls="none", marker="o", color=KIND_COLORS[k], label=KIND_LABELS[k])
        for k in used
    ]
    if rows.ceilings:
        keys.append(
            Line2D(
                [], [], ls="none", marker="o", color="0.3", mfc="white", label="ceiling (oracle)"
            )
        )
    sub.legend(handles=keys, loc="outside right upper", fontsize=7)
    sub.suptitle("Methods at matched compute, one panel per budget", fontsize=9)


SPEND_UNITS = {"passes": "passes per problem", "flops": "FLOPs per problem"}
CAPPED_MARKER = "D"  # a capped method: its declared cost is a cap it may spend less than


def measured(method: Mapping[str, Any], unit: str) -> tuple[float, float, float] | None:
    """(mean, low, high) of what a method spent per problem in `unit` (passes, flops): its
    `spend` interval; for a results.json written before spend had intervals, its mean alone;
    None when unknown."""
    spend = (method.get("spend") or {}).get(unit)
    if spend is not None:
        return spend["value"], spend["low"], spend["high"]
    mean = method.get(f"{unit}_per_problem")
    return None if mean is None else (mean, mean, mean)


def _spend_label(report: Report, unit: str) -> str:
    """An x axis in `unit`: log scale, and the run's budgets dashed where they are in it."""
    dashed = "; dashed: the run's budgets" if _budgets_in(report, unit) else ""
    return f"{SPEND_UNITS[unit]} (log scale{dashed})"


def _spend_units(methods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Passes, and FLOPs when every method has them."""
    return [u for u in SPEND_UNITS if all(measured(m, u) is not None for m in methods)]


def _spend_panels(sub: FigureBase, report: Report, methods: Sequence[Any], rows: Rows) -> None:
    """Each method at what it spent, measured (x: the mean per problem with its interval),
    against its accuracy (y, with its interval): one panel per unit, passes and, when every
    method has them, FLOPs. A method planned at several budgets is one point (its records are
    the same); ceilings hollow, capped methods diamonds; each point numbered with its row of
    the methods by budget, methods at one spot sharing a label."""
    points = list({(m["run"], m["id"]): m for m in methods}.values())
    units = _spend_units(points)
    kinds = _method_kinds(report)
    axes = sub.subplots(1, len(units), sharey=True, squeeze=False)[0]
    for ax, unit in zip(axes, units, strict=True):
        at: dict[tuple[float, float], list[int]] = {}  # a spot → the rows of its methods
        for m in points:
            spent = measured(m, unit)
            assert spent is not None  # `_spend_units` keeps the units every method has
            x, low, high = spent
            acc = m["accuracy"]
            y = 100 * acc["value"]
            color = KIND_COLORS.get(kinds[m["id"]], NO_SCORER)
            ax.errorbar(
                [x],
                [y],
                xerr=_errors(x, low, high),
                yerr=_errors(y, 100 * acc["low"], 100 * acc["high"]),
                fmt=CAPPED_MARKER if m.get("capped") else "o",
                color=color,
                mfc="white" if m["ceiling"] else color,
                ms=4.5,
                capsize=2,
                lw=1,
            )
            at.setdefault((x, y), []).append(rows.of[id(m)] + 1)
        for (x, y), numbers in at.items():
            label = ax.annotate(
                ",".join(map(str, sorted(set(numbers)))),
                xy=(x, y),
                xytext=(3, 2),
                textcoords="offset points",
                fontsize=NOTE,
                color="0.3",
            )
            label.set_in_layout(False)  # many methods at one spot never squeeze the panel
        for budget in _budgets_in(report, unit):
            ax.axvline(budget, color=REFERENCE, lw=0.8, ls="--", zorder=0)
        if unit == "passes":
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=2))
            ax.xaxis.set_major_formatter(ScalarFormatter())
        else:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_flops(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(_spend_label(report, unit), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy %", fontsize=8)
    used = [k for k in KIND_COLORS if k in {kinds[m["id"]] for m in points}]
    keys = [
        Line2D([], [], ls="none", marker="o", color=KIND_COLORS[k], label=KIND_LABELS[k])
        for k in used
    ]
    if any(m["ceiling"] for m in points):
        keys.append(
            Line2D(
                [], [], ls="none", marker="o", color="0.3", mfc="white", label="ceiling (oracle)"
            )
        )
    if any(m.get("capped") for m in points):
        keys.append(
            Line2D(
                [],
                [],
                ls="none",
                marker=CAPPED_MARKER,
                color="0.3",
                label="capped: spent at most\nits declared cost",
            )
        )
    sub.legend(handles=keys, loc="outside right upper", fontsize=7)
    problems = "/".join(str(p) for p in sorted({m["problems"] for m in points}))
    sub.suptitle(
        f"Methods at what they spent, measured: means over n = {problems} problems; numbers: "
        f"their rows below\nbars: {_level(report)} bootstrap CIs over problems, of the spend "
        "and of the accuracy",
        fontsize=9,
    )


def pareto(report: Report) -> Figure | None:
    """Accuracy against compute: the pooled independent curves against passes per problem,
    one panel per selector family (Monte-Carlo points hollow); the methods at what they
    spent, measured, in passes and in FLOPs (when every method has them), each with the
    intervals of its spend and of its accuracy; and the methods at each budget, one row per
    method family with its interval (ceilings hollow)."""
    methods = [m for m in report["methods"] if m["accuracy"] and m["passes_per_problem"]]
    pooled = report["pooled"]
    has_pooled = bool(pooled and pooled["curves"])
    if not methods and not has_pooled:
        return None
    families = len(set(_row_keys(methods).values()))
    heights = [3.6] if has_pooled else []
    heights += [3.6, 1.4 + 0.24 * families] if methods else []
    fig = _figure(12, sum(heights))
    subs = fig.subfigures(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    if has_pooled:
        _pooled_panels(subs[0], report)
    if methods:
        rows = method_rows(methods)
        _spend_panels(subs[-2], report, methods, rows)
        _method_panels(subs[-1], report, methods, rows)
    return fig


# -- roc_auc_by_mask.png ---------------------------------------------------------------------


class AUCSeries(NamedTuple):
    """One series of the ROC-AUC figure: its label, its mask-ratio buckets (`BucketEntry`
    dicts) and the bucket of the fully decoded states it keeps apart from those buckets (None
    where it keeps none apart: they are in [0, 0.1), or it has none)."""

    label: str
    buckets: Sequence[Mapping[str, Any]]
    final: Mapping[str, Any] | None = None

    def in_buckets(self) -> bool:
        """Whether a bucket of the series has an AUC (a point in the mask panel)."""
        return any(_has_auc(b) for b in self.buckets)

    def in_final(self) -> bool:
        """Whether its fully decoded states apart have an AUC (a point in their panel)."""
        return _has_auc(self.final)


def _has_auc(bucket: Mapping[str, Any] | None) -> bool:
    return bucket is not None and bucket["auc"] is not None


def _final_bucket(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The bucket a `final` discrimination entry's states fall in (all are fully decoded)."""
    return next((b for b in entry["roc_auc_by_mask"] if b["n"]), None)


def _run_states(report: Report) -> dict[str, dict[str, Any]]:
    """Scorer → the buckets of its guided runs' states (`guided`) and the bucket of the
    independent pools' final candidates (`final`), from the discrimination entries."""
    by_scorer: dict[str, dict[str, Any]] = {}
    for e in report["diagnostics"]["discrimination"]:
        found = by_scorer.setdefault(e["scorer"], {"guided": [], "final": None})
        if e["states"] == "final":
            found["final"] = _final_bucket(e)
        else:
            found["guided"] = e["roc_auc_by_mask"]
    return by_scorer


def _controls_series(controls: Mapping[str, Any]) -> tuple[list[AUCSeries], str]:
    """The controls' series, with their fully decoded states apart only where the controls'
    slicing keeps them apart (`split`, and controls written before they had a `slicing`)."""
    apart = controls.get("slicing", "split") != "paper"
    series = [
        AUCSeries(
            row["scorer"].upper(), row.get("buckets") or [], row.get("final") if apart else None
        )
        for row in controls["auc_by_mask"]
    ]
    if apart:
        return series, (
            "mask buckets: the partial states of the collected trajectories (steps 0 < s < T); "
            "fully decoded: their fully decoded states"
        )
    return series, (
        "mask buckets: every stored state of the collected trajectories, the fully decoded "
        "ones (mask ratio 0) in [0, 0.1) as the paper slices them"
    )


def auc_series(report: Report) -> tuple[list[AUCSeries], str]:
    """The series the ROC-AUC figure draws, and a sentence on what their states are: the
    per-snapshot AUC of collected trajectories (`controls.auc_by_mask`) when the report has
    it, with the runs' final candidates of the scorers it lacks; else a series per scorer of
    the discrimination entries: its guided states by mask ratio (their fully decoded ones in
    [0, 0.1)) and its final candidates apart."""
    runs = _run_states(report)
    controls = dict(report).get("controls") or {}
    if controls.get("auc_by_mask"):
        series, states = _controls_series(controls)
        covered = {row["scorer"] for row in controls["auc_by_mask"]}
        finals = [
            AUCSeries(f"{s.upper()} (runs' final candidates)", [], f["final"])
            for s, f in runs.items()
            if s not in covered and _has_auc(f["final"])
        ]
        if finals:
            states += ";\nruns' final candidates: those of the runs' independent pools"
        return series + finals, states
    series = [AUCSeries(s.upper(), f["guided"], f["final"]) for s, f in runs.items()]
    parts = []
    if any(s.in_buckets() for s in series):
        parts.append(
            "mask buckets: scored states of guided runs, their fully decoded ones (mask ratio 0) "
            "in [0, 0.1)"
        )
    if any(s.in_final() for s in series):
        parts.append("fully decoded: final candidates of the independent pools")
    return series, "; ".join(parts)


def _with_gaps(buckets: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any] | None]:
    """The buckets in mask order with None where the AUC is undefined or a bucket is missing,
    so that a line never joins two buckets across an empty one."""
    out: list[Mapping[str, Any] | None] = []
    previous = None
    for b in sorted(buckets, key=lambda b: b["low"]):
        if previous is not None and not math.isclose(b["low"], previous["high"]):
            out.append(None)
        out.append(b if b["auc"] is not None else None)
        previous = b
    return out


def _dodge(members: Sequence[AUCSeries], s: AUCSeries, width: float) -> float:
    """The horizontal offset of `s` among the series sharing a panel, within `width`."""
    if s not in members or len(members) < 2:
        return 0.0
    return (members.index(s) - (len(members) - 1) / 2) * width / (len(members) + 1)


def _auc_point(ax: Axes, x: float, bucket: Mapping[str, Any], color: str) -> float:
    """A bucket's AUC at x with its interval; the interval's low end."""
    auc = bucket["auc"]
    interval = bucket["interval"] or {"low": auc, "high": auc}
    ax.errorbar(
        [x],
        [auc],
        yerr=_errors(auc, interval["low"], interval["high"]),
        fmt="o",
        color=color,
        ms=4.5,
        capsize=3,
        lw=1.2,
    )
    return interval["low"]


def _count(strip: Axes, x: float, row: int, n: int, color: str) -> None:
    """A bucket's n in its series' row of the strip above the panel."""
    strip.text(x, row, f"{n}", ha="center", va="center", fontsize=NOTE, color=color)


def _mask_panel(
    ax: Axes, strip: Axes, series: Sequence[AUCSeries], colors: Sequence[str]
) -> list[float]:
    """Each series' AUC at its buckets' midpoints (dodged), a line through adjacent buckets
    with an AUC, and the n of every bucket holding states; the intervals' low ends."""
    members = [s for s in series if s.in_buckets()]
    lows: list[float] = []
    for row, (s, color) in enumerate(zip(series, colors, strict=True)):
        offset = _dodge(members, s, 0.1)
        xs: list[float] = []
        ys: list[float] = []
        for b in _with_gaps(s.buckets):
            xs.append(math.nan if b is None else (b["low"] + b["high"]) / 2 + offset)
            ys.append(math.nan if b is None else b["auc"])
            if b is not None:
                lows.append(_auc_point(ax, xs[-1], b, color))
        if s in members:
            ax.plot(xs, ys, "-", color=color, lw=1.3, label=s.label)
        for b in s.buckets:
            if b["n"]:
                _count(strip, (b["low"] + b["high"]) / 2, row, b["n"], color)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xticks([i / 10 for i in range(11)])
    ax.set_xlabel("mask ratio of the scored state (points at bucket midpoints)", fontsize=9)
    return lows


def _final_panel(
    ax: Axes, strip: Axes, series: Sequence[AUCSeries], colors: Sequence[str]
) -> list[float]:
    """Each series' AUC on the fully decoded states it keeps apart, and their n; the
    intervals' low ends."""
    members = [s for s in series if s.in_final()]
    lows: list[float] = []
    for row, (s, color) in enumerate(zip(series, colors, strict=True)):
        if s.final is None or not s.final["n"]:
            continue
        if s in members:
            lows.append(_auc_point(ax, _dodge(members, s, 0.4), s.final, color))
        _count(strip, 0.0, row, s.final["n"], color)
    ax.set_xlim(-0.25, 0.25)
    ax.set_xticks([0], ["fully\ndecoded"])
    ax.grid(axis="x", visible=False)
    return lows


def _strip(strip: Axes, series: Sequence[AUCSeries], colors: Sequence[str]) -> None:
    """The rows of n above the panels: one per series, labelled and coloured as it is."""
    strip.set_ylim(len(series) - 0.5, -0.5)
    strip.set_yticks(range(len(series)), [s.label for s in series], fontsize=7)
    for label, color in zip(strip.get_yticklabels(), colors, strict=True):
        label.set_color(color)


def _gap_note(series: Sequence[AUCSeries]) -> str:
    """What a missing point means, for the kinds of bucket without an AUC the series have."""
    buckets = [b for s in series for b in s.buckets]
    kinds = {
        "holds no states": any(not b["n"] for b in buckets),
        "holds states of one class only (its n shown; no AUC)": any(
            b["n"] and b["auc"] is None for b in [*buckets, *(s.final for s in series if s.final)]
        ),
    }
    found = [kind for kind, present in kinds.items() if present]
    return f"No point where a bucket {' or '.join(found)}: a line breaks there." if found else ""


def roc_auc(report: Report, extra: Sequence[AUCSeries | tuple] = ()) -> Figure | None:
    """ROC-AUC by mask-ratio bucket of each series (`auc_series`, then `extra`: (label,
    buckets, fully decoded bucket apart or None)), with its clustered bootstrap interval, a
    point only where a bucket has an AUC; the fully decoded states a series keeps apart in a
    panel of their own at the left (none when no series keeps any apart); each bucket's n in
    a row per series above the panels."""
    series, states = auc_series(report)
    series += [AUCSeries(*s) for s in extra]
    series = [s for s in series if s.in_buckets() or s.in_final()]
    if not series:
        return None
    panels = [
        (draw, width)
        for draw, width, drawn in (
            (_final_panel, 1, any(s.in_final() for s in series)),
            (_mask_panel, 6, any(s.in_buckets() for s in series)),
        )
        if drawn
    ]
    strip_height = 0.2 + 0.14 * len(series)
    fig = _figure(max(5.0, 2.0 + sum(w for _, w in panels)), 4.8 + strip_height)
    grid = fig.subplots(
        2,
        len(panels),
        sharex="col",
        sharey="row",
        squeeze=False,
        height_ratios=[strip_height, 3.4],
        width_ratios=[w for _, w in panels],
    )
    colors = [f"C{i % 10}" for i in range(len(series))]
    lows: list[float] = []
    for (draw, _), strip, ax in zip(panels, grid[0], grid[1], strict=True):
        ax.axhline(0.5, color=REFERENCE, ls="--", lw=0.8, label="chance (0.5)")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        strip.tick_params(bottom=False, left=False)
        lows += draw(ax, strip, series, colors)
    _strip(grid[0, 0], series, colors)
    grid[0, -1].set_title("n: states in each bucket", fontsize=8, loc="left")
    grid[1, 0].set_ylabel(f"ROC-AUC ({_level(report)} CI)")
    grid[1, 0].set_ylim(min(0.45, min(lows) - 0.03), 1.02)
    keys = [
        Line2D(
            [], [], color=c, marker="o", ms=4.5, ls="-" if s.in_buckets() else "none", label=s.label
        )
        for s, c in zip(series, colors, strict=True)
    ]
    keys.append(Line2D([], [], color=REFERENCE, ls="--", lw=0.8, label="chance (0.5)"))
    grid[1, -1].legend(handles=keys, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Scorer discrimination by mask ratio", fontsize=10)
    _caption(
        fig,
        f"Error bars: {_level(report)} bootstrap CIs, problems resampled (clustered by problem); "
        "n (the rows above the panels): the states in each bucket.\n"
        + "\n".join(filter(None, [f"{states}." if states else "", _gap_note(series)])),
    )
    return fig


# -- pool_diversity.png ----------------------------------------------------------------------

POOL_PANELS = (
    ("oracle", "Oracle@K (%)", 100.0),
    ("unique_answers", "unique valid answers", 1.0),
    ("entropy_bits", "answer entropy (bits)", 1.0),
)


def pool_diversity(report: Report) -> Figure | None:
    """Oracle@K, unique answers and answer entropy per pool (one row each, short labels),
    coloured by the pool's kind, with the report's bootstrap intervals over problems."""
    pools = report["diagnostics"]["pools"]
    if not pools:
        return None
    labels = short_labels([p["pool"] for p in pools])
    fig = _figure(11, 1.6 + 0.3 * len(pools))
    axes = fig.subplots(1, len(POOL_PANELS), sharey=True)
    ys = list(range(len(pools)))
    colors = [KIND_COLORS.get(p["kind"], NO_SCORER) for p in pools]
    for ax, (key, title, scale) in zip(axes, POOL_PANELS, strict=True):
        values = [scale * p[key]["value"] for p in pools]
        lows = [scale * (p[key]["value"] - p[key]["low"]) for p in pools]
        highs = [scale * (p[key]["high"] - p[key]["value"]) for p in pools]
        ax.barh(ys, values, color=colors, xerr=[lows, highs], capsize=2, height=0.7)
        ax.set_xlabel(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_xlim(0, 100)
    axes[0].set_yticks(ys, [f"{labels[p['pool']]} (K={p['size']})" for p in pools])
    axes[0].set_ylim(len(pools) - 0.5, -0.5)
    used = [k for k in KIND_COLORS if k in {p["kind"] for p in pools}]
    fig.legend(
        handles=[Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in used],
        loc="outside right upper",
        fontsize=8,
    )
    problems = "/".join(str(n) for n in sorted({p["problems"] for p in pools}))
    fig.suptitle("Pool diversity: K candidates per problem", fontsize=10)
    _caption(
        fig,
        f"Means over n = {problems} problems; error bars: {_level(report)} bootstrap CIs over "
        "problems. Labels: the strategy and the options that tell its pools apart.",
    )
    return fig


# -- smc_ess.png -----------------------------------------------------------------------------

ESS_FRACTION, RESAMPLE_FRACTION = 0.5, 0.75  # the smc strategy's defaults


def _number(value: Any) -> float | None:
    """A numeric option's value; None for a missing or non-numeric one."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if is_number else None


def particle_count(report: Report, entry: Mapping[str, Any]) -> int | None:
    """K of an SMC entry: its spec's `k`, else the size of the pool its methods share."""
    k = _number(strategy_options(entry["pool"])[1].get("k"))
    if k:
        return int(k)
    methods = set(entry["methods"])
    sizes = [p["size"] for p in report["diagnostics"]["pools"] if methods & set(p["methods"])]
    return sizes[0] if sizes else None


def resampled_checkpoints(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The checkpoints where some problem's particles resampled: resampling sets the ESS to K
    and happens only below the threshold, so a mean ESS after that differs from the one
    before; where it is equal, nothing resampled and there is no 'after'."""
    return [c for c in rows if c["ess_after"] != c["ess_before"]]


def _ess_panel(ax: Axes, entry: Mapping[str, Any], k: int, label: str) -> None:
    """One SMC run: ESS/K before resampling at each checkpoint, after it where a problem
    resampled, the resampling threshold and the tempering target of its spec."""
    options = strategy_options(entry["pool"])[1]
    temper = _number(options.get("ess_fraction")) or ESS_FRACTION
    resample = _number(options.get("resample_fraction"))
    resample = RESAMPLE_FRACTION if resample is None else resample
    rows = entry["by_checkpoint"]
    xs = [c["index"] for c in rows]
    ax.axhline(resample, color="tab:red", ls="--", lw=1, label=f"resample below {resample:g}·K")
    ax.axhline(temper, color=REFERENCE, ls=":", lw=1.2, label=f"tempering target {temper:g}·K")
    after = resampled_checkpoints(rows)
    if after:
        ax.plot(
            [c["index"] for c in after],
            [c["ess_after"] / k for c in after],
            "s",
            color="tab:blue",
            ms=9,
            mfc="white",
            mew=1.3,
            label="after resampling",
        )
    before = [c["ess_before"] / k for c in rows]
    ax.plot(xs, before, "o-", color="tab:blue", ms=4.5, lw=1, label="before resampling")
    ax.set_xticks(xs)
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("checkpoint index", fontsize=9)
    ax.set_title(
        f"{label} (K={k}), n = {entry['checkpoints'] // len(rows)} problems\n"
        f"resampled at {100 * entry['resample_rate']:.0f}% of checkpoints",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)


def _named_handles(axes: Sequence[Axes]) -> dict[str, Any]:
    """Every labelled artist of the panels, one per label, in the order first drawn with
    "before resampling" last (after "after resampling", which a panel may lack)."""
    found: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(name, handle)
    return {name: found[name] for name in sorted(found, key=lambda n: n == "before resampling")}


def smc_ess(report: Report) -> Figure | None:
    """ESS/K before resampling at each SMC checkpoint (its report.json index) and after it
    where particles resampled, one panel per SMC run, with the tempering target and the
    resampling threshold; the legend at the right, below the title."""
    entries = [
        (e, particle_count(report, e))
        for e in report["diagnostics"]["particles"]
        if e["by_checkpoint"]
    ]
    entries = [(e, k) for e, k in entries if k]
    if not entries:
        return None
    labels = short_labels([e["pool"] for e, _ in entries])
    fig = _figure(3.2 * len(entries) + 2.6, 4.2)
    axes = fig.subplots(1, len(entries), sharey=True, squeeze=False)[0]
    for ax, (e, k) in zip(axes, entries, strict=True):
        _ess_panel(ax, e, k, labels[e["pool"]])
    axes[0].set_ylabel("ESS / K (mean over problems)")
    handles = _named_handles(axes)
    fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=8)
    fig.suptitle("SMC: effective sample size as a share of the K particles", fontsize=10)
    _caption(
        fig,
        "ESS/K at each checkpoint, averaged over problems; 1 = uniform weights.\n"
        "After resampling: only at checkpoints where some problem's particles resampled.",
    )
    return fig


FIGURES: dict[str, Callable[[Any], Figure | None]] = {
    "pareto": pareto,
    "roc_auc_by_mask": roc_auc,
    "pool_diversity": pool_diversity,
    "smc_ess": smc_ess,
}


def render(report: Report, out: Path) -> dict[str, str]:
    """Save every figure the report has content for as out/NAME.png; {name: file name}."""
    written = {}
    for name, draw in FIGURES.items():
        fig = draw(report)
        if fig is None:
            continue
        fig.savefig(out / f"{name}.png")
        written[name] = f"{name}.png"
    return written
