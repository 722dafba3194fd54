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
from dllmbench.storage.heartbeat import STALE_SECONDS, STUCK_SECONDS, Beat, Heartbeat, read_beats
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


class LiveBeat:
    """The heartbeat of a process that is running (every holder of a claim is alive)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def alive(self, now: float | None = None) -> bool:
        return True

    def working(self, now: float | None = None) -> bool:
        return True


def claim_schedule(folder: Path, problems: int, processes: int, in_flight: int = 32):
    """Processes of a launch that start together, each admitting problems as the engine does
    (up to `in_flight` at once, asking for more as each finishes) from its `ClaimedWork`, and
    each finishing one problem per step. Returns the problems each ran before the first
    finished one, the problems each ran in all, and the steps until the last finished."""
    from dllmbench.running.launched import ClaimedWork
    from dllmbench.storage.claims import chunk_size

    folder.mkdir()
    ids = [f"q{i}" for i in range(problems)]
    feeds, works, admitted = [], [], []
    for i in range(1, processes + 1):
        claims = Claims(
            folder,
            ids,
            f"{i}/{processes}",
            f"t{i}",
            size=chunk_size(problems, processes),
            processes=processes,
        )
        problem_of = {x: x for x in ids}
        work = ClaimedWork(claims, problem_of, ["m"], set(), RunDir(folder))  # type: ignore[arg-type]
        works.append(work)
        feeds.append(iter(work.stream()))
        admitted.append([])

    def admit(i: int) -> None:
        while len(admitted[i]) < in_flight and (problem := next(feeds[i], None)) is not None:
            admitted[i].append(problem)

    for i in range(processes):
        admit(i)
    first = [len(a) for a in admitted]
    ran, steps = [0] * processes, 0
    while any(admitted):
        steps += 1
        for i in range(processes):
            if admitted[i]:
                works[i].recorded({"problem": admitted[i].pop(0), "method": "m"})
                ran[i] += 1
                admit(i)
    return first, ran, steps


def test_each_process_claims_its_share_so_none_sits_idle(tmp_path, monkeypatch):
    """A process takes chunks only up to its share of what remains (the problems not done
    over the processes), however many problems its engine could hold: 3 processes on 48
    problems at 32 problems in flight hold 16 each (taking chunks up to 32 at once left the
    third with none), and at 64 processes every one has work from the start on GSM8K,
    MATH-500 and HumanEval, ending within a chunk of the even share the docs' wall-time
    estimate assumes."""
    import dllmbench.storage.claims as claims_module

    beats = {f"{i}/{n}": LiveBeat(f"t{i}") for n in (3, 64) for i in range(1, n + 1)}
    monkeypatch.setattr(claims_module, "read_beats", lambda path: beats)
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # a schedule, not a disk: no syncs
    first, ran, steps = claim_schedule(tmp_path / "toy", 48, 3)
    assert first == ran == [16, 16, 16] and steps == 16
    for problems, chunk, worst in ((1319, 4, 24), (500, 4, 8), (164, 2, 4)):
        first, ran, steps = claim_schedule(tmp_path / str(problems), problems, 64)
        assert min(first) >= chunk and sum(ran) == problems  # nobody idle, nothing twice
        assert steps == worst <= problems / 64 + chunk  # the even share, and one chunk


def test_a_relaunch_under_the_same_launch_id_does_not_take_the_old_heartbeats(tmp_path):
    """A Slurm requeue keeps the job id and step, `torchrun --rdzv-id NAME` repeats its id:
    the heartbeats the earlier launch left (a process that stopped before claiming, one that
    never came back) are not this launch's, so they neither stop it nor count as started."""
    from dllmbench.running.launched import RELAUNCH_SECONDS

    now = time.time()
    (tmp_path / "manifest.json").write_text("{}")
    w = Watch(RunDir(tmp_path), Shard(1, 2, launched=True), "slurm:7.0", started=now)
    old = now - RELAUNCH_SECONDS - 600
    beat_file(tmp_path, "2/2", "old", pid=dead_pid(), started=old, beat=old + 5)
    (tmp_path / "heartbeat.shard-2-of-2.json").write_text(
        (tmp_path / "heartbeat.shard-2-of-2.json")
        .read_text()
        .replace("}", ', "launch": "slurm:7.0"}')
    )
    assert not w.ours(read_beats(tmp_path)["2/2"])
    assert w.check(now + 5) is None  # not "stopped before it claimed": still starting
    assert "no heartbeat in 60 s" in str(w.check(now + STARTUP_SECONDS + 1))
    # the relaunched process of share 2/2, under the same id, from a node 40 s behind
    beat_file(tmp_path, "2/2", "new", pid=dead_pid(), started=now - 40, beat=now - 40)
    (tmp_path / "heartbeat.shard-2-of-2.json").write_text(
        (tmp_path / "heartbeat.shard-2-of-2.json")
        .read_text()
        .replace("}", ', "launch": "slurm:7.0"}')
    )
    assert w.ours(read_beats(tmp_path)["2/2"])
    assert "stopped before it claimed any work" in str(w.check(now + 5))


# -- a process that hangs -----------------------------------------------------------------------


