"""Bad and busy run directories: one line, exit status 2, before any model is built, and an
existing directory left byte-identical."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import TOY_RUN, assert_user_error, cli_subprocess, snapshot

from dllmbench.running import runner


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the run gets as far as building plugins (the heavy work)."""

    def prepare(*args, **kwargs):
        raise AssertionError("prepare() ran: the run directory was not checked first")

    monkeypatch.setattr(runner, "prepare", prepare)


@pytest.fixture
def partial_run(finished_run):
    """A run directory with work left to do: two records, no results yet."""
    samples = finished_run / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:2]))
    (finished_run / "results.json").unlink()
    return finished_run


# -- where --out points ------------------------------------------------------------------------


def test_out_that_is_a_file(cli, tmp_path, no_model):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = cli(*TOY_RUN, "--out", target)
    assert_user_error(result, str(target), "is not a directory", "choose another --out")
    assert target.read_text() == "mine"


def test_out_under_a_file(cli, tmp_path, no_model):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = cli(*TOY_RUN, "--out", target / "run")
    assert_user_error(result, f"{target} is not a directory", "choose another --out")
    assert target.read_text() == "mine"


def test_out_dev_null(cli, no_model):
    assert_user_error(cli(*TOY_RUN, "--out", "/dev/null"), "/dev/null is not a directory")


