"""What a cluster's filesystem may refuse: file locks (NFS without a lock daemon, Lustre
mounted without flock) and space. Each is one line, exit status 2, nothing left behind, and
the records written before a full disk are kept and resume."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
from pathlib import Path

import pytest
from conftest import TOY_RUN, Result, assert_user_error, snapshot
from test_rundir import assert_same_records

from dllmbench.storage.claims import Claims
from dllmbench.storage.filesystem import DiskFull, LocksUnsupported, describe, mount_of
from dllmbench.storage.rundir import RunDir

NO_LOCKS = [errno.ENOLCK, errno.ENOSYS]


@pytest.fixture
def no_flock(monkeypatch):
    """`flock` refused as a filesystem without locks refuses it (ENOLCK, ENOSYS)."""

    def refuse(code: int) -> None:
        def flock(fd, operation):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(fcntl, "flock", flock)

    return refuse


def refused_for_locks(result, where: Path) -> None:
    """One line naming the filesystem (from mountinfo) and what to do."""
    assert_user_error(result, "refuses file locks", describe(where), "Lustre: -o flock")


def test_the_filesystem_is_found_in_mountinfo(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/lustre rw - lustre 10.0.0.1@o2ib:/fs rw,noflock\n"
        "41 22 0:51 / /mnt/my\\040runs rw - nfs4 server:/export rw,nolock\n"
    )
    assert mount_of(Path("/mnt/lustre/a/b"), info) == ("lustre", "/mnt/lustre", "10.0.0.1@o2ib:/fs")
    assert mount_of(Path("/mnt/my runs/x"), info) == ("nfs4", "/mnt/my runs", "server:/export")
    assert mount_of(Path("/home/x"), info) == ("ext4", "/", "/dev/sda1")
    assert mount_of(Path("/x"), tmp_path / "absent") is None


@pytest.mark.parametrize("code", NO_LOCKS)
def test_run_without_flock_is_one_line_and_leaves_nothing(cli, tmp_path, no_flock, code):
    out = tmp_path / "a" / "run"
    no_flock(code)
    refused_for_locks(cli(*TOY_RUN, "--out", out), out)
    assert list(tmp_path.iterdir()) == []  # no .lock, no folder made


@pytest.mark.parametrize("code", NO_LOCKS)
def test_resume_without_flock_leaves_the_run_as_it_was(cli, finished_run, no_flock, code):
    before = snapshot(finished_run)
    no_flock(code)
    refused_for_locks(cli(*TOY_RUN, "--out", finished_run), finished_run)
    assert snapshot(finished_run) == before


@pytest.mark.parametrize("code", NO_LOCKS)
def test_a_launched_rank_without_flock_is_one_line(cli, tmp_path, no_flock, monkeypatch, code):
    for name, value in (("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    out = tmp_path / "run"
    no_flock(code)
    refused_for_locks(cli(*TOY_RUN, "--out", out), out)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", NO_LOCKS)
def test_merge_without_flock_is_one_line(cli, finished_run, no_flock, code):
    (finished_run / ".lock.shard-1-of-2").write_text("")  # a share's lock, probed first
    before = snapshot(finished_run)
    no_flock(code)
    refused_for_locks(cli("merge", finished_run), finished_run)
    assert snapshot(finished_run) == before


def test_the_claim_lock_without_flock_is_one_line(tmp_path, no_flock):
    no_flock(errno.ENOLCK)
    with pytest.raises(LocksUnsupported, match="refuses file locks"):
        Claims(tmp_path, ["p0"], "1/2", "a").claim()


# -- a full disk ------------------------------------------------------------------------------


def fill_disk_after(monkeypatch, records: int) -> None:
    """The disk fills once `records` records are synced: from then on every fsync (of a
    record, of a temporary file before it replaces compute.json or the manifest) raises
    ENOSPC, as a write-back that finds no space does."""
    real = os.fsync
    synced = {"records": 0, "full": records == 0}

    def fsync(fd: int) -> None:
        if synced["full"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        name = os.readlink(f"/proc/self/fd/{fd}")
        real(fd)
        if os.path.basename(name).startswith("samples"):
            synced["records"] += 1
            synced["full"] = synced["records"] >= records

    monkeypatch.setattr(os, "fsync", fsync)


def after_progress(result: Result) -> Result:
    """The result without the progress lines a run prints before it stops."""
    kept = [x for x in result.err.splitlines() if " records (" not in x]
    return Result(result.code, result.out, "\n".join(kept))


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))


def test_a_full_disk_mid_run_is_one_line_and_the_records_resume(
    cli, tmp_path, monkeypatch, finished_run
):
    out = tmp_path / "full"
    fill_disk_after(monkeypatch, 3)
    result = cli(*TOY_RUN, "--out", out)
    assert "records (" in result.err  # it ran, then the disk filled
    assert_user_error(after_progress(result), "no space left on", "the records written so far")
    assert leftovers(out) == []
    lines = (out / "samples.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3 and all(json.loads(x) for x in lines)  # whole records, nothing torn
    assert not (out / "results.json").exists()
    monkeypatch.undo()
    resumed = cli(*TOY_RUN, "--out", out)
    assert resumed.code == 0, resumed.err
    assert_same_records(RunDir(finished_run), RunDir(out))
    written = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(written) == len({(r["problem"], r["method"]) for r in written})  # none twice


def test_a_full_disk_at_start_is_one_line_and_leaves_nothing(cli, tmp_path, monkeypatch):
    out = tmp_path / "run"
    fill_disk_after(monkeypatch, 0)
    result = cli(*TOY_RUN, "--out", out)
    assert_user_error(result, "no space left on", str(out))
    assert list(tmp_path.iterdir()) == []


def test_a_write_cut_short_by_a_full_disk_is_cut_off(tmp_path, monkeypatch):
    """A record whose write fails half-way leaves the samples file ending with the last whole
    record, and no temporary file of compute.json stays."""
    rundir = RunDir(tmp_path)
    rundir.append({"problem": "p0", "method": "m"})
    fill_disk_after(monkeypatch, 0)
    with pytest.raises(Exception, match="no space left on"):
        rundir.append({"problem": "p1", "method": "m"})
    with pytest.raises(Exception, match="no space left on"):
        rundir.save_invocation({"passes": {}})
    assert rundir.samples_path.read_text() == '{"problem": "p0", "method": "m"}\n'
    assert leftovers(tmp_path) == []


@contextlib.contextmanager
def file_size_limit(size: int):
    """This process may write no file past `size` bytes (`ulimit -f`): a write that crosses it
    writes what fits, then fails with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_record_written_half_way_is_cut_off(tmp_path):
    """The file size limit lets a record's write through half-way, then refuses the rest: one
    line, and the samples file ends with the last whole record, not with the half written."""
    rundir = RunDir(tmp_path)
    rundir.append({"problem": "p0", "method": "m"})
    before = rundir.samples_path.read_bytes()
    with file_size_limit(len(before) + 40), pytest.raises(DiskFull) as refused:
        rundir.append({"problem": "p1", "method": "m", "text": "x" * 4000})
    assert "ulimit -f" in str(refused.value) and "\n" not in str(refused.value)
    assert "run the same command again to resume" in str(refused.value)
    assert rundir.samples_path.read_bytes() == before


def test_a_claim_written_half_way_is_cut_off(tmp_path):
    """The claim file is shared by the processes of a launch: a claim torn half-way would
    swallow the next process's line."""
    claims = Claims(tmp_path, [f"p{i}" for i in range(8)], "1/2", "a", size=1, processes=2)
    claims.claim()
    before = claims.file.read_bytes()
    with file_size_limit(len(before) + 10), pytest.raises(DiskFull):
        claims.claim()
    assert claims.file.read_bytes() == before


def test_records_and_claims_files_get_the_mode_the_umask_allows(tmp_path):
    """Appends open their files as `open` would: a team's umask 002 gives 0664, not 0644."""
    import stat

    before = os.umask(0o002)
    try:
        rundir = RunDir(tmp_path)
        rundir.append({"problem": "p0", "method": "m"})
        claims = Claims(tmp_path, ["p0", "p1"], "1/2", "a", size=1, processes=2)
        claims.claim()
    finally:
        os.umask(before)
    for path in (rundir.samples_path, claims.file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
