"""The scorer controls as Markdown, from controls.json's content alone (`schema.Controls`):
controls.md of `dllmbench diagnose`, and the section `dllmbench report --controls` adds."""

from __future__ import annotations

from typing import Any

from dllmbench.analysis.leaderboard import disagree_note, disagrees
from dllmbench.analysis.report_markdown import (
    ci_cell,
    delta_cell,
    md_table,
    number_cell,
    p_value,
)
from dllmbench.core.schema import Controls

# what each snapshot slicing puts in the mask-ratio buckets (analysis.controls_slicing)
SLICINGS = {
    "paper": "the paper's slicing: every stored state, from the all-mask canvas (step 0, in "
    "[0.9, 1.0]) to the fully decoded state (mask ratio 0, in [0, 0.1))",
    "split": "the project's split slicing: the stored states at steps 0 < s < T, the fully "
    "decoded states only apart and the all-mask canvas left out",
}
INITIAL = {
    "paper": "the all-mask canvas, step 0",
    "split": "the first stored step after the all-mask canvas",
}


def _opt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _bucket_cell(b: dict[str, Any]) -> str:
    return "–" if b["auc"] is None else f"{number_cell(b['interval'], 3)} (n={b['n']})"


def md_auc_by_mask(controls: Controls) -> list[str]:
    rows = controls["auc_by_mask"]
    if not rows:
        return []
    slicing = controls["slicing"]
    other = controls["alternative"]["slicing"]
    lines = [
        "### ROC-AUC by mask ratio, every stored state",
        "",
        "ROC-AUC of each scorer against the trajectory's final correctness by mask-ratio "
        f"bucket under {SLICINGS[slicing]}; and over the fully decoded states alone. 95% "
        "bootstrap intervals clustered by problem; – where a bucket is empty or holds one "
        f"class. `dllmbench report --controls DIR --slicing {other}` shows {SLICINGS[other]}.",
        "",
    ]
    headers = ["mask ratio", *(r["scorer"] for r in rows)]
    table = [["fully decoded", *(_bucket_cell(r["final"]) for r in rows)]]
    for b in range(len(rows[0]["buckets"])):
        low, high = rows[0]["buckets"][b]["low"], rows[0]["buckets"][b]["high"]
        label = f"[{low:.1f}, {high:.1f}{']' if b == len(rows[0]['buckets']) - 1 else ')'}"
        table.append([label, *(_bucket_cell(r["buckets"][b]) for r in rows)])
    return lines + md_table(headers, table)


def md_kendall(controls: Controls) -> list[str]:
    rows = [
        (r["scorer"], _opt(r["median"]), _opt(r["mean"]), str(r["problems"]), str(r["undefined"]))
        for r in controls["kendall_tau"]
    ]
    if not rows:
        return []
    return [
        "### Within-problem Kendall τ, fully decoded states",
        "",
        "τ-b between score and correctness within each problem holding both; the median first "
        "(the paper's headline statistic), then the mean.",
        "",
        *md_table(("scorer", "median τ", "mean τ", "problems", "undefined"), rows),
    ]


def _risk_cell(r: dict[str, Any]) -> str:
    """The risk among the groups at risk, then over all groups."""
    return (
        f"{ci_cell(r['rate'])} ({r['lost']}/{r['at_risk']}); "
        f"all groups {ci_cell(r['rate_all_groups'])} ({r['lost']}/{r['groups']})"
    )


def md_removal(controls: Controls) -> list[str]:
    rows = controls["removal_risk"]
    if not rows:
        return []
    lines = [
        "### Removal risk: the offline counterfactual",
        "",
        f"Each problem's trajectories in groups of K = {controls['width']}; at the initial "
        f"({INITIAL[controls['slicing']]}), middle and final stored states a top-M cut by "
        "score keeps M of each group. Risk: of the groups holding a trajectory that ends "
        "correct, the share whose cut removed every such trajectory (lost/at risk: the "
        "project's reading of the paper's denominator); after it the same losses over all "
        "groups (lost/groups). %, 95% bootstrap intervals clustered by problem.",
        "",
    ]
    for scorer in dict.fromkeys(r["scorer"] for r in rows):
        mine = [r for r in rows if r["scorer"] == scorer]
        states = list(dict.fromkeys(r["state"] for r in mine))
        keeps = sorted({r["keep"] for r in mine})
        table = []
        for keep in keeps:
            cells = []
            for state in states:
                hit = next((r for r in mine if r["state"] == state and r["keep"] == keep), None)
                cells.append("–" if hit is None else _risk_cell(hit))
            table.append([f"top-{keep}", *cells])
        headers = ["cut"]
        for state in states:
            first = next(r for r in mine if r["state"] == state)
            headers.append(f"{state} (step {first['step']}, mask {first['mask_ratio']:.2f})")
        lines += [f"{scorer}:", "", *md_table(headers, table)]
    return lines


def md_readout(controls: Controls) -> list[str]:
    rows = [
        (
            f"{r['mean']} → {r['last']}",
            str(r["attention"]),
            number_cell(r["mean_auc"], 3),
            number_cell(r["last_auc"], 3),
            number_cell(r["change"], 3),
        )
        for r in controls["readout"]
    ]
    lines = ["### Readout: mean pooling against the last token", ""]
    if not rows:
        return [*lines, "No pair of scorers differing only in pooling was given.", ""]
    return [
        *lines,
        "Final-state ROC-AUC of two scorers trained alike but for the readout, and the change "
        "(last − mean, paired over the same states).",
        "",
        *md_table(("scorers", "attention", "mean-pool AUC", "last-token AUC", "change"), rows),
    ]


def md_suffix(controls: Controls) -> list[str]:
    rows = [
        (
            r["scorer"],
            str(r["n"]),
            number_cell(r["original"], 3),
            number_cell(r["ablated"], 3),
            number_cell(r["change"], 3),
        )
        for r in controls["suffix_ablation"]
    ]
    lines = ["### Suffix ablation", ""]
    if not rows:
        return [*lines, "No scorer of partial states was given.", ""]
    return [
        *lines,
        "ROC-AUC over every stored state with the right half of the generated region "
        "replaced by the mask token, against the original states (paired change).",
        "",
        *md_table(("scorer", "states", "original AUC", "ablated AUC", "change"), rows),
    ]


def md_reversed(controls: Controls) -> list[str]:
    rows = []
    for r in controls["reversed_input"]:
        ref = r["reference"]
        rows.append(
            (
                r["scorer"],
                str(r["n"]),
                number_cell(r["forward"], 3),
                number_cell(r["reversed"], 3),
                number_cell(r["averaged"], 3),
                "–" if ref is None else f"{ref['scorer']}: {number_cell(ref['auc'], 3)}",
                "–" if ref is None else number_cell(ref["gap"], 3),
            )
        )
    lines = ["### Reversed-input causal scoring", ""]
    if not rows:
        return [*lines, "No causal scorer was given.", ""]
    return [
        *lines,
        "A causal scorer's ROC-AUC over every state it scored, on the solution as written, "
        "reversed (prompt kept), and on the average of the two scores; gap: averaged − the "
        "bidirectional scorer of the same settings.",
        "",
        *md_table(
            ("scorer", "states", "forward", "reversed", "averaged", "bidirectional", "gap"), rows
        ),
    ]


def md_reranker(controls: Controls) -> list[str]:
    rows = controls["reranker"]
    if not rows:
        return []
    sizes = [p["n"] for p in rows[0]["points"]]
    lines = [
        "### Scorers as best-of-N rerankers",
        "",
        "Expected accuracy (%) of the top-scored of N trajectories drawn uniformly from each "
        "problem's, against a uniform pick of the N, and the paired difference (pp); sign "
        "check: mean score of correct and incorrect final states, and the share of problems "
        "holding both whose correct states score higher on average.",
        "",
    ]
    table = []
    for r in rows:
        by_n = {p["n"]: p for p in r["points"]}
        table.append(
            [
                r["scorer"],
                *(
                    f"{ci_cell(by_n[n]['scorer'])}, {delta_cell(by_n[n]['difference'])}"
                    for n in sizes
                ),
                f"{_opt(r['mean_correct'], 2)} / {_opt(r['mean_incorrect'], 2)}",
                f"{_opt(r['separated'], 2)} of {r['mixed']}",
            ]
        )
    random = {p["n"]: p["random"] for p in rows[0]["points"]}
    table.append(["uniform pick", *(ci_cell(random[n]) for n in sizes), "–", "–"])
    headers = ["scorer", *(f"N = {n}: acc, Δ vs uniform" for n in sizes)]
    return lines + md_table([*headers, "mean score ✓ / ✗", "separated"], table)


def md_swap(controls: Controls) -> list[str]:
    swap = controls["scorer_swap"]
    acc = [(name, ci_cell(ci)) for name, ci in swap["accuracy"].items()]
    diffs = [(f"{d['a']} − {d['b']}", delta_cell(d), p_value(d)) for d in swap["differences"]]
    return [
        "### Scorer swap on one pool",
        "",
        f"Every scorer reranks the same {swap['size']} fully decoded trajectories of each "
        "problem (argmax; random: a uniform pick's expected accuracy).",
        "",
        *md_table(("selector", "accuracy %"), acc),
        *md_table(("difference", "pp", "McNemar p"), diffs),
        *(
            [disagree_note(controls["level"]), ""]
            if any(map(disagrees, swap["differences"]))
            else []
        ),
    ]


def sections(controls: Controls) -> list[str]:
    """Every control's section, without a title."""
    return [
        *md_auc_by_mask(controls),
        *md_kendall(controls),
        *md_removal(controls),
        *md_readout(controls),
        *md_suffix(controls),
        *md_reversed(controls),
        *md_reranker(controls),
        *md_swap(controls),
    ]


def markdown(controls: Controls) -> str:
    """controls.md."""
    col = controls["collection"]
    task = col["task"]
    head = [
        "# Scorer controls",
        "",
        f"Collection `{col['path']}`: {task['name']}/{task['split']}, {col['problems']} "
        f"problems × {col['n']} trajectories, {col['states']} stored states at steps "
        f"{', '.join(map(str, col['snapshot_steps']))} of {col['sampling']['total_steps']}; "
        f"{100 * col['correct']:.1f}% of the trajectories end correct.",
        "",
    ]
    return "\n".join(head + sections(controls))