def test_out_dot_and_root_are_one_line(cli, tmp_path, monkeypatch, no_model):
    """`--out .` in a folder of other files and `--out /`: paths with no parent to make them
    in, one line each (they were a StopIteration traceback)."""
    (tmp_path / "mine.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli(*TOY_RUN, "--out", "."), ". exists and is not a run directory")
    assert_user_error(cli(*TOY_RUN, "--out", "/"), "/ exists and is not a run directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_out_holding_other_files(cli, tmp_path, no_model):
    (tmp_path / "mine.txt").write_text("x")
    before = snapshot(tmp_path)
    result = cli(*TOY_RUN, "--out", tmp_path)
    assert_user_error(result, "is not a run directory", "choose another --out")
    assert snapshot(tmp_path) == before


def read_only(monkeypatch, root: Path) -> None:
    """Simulate a read-only filesystem at `root`: creating or writing anything under it fails
    with EROFS (as root, chmod would not stop a write)."""
    real_open, real_mkdir = os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def under(path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(root)

    def fake_open(path, flags, *args, **kwargs):
        if flags & writes and under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if under(path) and not os.path.exists(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


def test_new_run_directory_on_a_read_only_filesystem(cli, tmp_path, monkeypatch, no_model):
    read_only(monkeypatch, tmp_path)
    result = cli(*TOY_RUN, "--out", tmp_path / "new" / "run")
    assert_user_error(result, "cannot write to run directory", "Read-only file system")
    assert not (tmp_path / "new").exists()


def test_existing_run_directory_on_a_read_only_filesystem(cli, finished_run, monkeypatch, no_model):
    before = snapshot(finished_run)
    read_only(monkeypatch, finished_run)
    result = cli(*TOY_RUN, "--out", finished_run)
    assert_user_error(result, f"cannot write to run directory {finished_run}", "Read-only")
    assert snapshot(finished_run) == before


def unshare_works() -> str | None:
    """None when `unshare -rm` can make a read-only bind mount here, else the reason."""
    if shutil.which("unshare") is None:
        return "no unshare command on this machine"
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run(
            [
                "unshare",
                "-rm",
                "sh",
                "-c",
                f"mount --bind {folder} {folder} && "
                f"mount -o remount,bind,ro {folder} && ! touch {folder}/x 2>/dev/null",
            ],
            capture_output=True,
            text=True,
        )
    if probe.returncode != 0:
        return f"unshare -rm cannot make a read-only bind mount here: {probe.stderr.strip()}"
    return None


@pytest.mark.slow
@pytest.mark.skipif(unshare_works() is not None, reason=str(unshare_works()))
def test_a_real_read_only_mount(finished_run):
    """The CLI in a child process whose view of the folder is a read-only bind mount."""
    folder = finished_run.parent
    before = snapshot(folder)
    argv = " ".join(f"'{a}'" for a in TOY_RUN)
    for out in (finished_run, folder / "new"):
        script = (
            f"mount --bind '{folder}' '{folder}' && mount -o remount,bind,ro '{folder}' && "
            f"exec '{sys.executable}' -m dllmbench.cli {argv} --out '{out}'"
        )
        proc = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "cannot write to run directory" in lines[0], lines
        assert "Read-only file system" in lines[0], lines
    assert snapshot(folder) == before


# -- what the run directory holds --------------------------------------------------------------


@pytest.mark.parametrize("line", ["42", '{"foo": 1}', '"text"', "not json"])
def test_a_middle_line_that_is_not_a_record(cli, finished_run, line, no_model):
    samples = finished_run / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    lines[1] = line + "\n"
    samples.write_text("".join(lines))
    before = snapshot(finished_run)
    result = cli(*TOY_RUN, "--out", finished_run)
    assert_user_error(result, f"{samples} line 2 is damaged", "delete that line")
    assert snapshot(finished_run) == before


def test_a_last_line_that_is_valid_json_but_not_a_record(cli, finished_run, no_model):
    samples = finished_run / "samples.jsonl"
    samples.write_text(samples.read_text() + '{"foo": 1}\n')
    before = snapshot(finished_run)
    lines = len(samples.read_text().splitlines())
    result = cli(*TOY_RUN, "--out", finished_run)
    assert_user_error(result, f"line {lines} is damaged", "no str 'problem'")
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    "key,value,why",
    [
        ("problem", "p-77", "its problem 'p-77' is not one of the run's 4 problems"),
        ("method", "Nope", "its method 'Nope' is not one of the run's 4 methods"),
    ],
)
def test_a_record_that_is_not_of_the_run_is_refused_alike_by_run_merge_and_report(
    cli, finished_run, no_model, key, value, why
):
    """A record of a problem or a method the run does not have (a line edited, or copied
    from another run): a resume, merge and report refuse it in the same line, naming it. The
    summary left it out while the report read it into its pooled curves and diagnostics."""
    samples = finished_run / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text("".join(lines) + json.dumps({**json.loads(lines[0]), key: value}) + "\n")
    before = snapshot(finished_run)
    line = f"{samples} line {len(lines) + 1} is not a record of this run ({why}); delete that line"
    for argv in (
        [*TOY_RUN, "--out", finished_run],
        ["merge", finished_run],
        ["report", finished_run],
    ):
        assert_user_error(cli(*argv), line)
    assert snapshot(finished_run) == before


def _flip(record: dict) -> dict:
    return {**record, "correct": not record["correct"]}


def _cheaper(record: dict) -> dict:
    ledger = record["ledger"]
    passes = {k: 1 for k in ledger["passes"]}
    return {**record, "ledger": {**ledger, "passes": passes, "total_passes": len(passes)}}


def _total(record: dict) -> dict:
    return {**record, "ledger": {**record["ledger"], "total_passes": 1}}


@pytest.mark.parametrize(
    "edit,why",
    [
        (_flip, "unlike its selected candidate's"),
        (_cheaper, "are not its method's cost"),
        (_total, "ledger.total_passes is not the sum of ledger.passes"),
    ],
)
def test_a_record_edited_to_say_more_is_refused_alike_by_run_merge_and_report(
    cli, finished_run, no_model, edit, why
):
    """A record edited by hand, its grade flipped or its passes lowered: it disagrees with
    its own candidates, or with its method's cost in the manifest. A resume, merge and report
    refuse it in one line naming it, rather than summarise a better result."""
    samples = finished_run / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if json.loads(line)["selected"] is not None)
    lines[at] = json.dumps(edit(json.loads(lines[at]))) + "\n"
    samples.write_text("".join(lines))
    before = snapshot(finished_run)
    for argv in (
        [*TOY_RUN, "--out", finished_run],
        ["merge", finished_run],
        ["report", finished_run],
    ):
        assert_user_error(cli(*argv), f"{samples} line {at + 1} does not hold together", why)
    assert snapshot(finished_run) == before


def test_a_torn_last_line_is_still_repaired(cli, partial_run):
    samples = partial_run / "samples.jsonl"
    samples.write_text(samples.read_text() + '{"problem": "test-0", "met')
    result = cli(*TOY_RUN, "--out", partial_run)
    assert result.code == 0, result.err
    assert all(json.loads(x) for x in samples.read_text().splitlines())


def test_a_samples_file_that_cannot_be_read(cli, finished_run, no_model):
    samples = finished_run / "samples.jsonl"
    samples.unlink()
    samples.mkdir()
    before = snapshot(finished_run)
    result = cli(*TOY_RUN, "--out", finished_run)
    assert_user_error(result, f"cannot read {samples}", "Is a directory")
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    ("text", "needle"),
    [("[]", "holds a JSON list"), ("42", "holds a JSON int"), ("{oops", "is not valid JSON")],
)
def test_a_manifest_that_is_not_a_json_object(cli, finished_run, text, needle, no_model):
    (finished_run / "manifest.json").write_text(text)
    before = snapshot(finished_run)
    result = cli(*TOY_RUN, "--out", finished_run)
    assert_user_error(result, "manifest.json", needle, "choose another --out")
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{oops", "is not valid JSON"),
        ("[]", "not an object with an 'invocations' list"),
        ('{"invocations": 3}', "not an object with an 'invocations' list"),
    ],
)
def test_a_corrupt_compute_json_is_found_before_the_run(cli, partial_run, text, needle, no_model):
    (partial_run / "compute.json").write_text(text)
    before = snapshot(partial_run)
    result = cli(*TOY_RUN, "--out", partial_run)
    assert_user_error(result, "compute.json", needle, "move it away")
    assert snapshot(partial_run) == before  # no record was run and appended first


