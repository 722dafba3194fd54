"""What a person reads: progress lines in logs, the leaderboard at 80 columns, --json anywhere."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from conftest import TOY_RUN
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from dllmbench.analysis.leaderboard import headers, markdown, rich_table, rows
from dllmbench.cli.progress import Progress
from dllmbench.core import schema


class Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_progress_in_a_log_prints_a_line_every_tenth_with_rate_and_eta():
    log = Log()
    with Progress(log) as progress:
        progress.start("arith × methods", 200, done=20)
        for _ in range(180):
            progress.advance()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("dllmbench: arith × methods: 20/200 (10%)")
    middle = lines[1:-1]
    assert [int(re.search(r"(\d+)/200", x).group(1)) for x in middle] == list(range(40, 200, 20))
    assert all(re.search(r", \d+\.\d\d/s, ETA \d+", x) for x in middle), middle
    assert lines[-1].startswith("dllmbench: arith × methods: 200/200 (100%), done in")


def test_progress_in_a_log_speaks_even_when_nothing_finishes():
    log = Log()
    with Progress(log, every_seconds=0.1) as progress:
        progress.start("slow", 10)
        time.sleep(0.45)
    lines = log.getvalue().splitlines()
    waiting = [x for x in lines if "0/10" in x and "elapsed" in x]
    assert len(waiting) >= 3, lines  # the start line and at least two heartbeats


def test_progress_on_a_terminal_is_a_bar_and_writes_no_lines():
    class Tty(Log):
        def isatty(self) -> bool:
            return True

    log = Tty()
    with Progress(log) as progress:
        progress.start("x", 3)
        progress.advance(3)
    assert "dllmbench: x:" not in log.getvalue()


def test_the_bar_on_a_terminal_shows_rate_and_time_left():
    class Tty(Log):
        def isatty(self) -> bool:
            return True

    with Progress(Tty()) as progress:
        progress.start("x", 10, done=2)
        bar = progress._bar
        (column,) = [c for c in bar.columns if type(c).__name__ == "_RateColumn"]
        assert str(column.render(bar.tasks[0])).endswith("s elapsed")  # nothing finished yet
        progress.advance(3)
        progress._started -= 10  # as if started ten seconds ago: 3 records in 10 s
        text = str(column.render(bar.tasks[0]))
    assert re.fullmatch(r"0\.30/s, ETA 1[67]s", text), text  # 5 left at 0.3/s


def _render(table, width):
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table, crop=False)
    return console.export_text()


def test_the_leaderboard_at_80_columns_shows_every_label_whole(finished_run):
    results = json.loads((finished_run / "results.json").read_text())
    text = _render(rich_table(results, "title", width=80), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    lines = text.splitlines()
    for m in results["methods"]:
        assert any(f"│ {m['id']} " in line for line in lines), m["id"]
    assert "acc %" in text and "Δ vs Vanilla" in text and "ceilings (not ranked)" in text
    assert "configuration" not in text  # the first column to go
    wide = _render(rich_table(results, "title", width=None), 200)
    assert "configuration" in wide and "unique" in wide
    md = markdown(results, "title")
    assert all(h in md for h in ("configuration", "share", "oracle %", "unique"))
    assert all(m["spec"] in md for m in results["methods"])


def test_columns_80_run_prints_labels_whole(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = cli(*TOY_RUN, "--out", tmp_path / "r")
    assert result.code == 0, result.err
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    # the last two: the run directory and the next command, never cut
    *table, last, nxt = result.out.splitlines()
    assert max(len(line) for line in table) <= 80 and last.startswith("run directory: ")
    assert nxt.startswith("next: dllmbench report ")
    for m in results["methods"]:
        assert f"│ {m['id']} " in result.out, m["id"]
    # stderr is not a terminal here: progress came as lines
    assert re.search(r"dllmbench: toy_sum: 4 problems × 4 methods: \d+/16 records", result.err)


def _demo_like(results: dict) -> dict:
    """`results` with labels and configurations as long as the demo's, and words in them."""
    for m in results["methods"]:
        m["id"] += " K=32 b=12 + Top"
        m["spec"] += ",every=12,final=keep+weighted_majority:by=weight"
    results["reference"] += " K=32 b=12 + Top"
    return results


