"""What `dllmbench run` says while and after it runs: the progress line's rate and time left
from the first record (weighted by what each record costs), what it counts, what the run
wrote and what to run next."""

from __future__ import annotations

import io
import json
import re
import sys

from conftest import TOY_RUN

from dllmbench.cli.progress import Progress, rate_and_eta
from dllmbench.cli.run import counts, planned_passes, written_files


class Log(io.StringIO):
    def isatty(self) -> bool:
        return False


class Tty(Log):
    def isatty(self) -> bool:
        return True


def test_the_line_after_the_first_record_shows_a_rate_and_an_eta_weighed_by_cost():
    """Two problems × a cheap method (10 passes) and one four times as dear: 100 passes in
    all. The first record, a cheap one, after 10 s: 10 passes a second done, 90 left, so
    90 s; counted as records (1 done, 3 left at 0.1 a second) it would say 30 s."""
    log = Log()
    with Progress(log, every_seconds=3600) as progress:
        progress.start("arith: 2 problems × 2 methods", 4, work=100, unit="records")
        first = log.getvalue().splitlines()
        progress._started -= 10  # as if it started ten seconds ago
        progress.advance(work=10)
        lines = log.getvalue().splitlines()
    assert first == ["dllmbench: arith: 2 problems × 2 methods: 0/4 records (0%), 0s elapsed"]
    assert lines[1] == (
        "dllmbench: arith: 2 problems × 2 methods: 1/4 records (25%), 0.10/s, ETA 1m 30s"
    )
    assert lines[-1].startswith("dllmbench: arith: 2 problems × 2 methods: 1/4 records (25%), ")
    assert rate_and_eta(1, 0, 4, 10.0) == "0.10/s, ETA 30s"  # the same, counting records


def test_records_found_done_count_as_their_share_of_the_work_not_in_the_rate():
    log = Log()
    with Progress(log, every_seconds=3600) as progress:
        progress.start("x", 4, done=2, work=100)  # resumed: half the work is there
        progress._started -= 10
        progress.advance(work=25)  # one record in 10 s: 2.5 passes a second, 25 left
        assert progress.rate() == "0.10/s, ETA 10s"


def test_the_bar_on_a_terminal_shows_the_same_rate_and_eta():
    with Progress(Tty()) as progress:
        progress.start("x", 4, work=100, unit="records")
        bar = progress._bar
        (column,) = [c for c in bar.columns if type(c).__name__ == "_RateColumn"]
        assert str(column.render(bar.tasks[0])).endswith("s elapsed")  # nothing finished yet
        progress._started -= 10
        progress.advance(work=10)
        text = str(column.render(bar.tasks[0]))
        assert bar.tasks[0].completed == 1
    assert re.fullmatch(r"0\.10/s, ETA 1m 3\ds", text), text


def test_a_record_of_unknown_cost_weighs_the_mean():
    with Progress(Log(), every_seconds=3600) as progress:
        progress.start("x", 4, work=100)
        progress._started -= 10
        progress.advance()  # 25 of 100 in 10 s: 75 left at 2.5 a second
        assert progress.rate() == "0.10/s, ETA 30s"


def test_the_run_says_what_it_counts_and_weighs_each_method_by_its_planned_passes(
    finished_run,
):
    manifest = json.loads((finished_run / "manifest.json").read_text())
    costs = planned_passes(manifest)
    assert costs == {"Vanilla": 8, "Majority@9": 72, "ORM Rerank@8": 72, "Oracle@9": 72}
    assert counts(manifest, 16, costs) == ("4 problems × 4 methods", 4 * (8 + 3 * 72))
    several = {**manifest, "budgets": [72, 288]}
    assert counts(several, 16, costs)[0] == "4 problems × 4 methods (2 budgets)"
    assert counts({}, 16, {}) == ("records", None)  # no manifest: records counted alike


def test_a_run_prints_progress_and_ends_naming_its_files_and_the_next_command(
    tmp_path, cli, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "0")
    out = tmp_path / "my run"  # a path with a space: the command to copy quotes it
    result = cli(*TOY_RUN, "--out", out)
    assert result.code == 0, result.err
    progress = [x for x in result.err.splitlines() if x.startswith("dllmbench: toy_sum: ")]
    assert (
        progress[0] == "dllmbench: toy_sum: 4 problems × 4 methods: 0/16 records (0%), 0s elapsed"
    )
    assert re.fullmatch(r".*: \d+/16 records \(\d+%\), \d+\.\d\d/s, ETA \d+s", progress[1])
    assert progress[-1].startswith("dllmbench: toy_sum: 4 problems × 4 methods: 16/16 records")
    *_, where, nxt = result.out.splitlines()
    assert where == (
        f"run directory: {out} (16 records written): leaderboard.md, results.json, "
        "compute.json, manifest.json, samples.jsonl"
    )
    assert nxt == f"next: dllmbench report '{out}' (report.md, report.json and the figures)"
    assert written_files(out) == [
        "leaderboard.md",
        "results.json",
        "compute.json",
        "manifest.json",
        "samples.jsonl",
    ]


def test_report_says_each_stage_as_it_begins_at_a_terminal(finished_run, cli, monkeypatch):
    """At a terminal the report names each stage as it begins; to a script or a file, stderr
    holds nothing but errors (a refusal stays one line)."""
    quiet = cli("report", finished_run, "--out", str(finished_run / "quiet"))
    assert quiet.code == 0 and quiet.err == "", quiet.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    result = cli("report", finished_run)
    assert result.code == 0, result.err
    stages = [re.sub(r" \(\d+s elapsed\)$", "", x) for x in result.err.splitlines()]
    assert stages == [
        "dllmbench: report: reading 1 run directory",
        "dllmbench: report: the pooled curves (most of a report's time: every k of the largest "
        "pool)",
        "dllmbench: report: the diagnostics",
        "dllmbench: report: the figures",
    ]
