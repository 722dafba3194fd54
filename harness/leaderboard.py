"""The leaderboard: contenders ranked by accuracy, ceilings shown apart."""

from __future__ import annotations

from typing import Any

from rich.table import Table

COLUMNS = (
    "method",
    "configuration",
    "passes",
    "share",
    "acc %",
    "95% CI",
    "Δ vs {ref} [95% CI]",
    "oracle %",
    "unique",
)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def rows(results: dict[str, Any]) -> list[tuple[bool, list[str]]]:
    """(is_ceiling, cells) per method: contenders by accuracy, then ceilings."""
    methods = results["methods"]
    ranked = sorted(
        (m for m in methods if not m["ceiling"]),
        key=lambda m: -(m["accuracy"]["value"] if m["accuracy"] else -1),
    )
    ceilings = [m for m in methods if m["ceiling"]]
    out = []
    for m in ranked + ceilings:
        acc = m["accuracy"]
        delta = m.get("delta_vs_reference")
        pool = m.get("pool")
        cells = [
            m["id"],
            m["spec"],
            f"{m['passes_per_problem']:.0f}" if m["passes_per_problem"] is not None else "–",
            f"{100 * m['share_of_budget']:.1f}%",
            _pct(acc["value"]) if m["problems"] else "–",
            f"[{_pct(acc['low'])}, {_pct(acc['high'])}]" if m["problems"] else "–",
            (
                f"{100 * delta['value']:+.2f} "
                f"[{100 * delta['low']:+.2f}, {100 * delta['high']:+.2f}]"
                if delta
                else "–"
            ),
            _pct(pool["oracle"]["value"]) if pool else "–",
            f"{pool['unique_answers']:.2f}" if pool else "–",
        ]
        out.append((m["ceiling"], cells))
    return out


def headers(results: dict[str, Any]) -> list[str]:
    ref = results.get("reference") or "reference"
    return [c.format(ref=ref) for c in COLUMNS]


def rich_table(results: dict[str, Any], title: str = "") -> Table:
    table = Table(title=title or None)
    for i, h in enumerate(headers(results)):
        if i == 1:
            table.add_column(h, min_width=16, max_width=40, overflow="fold")
        else:
            table.add_column(
                h,
                justify="left" if i == 0 else "right",
                no_wrap=i > 0,
                max_width=32 if i == 0 else None,
                overflow="fold",
            )
    previous_ceiling = False
    for ceiling, cells in rows(results):
        if ceiling:
            if not previous_ceiling:
                table.add_section()
            cells = [f"{cells[0]} (ceiling)", *cells[1:]]
        table.add_row(*cells, style="dim" if ceiling else None)
        previous_ceiling = ceiling
    return table


def markdown(results: dict[str, Any], title: str = "") -> str:
    head = headers(results)
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ceilings_started = False
    for ceiling, cells in rows(results):
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
    return "\n".join(lines) + "\n"
