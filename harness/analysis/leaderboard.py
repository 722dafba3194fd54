"""The leaderboard: contenders ranked by accuracy, ceilings shown apart; a run at several
budgets has one such table per budget."""

from __future__ import annotations

from rich.table import Table

from dllmbench.core.schema import MethodResult, Results

COLUMNS = (
    "method",
    "configuration",
    "passes",
    "share",
    "acc %",
    "{level}% CI",
    "Δ vs {ref} [{level}% CI]",
    "McNemar p",
    "oracle %",
    "unique",
)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def budgets(results: Results) -> list[int]:
    """The run's budgets, ascending."""
    return list(results["budgets"])


def rows(results: Results, budget: int | None = None) -> list[tuple[bool, list[str]]]:
    """(is_ceiling, cells) per method (at `budget`; None: every entry): contenders by
    accuracy, then ceilings."""
    methods = [m for m in results["methods"] if budget is None or m.get("budget") == budget]
    ranked = sorted(
        (m for m in methods if not m["ceiling"]),
        key=lambda m: -(m["accuracy"]["value"] if m["accuracy"] else -1),
    )
    ceilings = [m for m in methods if m["ceiling"]]
    return [(m["ceiling"], _cells(m)) for m in ranked + ceilings]


def _cells(m: MethodResult) -> list[str]:
    """The leaderboard cells of one method, in `COLUMNS` order."""
    acc = m["accuracy"]
    delta = m.get("delta_vs_reference")
    pool = m.get("pool")
    return [
        m["id"],
        m["spec"],
        f"{m['passes_per_problem']:.0f}" if m["passes_per_problem"] is not None else "–",
        f"{100 * m['share_of_budget']:.1f}%",
        _pct(acc["value"]) if acc and m["problems"] else "–",
        f"[{_pct(acc['low'])}, {_pct(acc['high'])}]" if acc and m["problems"] else "–",
        (
            f"{100 * delta['value']:+.2f} [{100 * delta['low']:+.2f}, {100 * delta['high']:+.2f}]"
            if delta
            else "–"
        ),
        f"{delta['mcnemar_p']:.2g}" if delta and "mcnemar_p" in delta else "–",
        _pct(pool["oracle"]["value"]) if pool else "–",
        f"{pool['unique_answers']:.2f}" if pool else "–",
    ]


def headers(results: Results) -> list[str]:
    ref = results.get("reference") or "reference"
    level = f"{100 * results['level']:g}"
    return [c.format(ref=ref, level=level) for c in COLUMNS]


# Columns a narrow terminal keeps, most wanted first; the method label is always shown in full.
PRIORITY = (4, 6, 2, 7, 5, 8, 3, 9, 1)
CONFIG_WIDTH = (16, 40)  # the configuration column folds within these widths
CEILINGS = "ceilings (not ranked):"


def _fit(results: Results, width: int | None, budget: int | None = None) -> list[int]:
    """Indices of the columns that fit in `width` characters (all when `width` is None)."""
    if width is None:
        return list(range(len(COLUMNS)))
    cells = [cells for _, cells in rows(results, budget)]
    natural = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers(results))]
    natural[0] = max(natural[0], len(CEILINGS))
    natural[1] = min(max(natural[1], CONFIG_WIDTH[0]), CONFIG_WIDTH[1])
    chosen, used = [0], natural[0] + 4  # a column costs its text, two spaces and a border
    for i in PRIORITY:
        needed = (CONFIG_WIDTH[0] if i == 1 else natural[i]) + 3
        if used + needed <= width:
            chosen.append(i)
            used += needed
    return sorted(chosen)


def rich_table(
    results: Results, title: str = "", width: int | None = None, budget: int | None = None
) -> Table:
    """The leaderboard (at `budget`; None: every entry) for a terminal `width` columns wide
    (None: every column).

    When narrow, the least wanted columns go first (configuration, unique, share, ...);
    every method's label stays whole. Ceilings sit below a line, in a section of their own.
    """
    keep = _fit(results, width, budget)
    table = Table(title=title or None)
    names = headers(results)
    for i in keep:
        if i == 1:
            table.add_column(
                names[i], min_width=CONFIG_WIDTH[0], max_width=CONFIG_WIDTH[1], overflow="fold"
            )
        else:
            table.add_column(names[i], justify="left" if i == 0 else "right", no_wrap=True)
    previous_ceiling = False
    for ceiling, cells in rows(results, budget):
        if ceiling and not previous_ceiling:
            table.add_section()
            table.add_row(CEILINGS, *[""] * (len(keep) - 1), style="italic")
        table.add_row(*[cells[i] for i in keep], style="dim" if ceiling else None)
        previous_ceiling = ceiling
    return table


def markdown(results: Results, title: str = "") -> str:
    """The leaderboard as Markdown; at several budgets, a section `## Budget B` per budget."""
    lines = [f"# {title}", ""] if title else []
    several = budgets(results)
    if len(several) == 1:
        return "\n".join(lines + _markdown_table(results, None)) + "\n"
    for budget in several:
        lines += [f"## Budget {budget}", "", *_markdown_table(results, budget), ""]
    return "\n".join(lines[:-1]) + "\n"


def _markdown_table(results: Results, budget: int | None) -> list[str]:
    head = headers(results)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ceilings_started = False
    for ceiling, cells in rows(results, budget):
        if ceiling and not ceilings_started:
            lines += [
                "",
                "Ceilings (read labels; not ranked):",
                "",
                "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head),
            ]
            ceilings_started = True
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines
