"""What a command killed or terminated half-way leaves in a run directory: a merge cut between
its two files, temporary files of an atomic write, compute.json written by the heartbeat, and
the line a SIGTERM leaves (tests/test_shards.py has a run's own SIGTERM)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TOY_RUN

from dllmbench.running.merge import merge
from dllmbench.running.status import status
from dllmbench.storage.rundir import RunDir


class Killed(BaseException):
    """Stands for a kill: nothing after it runs, and no handler of the command's catches it."""


@pytest.fixture(scope="module")
def shares_done(tmp_path_factory) -> Path:
    """A run of two shares, both done, not merged."""
    from dllmbench.cli import main

    out = tmp_path_factory.mktemp("shares") / "run"
    for share in ("1/2", "2/2"):
        assert main([*map(str, TOY_RUN), "--out", str(out), "--shard", share]) == 0
    return out


@pytest.fixture
def shares(tmp_path, shares_done) -> Path:
    out = tmp_path / "run"
    shutil.copytree(shares_done, out)
    return out


def test_a_merge_killed_between_its_files_is_not_merged(shares, monkeypatch, cli):
    """A merge writes results.json and compute.json; killed after the first of the two, the
    run directory must not look merged. compute.json is written first and results.json last,
    and `status` calls a run merged only when compute.json accounts for its records."""
    written: list[str] = []

    def second_is_killed(name, real):
        def write(self, *args, **kwargs):
            if name == "compute" and not kwargs.get("accounted"):
                return real(self, *args, **kwargs)
            if written:
                raise Killed
            written.append(name)
            return real(self, *args, **kwargs)

        return write

    monkeypatch.setattr(RunDir, "write_results", second_is_killed("results", RunDir.write_results))
    monkeypatch.setattr(RunDir, "write_compute", second_is_killed("compute", RunDir.write_compute))
    with pytest.raises(Killed):
        merge(shares)
    assert len(written) == 1
    found = status(shares)
    assert found.complete and not found.merged
    monkeypatch.undo()
    shown = cli("status", shares)
    assert "16/16 records (100%), complete" in shown.out and "merged" not in shown.out
    assert cli("merge", shares).code == 0
    assert status(shares).merged


def test_status_is_not_merged_without_compute_json(shares, cli):
    """results.json beside no compute.json (moved away, or a merge cut short by an earlier
    version that wrote results.json first) is not merged: merge writes it again."""
    assert cli("merge", shares).code == 0
    assert status(shares).merged
    (shares / "compute.json").unlink()
    found = json.loads(cli("status", shares, "--json").out)
    assert (found["merged"], found["unaccounted"], found["complete"]) == (False, True, True)
    shown = cli("status", shares)
    assert "compute.json is missing or does not account for the records" in shown.out
    assert cli("merge", shares).code == 0
    assert status(shares).merged


def dead_pid() -> int:
    """The pid of a process that has ended (a child of this test, reaped)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_temporaries_a_killed_writer_left_are_removed_by_the_next_holder(finished_run, cli):
    """A process killed mid-write leaves `.NAME.PID.tmp`: `status` reads past them, and the
    next command to hold the run directory removes them (a run resumed, a merge); the
    temporaries of this process are its own, and stay."""
    pid = dead_pid()
    left = [f".{name}.{pid}.tmp" for name in ("results.json", "compute.json", "heartbeat.json")]
    for name in left:
        (finished_run / name).write_text('{"cut')
    mine = finished_run / f".manifest.json.{os.getpid()}.tmp"  # a resume writes no manifest
    mine.write_text("")
    found = json.loads(cli("status", finished_run, "--json").out)
    assert found["merged"] and found["done"] == found["planned"]
    assert all((finished_run / name).exists() for name in left)  # status writes nothing
    resumed = cli(*TOY_RUN, "--out", finished_run)
    assert resumed.code == 0, resumed.err
    assert not [name for name in left if (finished_run / name).exists()]
    assert mine.exists()
    (finished_run / left[0]).write_text("")
    assert cli("merge", finished_run).code == 0
    assert not (finished_run / left[0]).exists()


def test_a_share_removes_the_temporaries_of_its_own_files_only(shares, cli):
    """A share holds its own lock and `.lock` shared: it removes what a killed process left of
    its own files (its compute file, its heartbeat), not of files other processes of the run
    may be writing now (results.json, compute.json); merge, which holds `.lock` alone, does."""
    pid = dead_pid()
    own = [f".compute.shard-1-of-2.json.{pid}.tmp", f".heartbeat.shard-1-of-2.json.{pid}.tmp"]
    others = [f".compute.shard-2-of-2.json.{pid}.tmp", f".results.json.{pid}.tmp"]
    for name in own + others:
        (shares / name).write_text("")
    assert cli(*TOY_RUN, "--out", shares, "--shard", "1/2").code == 0
    assert [name for name in own + others if (shares / name).exists()] == others
    assert cli("merge", shares).code == 0
    assert not [name for name in others if (shares / name).exists()]


@pytest.mark.parametrize("shard", [None, "1/2"])
def test_compute_json_saved_between_syncs_is_written_whole(tmp_path, monkeypatch, shard):
    """The heartbeat's save of compute.json (`durable=False`, every 5 s from its thread) and
    the saves between records skip the directory's fsync, not the file's: the new content is
    on disk before the rename, so a power cut leaves the old file or the new, never an empty
    one."""
    from dllmbench.storage.shards import parse_shard

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(src)))
        return real_replace(src, dst)

    rundir = RunDir(tmp_path, None if shard is None else parse_shard(shard))
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    rundir.save_invocation({"passes": {"denoise": 8}, "records_written": 1}, durable=False)
    monkeypatch.undo()
    tmp = f".{rundir.total_compute_path.name if shard is None else rundir.compute_path.name}"
    replaced = [i for i, (what, name) in enumerate(events) if what == "replace"]
    assert len(replaced) == 1 and events[replaced[0]][1].startswith(tmp)
    assert ("fsync", events[replaced[0]][1]) in events[: replaced[0]], events
    assert json.loads(rundir.compute_path.read_text())["invocations"][0]["records_written"] == 1


# a child that runs the `dllmbench` entry point with `ATTRIBUTE` of `MODULE` replaced by a
# call that sends SIGTERM to the child itself, as a scheduler would at that moment
SIGTERM_AT = """
import importlib, os, signal, sys
module = importlib.import_module(sys.argv[1])

def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("SIGTERM did not stop the command")