@pytest.mark.parametrize("width", [40, 41, 47, 55, 64, 80, 97, 120, 143, 160])
def test_the_leaderboard_never_splits_a_word_and_keeps_method_accuracy_and_delta(
    finished_run, width
):
    results = _demo_like(json.loads((finished_run / "results.json").read_text()))
    board = rich_table(results, "title", width=width)
    assert isinstance(board, Table)
    text = _render(board, width)
    assert max(cell_len(line) for line in text.splitlines()) <= width
    columns = {c.header.replace("\n", " "): c for c in board.columns}
    assert {"method", "acc %", f"Δ vs {results['reference']} [95% CI]"} <= set(columns)
    wanted = {"method": ("id", " "), "configuration": ("spec", "")}
    for name, column in columns.items():
        cells = [str(c) for c in column._cells]
        for cell in cells:  # each line fits its column, and rich wrapped none of them again
            assert all(cell_len(x) <= column.width and x.strip() in text for x in cell.split("\n"))
        if name in wanted:  # labels broken at spaces, configurations between options
            key, join = wanted[name]
            joined = {join.join(cell.split("\n")) for cell in cells}
            assert {m[key] for m in results["methods"]} <= joined
    accuracies = [str(c) for c in columns["acc %"]._cells if str(c)]  # not the ceilings row
    acc = headers(results).index("acc %")
    assert accuracies == [cells[acc] for _, cells in rows(results)]
    if width >= 160:
        assert "configuration" in columns  # the demo's table at 160 columns has it, whole words


@pytest.mark.parametrize("width", [12, 30, 39])
def test_below_40_columns_the_leaderboard_is_one_column_per_line(finished_run, width):
    results = _demo_like(json.loads((finished_run / "results.json").read_text()))
    board = rich_table(results, "title", width=width)
    assert not isinstance(board, Table)
    lines = _render(board, width).splitlines()
    words = [
        w for m in results["methods"] for w in [*m["id"].split(), *re.split("[,:+]", m["spec"])]
    ]
    assert all(any(w in line for line in lines) for w in words)  # no word cut
    assert max(map(cell_len, lines)) <= max(width, *(cell_len(w) + 5 for w in words))
    for name in headers(results)[1:]:  # each column on a line (or two) of its own, per method
        found = [x for x in lines if x.startswith(f"  {name.split()[0]}")]
        assert len(found) == len(results["methods"]), name
    if width >= 30:
        acc = headers(results).index("acc %")
        assert [x for x in lines if x.startswith("  acc %:")] == [
            f"  acc %: {cells[acc]}" for _, cells in rows(results)
        ]