# -- the lock ----------------------------------------------------------------------------------

HOLD = textwrap.dedent(
    """
    import sys, time
    import dllmbench.running.runner as runner
    from dllmbench.cli import main

    real = runner.run

    def run_and_hold(cfg, on_record=None, **callbacks):
        def hold(record):
            on_record(record)
            print("holding", flush=True)
            time.sleep(300)

        return real(cfg, on_record=hold, **callbacks)

    runner.run = run_and_hold
    sys.exit(main(sys.argv[1:]))
    """
)


def start_holding_run(out: Path) -> subprocess.Popen:
    """A real `dllmbench run` in a child process, stopped after its first record."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, *TOY_RUN, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    assert line.strip() == "holding", child.stderr.read()
    return child


@pytest.mark.slow
def test_two_runs_into_one_directory_the_second_names_the_first(tmp_path):
    out = tmp_path / "run"
    first = start_holding_run(out)
    try:
        before = snapshot(out)
        second = cli_subprocess(*TOY_RUN, "--out", out)
        assert_user_error(second, "in use by another dllmbench run", f"pid {first.pid} on ")
        after = snapshot(out)
        # the first run's heartbeat beats on while the second starts (every 10 s: on a busy
        # machine the second's start can take that long); it must still be the first run's
        beats = [name for name in before if "heartbeat" in name]
        assert beats and sorted(n for n in after if "heartbeat" in n) == sorted(beats)
        for name in beats:
            then, now = json.loads(before.pop(name)), json.loads(after.pop(name))
            assert now["pid"] == then["pid"] == first.pid and now["token"] == then["token"]
        # the first run saves its compute entry on each heartbeat too: still its one entry
        then, now = (json.loads(x.pop("compute.json"))["invocations"] for x in (before, after))
        assert [e["pid"] for e in now] == [e["pid"] for e in then] == [first.pid]
        assert after == before  # the second run changed nothing
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_is_taken_over(cli, tmp_path):
    out = tmp_path / "run"
    first = start_holding_run(out)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert (out / ".lock").read_text().startswith(f"pid {first.pid} on ")  # stale
    result = cli(*TOY_RUN, "--out", out)
    assert result.code == 0, result.err
    assert "in use" not in result.err and "error" not in result.err, result.err  # silently
    assert not (out / ".lock").exists()
    invocations = json.loads((out / "compute.json").read_text())["invocations"]
    records = len((out / "samples.jsonl").read_text().splitlines())
    # the killed invocation counts too, with the record it wrote before it was killed (its
    # entry was saved just before that record: compute.json's accounts attribute the record)
    counts = [(i["recorded"]["records"], i["finished"]) for i in invocations]
    assert counts == [(1, False), (records - 1, True)]


def test_a_failed_command_leaves_no_new_directory_behind(cli, tmp_path):
    out = tmp_path / "a" / "b"
    result = cli(*TOY_RUN, "--reference", "nope", "--out", out)
    assert_user_error(result, "--reference 'nope'")
    assert not (tmp_path / "a").exists()