setattr(module, sys.argv[2], terminated)
from dllmbench.cli import command
sys.argv = ["dllmbench", *sys.argv[3:]]
raise SystemExit(command())
"""


def terminated_at(module: str, attribute: str, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SIGTERM_AT, module, attribute, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sigterm_during_a_merge_says_what_is_kept(shares):
    """SIGTERM outside `run`'s own handler (a merge job pre-empted) ended the process at once:
    status 143 with no line, its lock and temporaries left. It unwinds as Ctrl-C does: one
    line saying what is kept and what to run, status 143, the lock released, and the run
    directory not merged."""
    done = terminated_at("dllmbench.storage.rundir", "_fsync_dir", "merge", shares)
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"dllmbench: terminated (SIGTERM); every record in {shares} is kept (results.json is "
        f"written only by a merge that ends); run dllmbench merge {shares} again"
    ]
    assert not (shares / ".lock").exists()
    assert not list(shares.glob(".*.tmp"))
    assert not status(shares).merged


def test_sigterm_before_a_run_handles_it_says_nothing_was_written(tmp_path):
    """SIGTERM while `run` reads its plugins and arguments, before its own handler: one
    line, status 143, nothing written."""
    out = tmp_path / "run"
    done = terminated_at("dllmbench.cli.run", "run_config", *TOY_RUN, "--out", out)
    assert done.returncode == 143, done.stderr
    assert done.stderr.splitlines() == [
        "dllmbench: terminated (SIGTERM); the run had not begun and nothing was written; run "
        "the same command again"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    "command,where,needle",
    [
        (["merge", "{run}"], "dllmbench.running.merge.merge", "every record in {run} is kept"),
        (
            ["merge", "--wait", "{tmp}/none"],
            "dllmbench.running.merge.merge",
            "{tmp}/none holds no run yet and nothing was written; run dllmbench merge --wait "
            "{tmp}/none again",
        ),
        (
            ["report", "{run}", "--out", "{tmp}/report"],
            "dllmbench.cli.report.claim",
            "the run directories are untouched; run the same command again to write "
            "{tmp}/report whole",
        ),
        (
            ["collect", "--task", "arith", "--backbone", "tiny", "--out", "{tmp}/c"],
            "dllmbench.cli.collect.claim",
            "the trajectories of every finished problem are kept in {tmp}/c; run the same "
            "command again to resume",
        ),
        (
            ["train-scorer", "--kind", "prm", "--data", "{tmp}/c", "--out", "{tmp}/s"],
            "dllmbench.cli.train_scorer.claim",
            "the checkpoints saved so far (every --val-every steps) are kept in {tmp}/s",
        ),
        (
            ["diagnose", "{tmp}/c"],
            "dllmbench.scoring.collect.read_meta",
            "the collection is untouched and {tmp}/c/controls holds no new controls",
        ),
        (
            ["demo", "retrain", "--out", "{tmp}/d"],
            "dllmbench.cli.demo.claim",
            "every finished stage is kept in {tmp}/d; run the same command again to resume",
        ),
        (
            TOY_RUN,
            "dllmbench.cli.run.run_config",
            "the run had not begun and nothing was written; run the same command again",
        ),
    ],
)
@pytest.mark.parametrize("stop", ["terminated", "interrupted"])
def test_every_command_that_writes_says_what_it_kept(
    finished_run, tmp_path, cli, monkeypatch, command, where, needle, stop
):
    """Whatever a writing command was doing when SIGTERM (or Ctrl-C) came, its one line says
    what is kept and how to go on, as `run`'s has said of its records."""
    from dllmbench.core.errors import Terminated

    module, _, attribute = where.rpartition(".")

    def stopped(*args, **kwargs):
        raise Terminated if stop == "terminated" else KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), attribute, stopped)
    given = {"run": finished_run, "tmp": tmp_path}
    done = cli(*[str(word).format(**given) for word in command])
    what = "terminated (SIGTERM)" if stop == "terminated" else "interrupted"
    assert done.code == (143 if stop == "terminated" else 130), done.err
    assert done.err.startswith(f"dllmbench: {what}; ") and done.err.count("\n") == 1
    assert needle.format(**given) in done.err


def heartbeat_of(path: Path, pid: int, started: float) -> None:
    """`heartbeat.json` of a whole run that says it runs, beating now, as `pid` of this host."""
    now = time.time()
    beat = {"share": None, "token": "t", "pid": pid, "host": socket.gethostname()}
    beat.update(started=started, beat=now, state="running", records_written=1)
    (path / "heartbeat.json").write_text(json.dumps(beat))


def test_a_heartbeat_of_a_dead_pid_is_dead_at_once(finished_run):
    """A process killed (SIGKILL: its heartbeat still says running, and is fresh) is dead as
    soon as its pid is gone on this host, not after the heartbeat goes stale."""
    heartbeat_of(finished_run, dead_pid(), time.time() - 100)
    (process,) = status(finished_run).processes
    assert process.state == "dead"


def test_a_heartbeat_whose_pid_another_process_took_is_dead(finished_run):
    """The pid of a killed process taken by a process started since (pids are reused): the
    heartbeat is not that process's, and status says dead, not running."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        heartbeat_of(finished_run, other.pid, time.time() - 100)
        (process,) = status(finished_run).processes
        assert process.state == "dead"
        heartbeat_of(finished_run, other.pid, time.time())  # its own: it runs
        (process,) = status(finished_run).processes
        assert process.state == "running"
    finally:
        other.kill()
        other.wait()