def test_columns_40_run_prints_every_accuracy(finished_run, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    result = cli(*TOY_RUN, "--out", finished_run)  # a finished run: its tables again
    assert result.code == 0, result.err
    results = json.loads((finished_run / "results.json").read_text())
    *table, last, nxt = result.out.splitlines()
    assert max(map(cell_len, table)) <= 40
    assert last.startswith(f"run directory: {finished_run} ")  # a path is never cut
    assert nxt.startswith(f"next: dllmbench report {finished_run} ")
    assert "acc %" in result.out and "Δ vs" in result.out
    for m in results["methods"]:
        assert re.search(rf"│ +{100 * m['accuracy']['value']:.2f} │", result.out), m["id"]


@pytest.mark.parametrize("columns", ["0", None, "²"])
def test_columns_0_or_piped_output_prints_the_full_table(finished_run, cli, monkeypatch, columns):
    """COLUMNS=0, or COLUMNS unset (or not a number) with stdout piped: every column, every
    configuration on one line, however wide."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    result = cli(*TOY_RUN, "--out", finished_run)
    assert result.code == 0, result.err
    results = json.loads((finished_run / "results.json").read_text())
    head = next(line for line in result.out.splitlines() if "method" in line)
    assert [h.strip() for h in head.strip("┃").split("┃")] == headers(results)
    for m in results["methods"]:
        line = next(x for x in result.out.splitlines() if f"│ {m['id']} " in x)
        assert f"│ {m['spec']} " in line and f"{m['passes_per_problem']:.0f}" in line


def test_json_goes_before_or_after_the_command(cli):
    before, after = cli("--json", "plugins"), cli("plugins", "--json")
    assert before.code == after.code == 0
    assert json.loads(before.out) == json.loads(after.out)
    assert json.loads(cli("--json", "tasks").out) == json.loads(cli("tasks", "--json").out)


# -- the typed record: what the files hold, what the schema module says, what the docs say -----

SCHEMA_DOC = Path(__file__).parent.parent / "docs" / "results-schema.md"


def _conforms(value: dict, typed: type, where: str) -> None:
    """`value` has every required key of the TypedDict, no other key, in the declared order."""
    declared = list(typed.__annotations__)
    assert typed.__required_keys__ <= set(value), (where, typed.__required_keys__ - set(value))
    assert list(value) == [k for k in declared if k in value], (where, list(value), declared)


def test_every_file_of_a_run_has_exactly_the_keys_of_the_schema(finished_run):
    records = [json.loads(x) for x in (finished_run / "samples.jsonl").read_text().splitlines()]
    assert records
    for r in records:
        _conforms(r, schema.Record, "record")
        _conforms(r["ledger"], schema.LedgerEntry, "ledger")
        for c in r["candidates"]:
            _conforms(c, schema.CandidateRecord, "candidate")
    results = json.loads((finished_run / "results.json").read_text())
    _conforms(results, schema.Results, "results")
    assert results["schema_version"] == schema.SCHEMA_VERSION
    assert any("pool" in m for m in results["methods"])
    assert any("delta_vs_reference" in m for m in results["methods"])
    for m in results["methods"]:
        _conforms(m, schema.MethodResult, m["id"])
        _conforms(m["spend"], schema.SpendEntry, "spend")
        if "pool" in m:
            _conforms(m["pool"], schema.PoolEntry, "pool")
        if "delta_vs_reference" in m:
            _conforms(m["delta_vs_reference"], schema.DeltaEntry, "delta")
    manifest = json.loads((finished_run / "manifest.json").read_text())
    for m in manifest["methods"]:
        _conforms(m, schema.MethodEntry, m["id"])


def _doc_tables(heading: str) -> list[list[str]]:
    """The keys of each `| key | type | content |` table under `## heading`, in order."""
    section = SCHEMA_DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    tables = []
    for block in re.split(r"\n\s*\n", section):
        rows = [x for x in block.splitlines() if x.startswith("| ")]
        if rows and rows[0].startswith("| key |"):
            cells = [row.split("|")[1] for row in rows[1:] if not row.startswith("| ---")]
            tables.append([k for cell in cells for k in re.findall(r"`([^`]+)`", cell)])
    return tables


def test_the_schema_doc_lists_the_keys_of_the_schema_module_in_order():
    keys = lambda typed: list(typed.__annotations__)  # noqa: E731
    assert _doc_tables("`samples.jsonl`") == [
        keys(schema.Record),
        keys(schema.CandidateRecord),
        keys(schema.LedgerEntry),
    ]
    assert _doc_tables("`results.json`") == [
        keys(schema.Results),
        keys(schema.MethodResult),
        keys(schema.PoolEntry),
        keys(schema.SpendEntry),
    ]
    [entry] = [t for t in _doc_tables("`manifest.json`") if t[0] == "id"]
    assert entry == keys(schema.MethodEntry)


def test_plan_at_80_columns_keeps_every_configuration_whole(cli, monkeypatch):
    """What `--method` takes, as `plan` prints it: at 80 columns, too narrow for the table
    with the demo's configurations, each method's configuration on a line of its own, whole."""
    argv = ("plan", "--budget", "1040,4160")
    specs = {m["spec"] for m in json.loads(cli(*argv, "--json").out)["methods"]}
    monkeypatch.setenv("COLUMNS", "80")
    narrow = cli(*argv)
    assert narrow.code == 0, narrow.err
    lines = narrow.out.splitlines()
    assert max(map(cell_len, lines)) <= 80 and "…" not in narrow.out
    assert specs <= {line.strip() for line in lines}
    assert sum(line.startswith("Vanilla: passes 128, share ") for line in lines) == 2
    monkeypatch.setenv("COLUMNS", "200")  # wide enough: the table, each configuration in a cell
    wide = cli(*argv).out
    assert all(f"│ {spec} " in wide for spec in specs)


def test_plugins_at_80_columns_keep_every_name_whole(cli, monkeypatch):
    entries = json.loads(cli("plugins", "--json").out)
    monkeypatch.setenv("COLUMNS", "80")
    result = cli("plugins")
    assert result.code == 0, result.err
    assert max(map(cell_len, result.out.splitlines())) <= 80
    names = {e["name"] for e in entries if not e["broken"]}
    assert "weighted_majority" in names  # a selector and a family: the widest built-in names
    for name in names:
        assert f"│ {name} " in result.out, name
