"""The leaderboard: contenders ranked by accuracy, ceilings shown apart, each with what it
spent per problem (measured means, in passes and in FLOPs); a run at several budgets has one
such table per budget."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.table import Table

from dllmbench.core.flops import format_flops
from dllmbench.core.schema import MethodResult, Results

COLUMNS = (
    "method",
    "configuration",
    "passes",
    "FLOPs",
    "share",
    "acc %",
    "{level}% CI",
    "Δ vs {ref} [{level}% CI]",
    "McNemar p",
    "oracle %",
    "unique",
)


# under a table that holds a capped method: what its passes cell says
CAPPED_NOTE = (
    "(≤C): capped, its declared cost of C passes a cap it may spend less than; "
    "passes and FLOPs are measured means per problem."
)


# under a table that holds a method decoded with an approximate cache
APPROXIMATE_NOTE = (
    "≈: decoded with an approximate KV cache (Fast-dLLM's prefix or dual cache); "
    "dllmbench report RUN --exact EXACT_RUN shows how often its answers are exact decoding's."
)


# after a McNemar p-value whose test and the paired interval disagree (`mcnemar_agrees`)
DISAGREE_MARK = "†"


def disagree_note(level: float) -> str:
    """Under a table where a paired interval and McNemar's test disagree: what † means."""
    alpha = f"{100 * (1 - level):.3g}%"
    return (
        f"†: the Δ interval and McNemar's test disagree: the interval excludes 0 while "
        f"p ≥ {alpha}, or holds 0 while p < {alpha}. The interval resamples every problem, "
        "the test conditions on the problems where the two methods differ, so with few of "
        "those they can disagree (4 better, 0 worse: the interval excludes 0, p = 0.125); "
        "see docs/results-schema.md."
    )


# under a table that holds a Majority whose failed extractions vote (majority:invalid=vote)
INVALID_VOTE_NOTE = (
    "majority:invalid=vote: failed extractions count as one answer, never correct, that can "
    "win the vote (the paper's scripts' count, `--preset paper`); the default, invalid=drop, "
    "keeps them out of the vote."
)


def disagrees(delta: Mapping[str, Any] | None) -> bool:
    """A paired difference whose interval and McNemar's test disagree (`mcnemar_agrees`)."""
    return bool(delta) and delta.get("mcnemar_agrees") is False


def invalid_votes(spec: str) -> bool:
    """A method spec whose selector is Majority with invalid answers voting."""
    name, _, options = spec.partition("+")[2].partition(":")
    return name == "majority" and "invalid=vote" in options.split(",")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def passes_cell(m: MethodResult) -> str:
    """The passes a method spent per problem, a measured mean: whole when it is (an exact
    method spends its planned passes on every problem), else to one decimal; a capped method's
    cap follows, `(≤C)`."""
    mean = m["passes_per_problem"]
    if mean is None:
        return "–"
    text = f"{mean:.0f}" if mean == round(mean) else f"{mean:.1f}"
    return f"{text} (≤{m['planned_passes']})" if m.get("capped") else text


def flops_cell(m: MethodResult) -> str:
    """The FLOPs a method spent per problem, a measured mean; – when unknown (a model of
    unknown shape) or not recorded (a run made before FLOPs were)."""
    return format_flops(m.get("flops_per_problem"))


def budgets(results: Results) -> list[int]:
    """The run's budgets, ascending."""
    return list(results["budgets"])


def _at(results: Results, budget: int | None) -> list[MethodResult]:
    """The method entries at `budget` (None: every entry)."""
    return [m for m in results["methods"] if budget is None or m.get("budget") == budget]


def capped_note(results: Results, budget: int | None = None) -> str | None:
    """What the marks of the methods at `budget` mean (`CAPPED_NOTE` for a capped one,
    `APPROXIMATE_NOTE` for an approximately decoded one, `disagree_note` for a † p-value,
    `INVALID_VOTE_NOTE` for a Majority whose invalid answers vote), else None."""
    methods = _at(results, budget)
    notes = [
        note
        for note, key in ((CAPPED_NOTE, "capped"), (APPROXIMATE_NOTE, "approximate"))
        if any(m.get(key) for m in methods)
    ]
    if any(disagrees(m.get("delta_vs_reference")) for m in methods):
        notes.append(disagree_note(results["level"]))
    if any(invalid_votes(m["spec"]) for m in methods):
        notes.append(INVALID_VOTE_NOTE)
    return " ".join(notes) or None


