"""Claimed chunks and heartbeats: who takes which chunk, when a holder counts as gone, and
what the first process of a launch stops for."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dllmbench.core.errors import UserError
from dllmbench.running.launched import STARTUP_SECONDS, Watch
from dllmbench.storage.claims import Claims, abandoned, claimed_tokens
from dllmbench.storage.heartbeat import STALE_SECONDS, Beat, Heartbeat, read_beats
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard

IDS = [f"p{i}" for i in range(10)]  # chunks of 4: p0–p3, p4–p7, p8–p9


def beat_file(folder: Path, share: str, token: str, **fields) -> None:
    """A heartbeat as another process would write it."""
    index, count = share.split("/")
    now = time.time()
    data = {
        "share": share,
        "token": token,
        "pid": fields.pop("pid", 1),
        "host": fields.pop("host", socket.gethostname()),
        "started": fields.pop("started", now),
        "beat": fields.pop("beat", now),
        "state": fields.pop("state", "running"),
        **fields,
    }
    (folder / f"heartbeat.shard-{index}-of-{count}.json").write_text(json.dumps(data))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_processes_take_the_chunks_in_order_and_never_a_done_one(tmp_path):
    a = Claims(tmp_path, IDS, "1/2", "a")
    b = Claims(tmp_path, IDS, "2/2", "b")
    for share, token in (("1/2", "a"), ("2/2", "b")):
        beat_file(tmp_path, share, token, pid=os.getpid())  # both alive
    first, second = a.claim(), b.claim()
    assert first is not None and second is not None
    assert (first[0].index, first[0].problems, first[1]) == (0, ["p0", "p1", "p2", "p3"], False)
    assert (second[0].index, second[1]) == (1, False)
    a.finish(0)
    third = a.claim()
    assert third is not None and third[0].index == 2 and third[0].problems == ["p8", "p9"]
    assert a.claim() is None and b.claim() is None  # the rest is held by live processes
    chunks = a.chunks()
    assert [(c.share, c.done) for c in chunks] == [("1/2", True), ("2/2", False), ("1/2", False)]
    assert claimed_tokens(tmp_path) == {"a", "b"}
    assert a.claim(complete={1, 2}) is None  # records already written: nothing to claim


@pytest.mark.parametrize(
    "why",
    ["pid gone on this host", "heartbeat stale on another host", "stopped", "share relaunched"],
)
def test_a_chunk_whose_holder_is_gone_is_taken_over(tmp_path, why):
    b = Claims(tmp_path, IDS, "2/2", "b")
    beat_file(tmp_path, "2/2", "b", pid=os.getpid())
    assert b.claim()[0].index == 0  # type: ignore[index]
    a = Claims(tmp_path, IDS, "1/2", "a")
    beat_file(tmp_path, "1/2", "a", pid=os.getpid())
    assert a.claim()[0].index == 1  # type: ignore[index]
    assert a.claim()[0].index == 2  # type: ignore[index]
    assert a.claim() is None  # b is alive: its chunk stays its own
    changes = {
        "pid gone on this host": {"pid": dead_pid()},
        "heartbeat stale on another host": {
            "host": "elsewhere",
            "beat": time.time() - STALE_SECONDS - 1,
        },
        "stopped": {"pid": os.getpid(), "state": "stopped"},
    }
    if why == "share relaunched":  # a new invocation of share 2/2: the old one is gone
        beat_file(tmp_path, "2/2", "b2", pid=os.getpid())
    else:
        beat_file(tmp_path, "2/2", "b", **changes[why])
    assert [c.index for c in abandoned(a.chunks(), read_beats(tmp_path))] == [0]
    taken = a.claim()
    assert taken is not None and taken[0].index == 0 and taken[1] is True
    assert a.chunks()[0].claims == 2 and a.chunks()[0].token == "a"


def test_a_heartbeat_is_written_from_a_thread_and_says_how_it_ended(tmp_path, monkeypatch):
    import dllmbench.storage.heartbeat as heartbeat

    monkeypatch.setattr(heartbeat, "BEAT_SECONDS", 0.05)
    heart = Heartbeat(tmp_path / "heartbeat.shard-1-of-2.json", "1/2").start()
    first = read_beats(tmp_path)["1/2"]
    time.sleep(0.3)  # the main thread does nothing: the thread beats
    later = read_beats(tmp_path)["1/2"]
    assert later.beat > first.beat and later.alive()
    heart.update(records_written=5)
    heart.stop("finished")
    final = read_beats(tmp_path)["1/2"]
    assert (final.state, final.records_written, final.alive()) == ("finished", 5, False)
    assert Beat.from_dict({"token": "x"}) is None  # not a heartbeat


def watch(tmp_path: Path, started: float) -> Watch:
    (tmp_path / "manifest.json").write_text("{}")
    return Watch(RunDir(tmp_path), Shard(1, 2, launched=True), None, started=started)


def test_the_first_process_stops_for_a_process_that_never_starts(tmp_path):
    now = time.time()
    w = watch(tmp_path, now)
    assert w.check(now + STARTUP_SECONDS - 1) is None  # still starting, perhaps
    error = w.check(now + STARTUP_SECONDS + 1)
    assert isinstance(error, UserError)
    assert "share 2/2 of this launch has written no heartbeat in 60 s" in str(error)
    # a heartbeat of an earlier launch is not this launch's
    beat_file(tmp_path, "2/2", "old", started=now - 3600, beat=now - 3500)
    assert "no heartbeat" in str(w.check(now + STARTUP_SECONDS + 1))


def test_the_first_process_stops_for_one_that_died_before_claiming(tmp_path, capsys):
    now = time.time()
    w = watch(tmp_path, now)
    beat_file(tmp_path, "2/2", "b", pid=dead_pid(), started=now)
    error = w.check(now + 1)
    assert isinstance(error, UserError)
    assert "share 2/2 (pid" in str(error) and "stopped before it claimed any work" in str(error)
    # one that died holding chunks: its chunks are taken over, the run goes on
    Claims(tmp_path, IDS, "2/2", "b").claim()
    assert w.check(now + 1) is None
    assert "share 2/2" in capsys.readouterr().err