def stuck_beat(folder: Path, share: str, token: str, doing: str = "forward") -> None:
    """The heartbeat of a live process whose main thread has not moved for longer than
    `STUCK_SECONDS`: its heartbeat thread still beats."""
    beat_file(
        folder, share, token, pid=os.getpid(), doing=doing, since=time.time() - STUCK_SECONDS - 5
    )


def test_a_stuck_process_that_moves_again_writes_none_of_its_chunks_records(tmp_path):
    """Share 2/2 claims a chunk and gets stuck in a forward (its heartbeat beats on); share
    1/2 takes the chunk over and writes its records. When 2/2 moves again (after 1/2 merged,
    say), the records it finishes for that chunk are not written: the check is made under the
    claim lock, against the chunk's last claim."""
    from dllmbench.running.launched import ClaimedWork

    rundir = RunDir(tmp_path)
    b = Claims(tmp_path, IDS, "2/2", "b")
    beat_file(tmp_path, "2/2", "b", pid=os.getpid(), doing="forward", since=time.time())
    assert b.claim()[0].index == 0  # type: ignore[index]
    a = Claims(tmp_path, IDS, "1/2", "a")
    beat_file(tmp_path, "1/2", "a", pid=os.getpid())
    assert a.claim()[0].index == 1  # type: ignore[index]
    assert a.claim()[0].index == 2  # type: ignore[index]
    assert a.claim() is None  # 2/2 is working: its chunk is its own
    stuck_beat(tmp_path, "2/2", "b")
    taken = a.claim()
    assert taken is not None and (taken[0].index, taken[1]) == (0, True)
    told: list[str] = []
    late = ClaimedWork(b, {p: p for p in IDS}, ["m"], set(), rundir, tell=told.append)  # type: ignore[arg-type]
    holder = ClaimedWork(a, {p: p for p in IDS}, ["m"], set(), rundir)  # type: ignore[arg-type]
    record = {"problem": "p0", "method": "m", "by": "a"}
    assert holder.write(record, rundir.append) is True
    for problem in ("p0", "p1"):
        assert late.write({"problem": problem, "method": "m", "by": "b"}, rundir.append) is False
    written = [json.loads(x) for x in rundir.samples_path.read_text().splitlines()]
    assert written == [record]  # nothing twice, nothing from the process taken over
    assert late.dropped == 2 and len(told) == 1 and "chunk 1 was taken over" in told[0]


def test_a_claim_lock_held_too_long_is_one_line_naming_its_holder(tmp_path, monkeypatch):
    """A process that hangs holding `.lock.claims` no longer blocks the others for ever: they
    wait `STUCK_SECONDS`, saying in their heartbeats that they wait for the claim lock, then
    stop with one line naming the holder."""
    import threading

    import dllmbench.storage.claims as claims_module

    monkeypatch.setattr(claims_module, "STUCK_SECONDS", 0.5)
    holder = Claims(tmp_path, IDS, "1/2", "a")
    heart = Heartbeat(tmp_path / "heartbeat.shard-2-of-2.json", "2/2")
    waiter = Claims(tmp_path, IDS, "2/2", heart.token, heart=heart)
    failed: list[BaseException] = []
    seen: list[str | None] = []

    def claim() -> None:
        try:
            waiter.claim()
        except UserError as exc:
            failed.append(exc)

    with holder._locked():
        thread = threading.Thread(target=claim, daemon=True)
        thread.start()
        time.sleep(0.2)
        seen.append(heart.beat.doing)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the wait for the claim lock did not end"
    assert seen == ["claim lock"] and heart.beat.doing is None
    assert len(failed) == 1
    message = str(failed[0])
    assert f"held by share 1/2 (pid {os.getpid()} on {socket.gethostname()})" in message
    assert "so that process hangs; end it (kill" in message and "\n" not in message


def test_a_stuck_process_is_said_by_status_and_by_the_watches(tmp_path, capsys):
    """A process whose heartbeat beats while its forward (or the claim lock) has not moved
    for longer than `STUCK_SECONDS` is `stuck` in `status`, is said once by the others'
    watches, counts as ended for the first process (which would wait for it for ever), and
    its chunks are taken over."""
    from dllmbench.running.status import status

    now = time.time()
    (tmp_path / "manifest.json").write_text(
        json.dumps({"task": {"problem_ids": IDS}, "methods": [{"id": "m"}]})
    )
    w = Watch(RunDir(tmp_path), Shard(1, 2, launched=True), None, started=now - 1)
    beat_file(tmp_path, "2/2", "b", pid=os.getpid(), doing="forward", since=now)
    Claims(tmp_path, IDS, "2/2", "b").claim()
    assert not w.others_ended(now)
    stuck_beat(tmp_path, "2/2", "b")
    found = status(tmp_path)
    (process,) = found.processes
    assert (process.state, process.doing) == ("stuck", "forward")
    assert process.stuck_seconds is not None and process.stuck_seconds > STUCK_SECONDS
    assert found.chunks is not None and found.chunks.abandoned == 1
    assert w.check(time.time()) is None and w.check(time.time()) is None
    said = capsys.readouterr().err
    assert said.count("share 2/2") == 1 and "is stuck: in a forward for" in said
    assert w.others_ended()
    stuck_beat(tmp_path, "2/2", "b", doing="waiting")  # waiting for others is not a hang
    assert status(tmp_path).processes[0].state == "running"