def p_cell(delta: Mapping[str, Any] | None, digits: str = ".2g") -> str:
    """A paired difference's McNemar p, † when it and the interval disagree; – without."""
    if not delta or "mcnemar_p" not in delta:
        return "–"
    mark = f" {DISAGREE_MARK}" if disagrees(delta) else ""
    return f"{delta['mcnemar_p']:{digits}}{mark}"


def rows(results: Results, budget: int | None = None) -> list[tuple[bool, list[str]]]:
    """(is_ceiling, cells) per method (at `budget`; None: every entry): contenders by
    accuracy, then ceilings."""
    methods = _at(results, budget)
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
        f"{m['id']} ≈" if m.get("approximate") else m["id"],
        m["spec"],
        passes_cell(m),
        flops_cell(m),
        f"{100 * m['share_of_budget']:.1f}%",
        _pct(acc["value"]) if acc and m["problems"] else "–",
        f"[{_pct(acc['low'])}, {_pct(acc['high'])}]" if acc and m["problems"] else "–",
        (
            f"{100 * delta['value']:+.2f} [{100 * delta['low']:+.2f}, {100 * delta['high']:+.2f}]"
            if delta
            else "–"
        ),
        p_cell(delta),
        _pct(pool["oracle"]["value"]) if pool else "–",
        f"{pool['unique_answers']:.2f}" if pool else "–",
    ]


def headers(results: Results) -> list[str]:
    ref = results.get("reference") or "reference"
    level = f"{100 * results['level']:g}"
    return [c.format(ref=ref, level=level) for c in COLUMNS]


# Columns a narrow terminal keeps, most wanted first (FLOPs the first to go, then the
# configuration); method, accuracy and Δ always stay.
PRIORITY = (5, 7, 2, 8, 6, 9, 4, 10, 1, 3)
ESSENTIAL = (0, 5, 7)
NARROWEST = 40  # below this many columns, the vertical layout: one column per line
CONFIG_LEAST = 16  # the configuration column is shown at least this wide, or not at all
CEILINGS = "ceilings (not ranked):"
_SPEC_PIECE = re.compile(r"[^,:+]+[,:+]?|[,:+]")


def _pieces(text: str, column: int) -> tuple[list[str], str]:
    """The unbreakable pieces of a cell and what joins them: a configuration breaks after
    `,`, `:` and `+`; any other text at spaces."""
    if column == 1:
        return _SPEC_PIECE.findall(text), ""
    return text.split(), " "


def _wrap(text: str, width: int, column: int = 0) -> list[str]:
    """`text` in lines of at most `width` cells, broken only between pieces (a piece wider
    than `width` gets a line of its own, whole)."""
    pieces, join = _pieces(text, column)
    lines: list[str] = []
    line = ""
    for piece in pieces:
        longer = f"{line}{join}{piece}" if line else piece
        if line and cell_len(longer) > width:
            lines.append(line)
            line = piece
        else:
            line = longer
    return [*lines, line]


def _longest_piece(text: str, column: int) -> int:
    return max((cell_len(p) for p in _pieces(text, column)[0]), default=0)


