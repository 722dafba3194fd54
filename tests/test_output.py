"""What a person reads: progress lines in logs, the leaderboard at 80 columns, --json anywhere."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

from conftest import TOY_RUN
from rich.console import Console

from dllmbench.analysis.leaderboard import markdown, rich_table
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


def _render(table, width):
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
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
    assert max(len(line) for line in result.out.splitlines()) <= 80
    for m in results["methods"]:
        assert f"│ {m['id']} " in result.out, m["id"]
    # stderr is not a terminal here: progress came as lines
    assert re.search(r"dllmbench: toy_sum × methods: \d+/\d+ \(\d+%\)", result.err)


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
    ]
    [entry] = [t for t in _doc_tables("`manifest.json`") if t[0] == "id"]
    assert entry == keys(schema.MethodEntry)
