"""The report's PNG figures, drawn from report.json's content alone (`schema.Report`).

Figures are drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot,
so they render without a display and leave no global state behind. Each function returns
the figure, or None when the report has nothing to draw for it; `render` saves those that
exist and returns {figure name: file name}.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dllmbench.analysis.pooled import MAJORITY_INVALID_VOTE
from dllmbench.core.schema import Report

DPI = 120
INDEPENDENT, GUIDED = "tab:blue", "tab:orange"
COLORS = [f"C{i}" for i in range(10)]  # methods, by family
POOLED_COLORS = list(colormaps["Dark2"].colors)  # pooled curves, dashed


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


def _errors(value: float, low: float, high: float) -> list[list[float]]:
    return [[max(0.0, value - low)], [max(0.0, high - value)]]


def _pooled_lines(ax: Any, report: Report) -> None:
    pooled = report["pooled"]
    for i, curve in enumerate(pooled["curves"] if pooled else []):
        xs = [p["passes"] for p in curve["points"]]
        acc = [p["accuracy"] for p in curve["points"]]
        color = POOLED_COLORS[i % len(POOLED_COLORS)]
        line = ax.plot(xs, [100 * a["value"] for a in acc], lw=1.2, ls="--", color=color)[0]
        line.set_label(f"pooled {selector_label(curve['selector'])}")
        lows, highs = [100 * a["low"] for a in acc], [100 * a["high"] for a in acc]
        ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.1, lw=0)


MARKERS = "oDs^v<>pPX*h"


def pareto(report: Report) -> Figure | None:
    """Accuracy against passes per problem: every method at every budget with its interval
    (one colour and marker per family, ceilings hollow), and the pooled independent curves
    with their bands."""
    methods = [m for m in report["methods"] if m["accuracy"] and m["passes_per_problem"]]
    if not methods:
        return None
    fig = _figure(11, 6)
    ax = fig.add_subplot()
    _pooled_lines(ax, report)
    families = list(dict.fromkeys(m["family"] or m["id"] for m in methods))
    seen: set[str] = set()
    for m in methods:
        if m["id"] in seen:  # one point per method: its accuracy is the same at every budget
            continue
        seen.add(m["id"])
        i = families.index(m["family"] or m["id"])
        acc, x = m["accuracy"], m["passes_per_problem"]
        color = COLORS[i % len(COLORS)]
        ax.errorbar(
            [x],
            [100 * acc["value"]],
            yerr=_errors(100 * acc["value"], 100 * acc["low"], 100 * acc["high"]),
            fmt=MARKERS[i % len(MARKERS)],
            color=color,
            mfc="white" if m["ceiling"] else color,
            ms=6,
            capsize=2,
            label=m["id"],
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("passes per problem (log scale)")
    ax.set_ylabel("accuracy % (95% CI)")
    ax.set_title(f"{report['task']['name']}: accuracy against compute (hollow: ceilings)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def roc_auc(report: Report) -> Figure | None:
    """ROC-AUC by mask-ratio bucket for each scorer (guided states; final states at 0)."""
    entries = report["diagnostics"]["discrimination"]
    if not any(b["auc"] is not None for e in entries for b in e["roc_auc_by_mask"]):
        return None
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for e in entries:
        points = [b for b in e["roc_auc_by_mask"] if b["auc"] is not None]
        if not points:
            continue
        xs = [(b["low"] + b["high"]) / 2 for b in points]
        ys = [b["auc"] for b in points]
        lows = [b["auc"] - (b["interval"] or {"low": b["auc"]})["low"] for b in points]
        highs = [(b["interval"] or {"high": b["auc"]})["high"] - b["auc"] for b in points]
        ax.errorbar(
            xs,
            ys,
            yerr=[lows, highs],
            fmt="o-",
            capsize=3,
            ms=4,
            label=f"{e['scorer']} ({e['states']} states)",
        )
    ax.axhline(0.5, color="gray", ls="--", lw=0.8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("mask ratio of the scored state (bucket midpoint)")
    ax.set_ylabel("ROC-AUC (95% CI)")
    ax.set_title("Scorer discrimination by mask ratio")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


POOL_PANELS = (
    ("oracle", "Oracle@K", 100.0),
    ("unique_answers", "unique valid answers", 1.0),
    ("entropy_bits", "answer entropy (bits)", 1.0),
)


def pool_diversity(report: Report) -> Figure | None:
    """Oracle@K, unique answers and answer entropy per pool, independent and guided pools
    side by side, with 95% intervals over problems."""
    pools = report["diagnostics"]["pools"]
    if not pools:
        return None
    fig = _figure(max(7.0, 1.1 * len(pools) + 3), 4.5)
    axes = fig.subplots(1, len(POOL_PANELS))
    xs = list(range(len(pools)))
    colors = [INDEPENDENT if p["kind"] == "plain" else GUIDED for p in pools]
    for ax, (key, title, scale) in zip(axes, POOL_PANELS, strict=True):
        values = [scale * p[key]["value"] for p in pools]
        lows = [scale * (p[key]["value"] - p[key]["low"]) for p in pools]
        highs = [scale * (p[key]["high"] - p[key]["value"]) for p in pools]
        ax.bar(xs, values, color=colors, yerr=[lows, highs], capsize=3)
        ax.set_xticks(
            xs, [f"{p['pool']} (K={p['size']})" for p in pools], rotation=60, ha="right", fontsize=6
        )
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Pool diversity (blue: independent, orange: guided)", fontsize=10)
    return fig


def smc_ess(report: Report) -> Figure | None:
    """Mean ESS before and after resampling at each SMC checkpoint, per SMC run."""
    entries = [e for e in report["diagnostics"]["particles"] if e["by_checkpoint"]]
    if not entries:
        return None
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for e in entries:
        xs = [c["index"] + 1 for c in e["by_checkpoint"]]
        before = ax.plot(
            xs, [c["ess_before"] for c in e["by_checkpoint"]], "o-", label=f"{e['pool']}: before"
        )[0]
        ax.plot(
            xs,
            [c["ess_after"] for c in e["by_checkpoint"]],
            "s--",
            color=before.get_color(),
            label=f"{e['pool']}: after",
        )
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("effective sample size (mean over problems)")
    ax.set_title("SMC: ESS before and after each checkpoint")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
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