def _widths(results: Results, width: int | None, budget: int | None) -> dict[int, int] | None:
    """The width of each column shown, by index, for a terminal `width` columns wide (None:
    every column in full); None when method, accuracy and Δ do not fit side by side."""
    names = headers(results)
    listed = rows(results, budget)
    cells = [c for _, c in listed]
    columns = [[c[i] for c in cells] for i in range(len(names))]
    if any(ceiling for ceiling, _ in listed):
        columns[0].append(CEILINGS)  # the ceilings' section row, in the method column
    full = [max(map(cell_len, [h, *col])) for h, col in zip(names, columns, strict=True)]
    if width is None or sum(full) + 3 * len(full) + 1 <= width:
        return dict(enumerate(full))
    if width < NARROWEST:
        return None
    # a header may wrap at its spaces, a cell at its spaces (a configuration between options)
    snug = [
        max([_longest_piece(h, 0), *map(cell_len, col)])
        for h, col in zip(names, columns, strict=True)
    ]
    least = [
        max([_longest_piece(h, 0), *(_longest_piece(c, i) for c in col)])
        for i, (h, col) in enumerate(zip(names, columns, strict=True))
    ]
    least[1] = max(least[1], CONFIG_LEAST)
    shown = {i: least[i] for i in ESSENTIAL}
    room = width - 1 - sum(w + 3 for w in shown.values())
    if room < 0:
        return None
    for i in (0, 7, 5):  # the method label whole first, then Δ, then accuracy
        grow = min(max(snug[i] - shown[i], 0), room)
        shown[i] += grow
        room -= grow
    for i in PRIORITY:
        need = least[i] if i == 1 else snug[i]
        if i not in shown and need + 3 <= room:
            shown[i] = need
            room -= need + 3
    for i in (1, *PRIORITY):  # what is left: the configuration, then headers unwrapped
        if i in shown:
            grow = min(max(full[i] - shown[i], 0), room)
            shown[i] += grow
            room -= grow
    return dict(sorted(shown.items()))


def rich_table(
    results: Results, title: str = "", width: int | None = None, budget: int | None = None
) -> RenderableType:
    """The leaderboard (at `budget`; None: every entry) for a terminal `width` columns wide
    (None: every column, in full).

    When narrow, the least wanted columns go first (FLOPs, configuration, unique, ...), then
    labels and headers wrap at their spaces and a configuration between its options, never
    inside a word; method, accuracy and Δ stay at any width from 40 columns. Narrower than
    that, each method is a block with one column per line. Ceilings sit below a line, in a
    section of their own; a note under the table says what a capped method's passes cell means.
    """
    shown = _widths(results, width, budget)
    if shown is None:
        return _Vertical(_vertical(results, title, width or NARROWEST, budget))
    table = Table(title=title or None, caption=capped_note(results, budget))
    names = headers(results)
    for i, w in shown.items():
        table.add_column(
            "\n".join(_wrap(names[i], w)),
            justify="left" if i < 2 else "right",
            width=w,
            no_wrap=True,
        )
    previous_ceiling = False
    for ceiling, cells in rows(results, budget):
        if ceiling and not previous_ceiling:
            table.add_section()
            label = "\n".join(_wrap(CEILINGS, shown[0]))
            table.add_row(label, *[""] * (len(shown) - 1), style="italic")
        wrapped = ["\n".join(_wrap(cells[i], w, i)) for i, w in shown.items()]
        table.add_row(*wrapped, style="dim" if ceiling else None)
        previous_ceiling = ceiling
    return table


def _vertical(results: Results, title: str, width: int, budget: int | None) -> list[str]:
    """The leaderboard as lines for a terminal `width` columns wide: a block per method, its
    label, then one column per line, most wanted first."""
    names = headers(results)
    lines = [*_wrap(title, width), ""] if title else []
    previous_ceiling = False
    for ceiling, cells in rows(results, budget):
        if ceiling and not previous_ceiling:
            lines += _wrap(CEILINGS, width)
        previous_ceiling = ceiling
        lines += _wrap(cells[0], width)
        for i in PRIORITY:
            line = f"  {names[i]}: {cells[i]}"
            if cell_len(line) <= width:
                lines.append(line)
            else:  # the value on lines of its own, below its name
                lines += ["  " + x for x in _wrap(names[i] + ":", width - 2)]
                lines += ["    " + x for x in _wrap(cells[i], width - 4, i)]
        lines.append("")
    note = capped_note(results, budget)
    return [*lines, *_wrap(note, width)] if note else lines[:-1]


class _Vertical:
    """Lines printed as they are: a piece wider than the terminal is left whole for the
    terminal to wrap, never cut."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines:
            yield Segment(line)
            yield Segment.line()


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
    note = capped_note(results, budget)
    return [*lines, "", note] if note else lines
