"""What a command killed or terminated half-way leaves in a run directory: a merge cut between
its two files, temporary files of an atomic write, compute.json written by the heartbeat, and
the line a SIGTERM leaves (tests/test_shards.py has a run's own SIGTERM)."""

from __future__ import annotations

import json
import shutil
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
