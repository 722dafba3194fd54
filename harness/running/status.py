"""`dllmbench status RUN_DIR`: how far a run is, per process, from the files it writes.

The records done come from every samples file; each process's state, records, rate and ETA
from its heartbeat (`storage/heartbeat.py`); chunks from the claim file of a launched run.
Nothing is locked or written: it may be called at any time, from any machine that sees the
run directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.jsonfile import read_object
from dllmbench.storage.claims import CLAIMS, Claims, Owner
from dllmbench.storage.heartbeat import Beat, read_beats
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import parse_shard, samples_name


@dataclass
class ProcessStatus:
    share: str | None  # "I/N", or None for a whole run
    state: str  # running, finished, stopped (it ended without finishing), dead (it vanished)
    pid: int
    host: str
    last_heartbeat: float  # seconds ago
    records_written: int  # by this invocation
    planned: int | None  # records this invocation has to write (a fixed share, a whole run)
    rate: float | None  # records per second
    eta_seconds: float | None
    doing: str | None = None  # what its main thread does: forward, claim lock, waiting
    stuck_seconds: float | None = None  # state "stuck": in `doing` this long, beating
    held: int | None = None  # a share's records in its samples file, by any invocation


@dataclass
class ChunkStatus:
    total: int
    done: int
    held: int  # claimed by a running process, not done
    abandoned: int  # claimed by a process that is gone, not done
    free: int


@dataclass
class RunStatus:
    path: str
    planned: int  # problems × methods
    done: int  # of them with a record
    complete: bool
    merged: bool  # results.json written, and every record it was built from is there
    stale: bool = False  # results.json written, but records are missing (a cut samples file)
    # results.json written, but what these wrote since is not in compute.json: processes
    # ("share 2/3") whose compute entry changed, "records" when records were added
    changed: list[str] = field(default_factory=list)
    # complete, but results.json or compute.json is there and not a JSON object (a file cut
    # or edited): not merged; `merge` rewrites results.json (compute.json moved away first)
    damaged: list[str] = field(default_factory=list)
    # complete and results.json written, but compute.json is missing or does not account for
    # the records (a merge, or a run's end, cut short before it was written): not merged
    unaccounted: bool = False
    processes: list[ProcessStatus] = field(default_factory=list)
    chunks: ChunkStatus | None = None
    eta_seconds: float | None = None
    # fixed shares ("1/3") of the count the run's shares use that have no heartbeat: never
    # started here (a job not yet scheduled, or lost before it began)
    not_started: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def state_of(beat: Beat, now: float) -> str:
    """finished, stopped, running, stuck (its heartbeat beats, its work has not moved for
    longer than `STUCK_SECONDS`: a forward or the claim lock), or dead."""
    if beat.state in ("finished", "stopped"):
        return beat.state
    if not beat.alive(now):
        return "dead"
    return "running" if beat.stuck(now) is None else "stuck"


def process_status(beat: Beat, now: float) -> ProcessStatus:
    state = state_of(beat, now)
    stuck = beat.stuck(now) if state == "stuck" else None
    rate = beat.rate
    eta = None
    if state == "running" and rate and beat.planned is not None:
        eta = max(0, beat.planned - beat.records_written) / rate
    return ProcessStatus(
        share=beat.share,
        state=state,
        pid=beat.pid,
        host=beat.host,
        last_heartbeat=round(max(0.0, now - beat.beat), 1),
        records_written=beat.records_written,
        planned=beat.planned,
        rate=None if rate is None else round(rate, 4),
        eta_seconds=None if eta is None else round(eta, 1),
        doing=beat.doing if state in ("running", "stuck") else None,
        stuck_seconds=None if stuck is None else round(stuck, 1),
    )


ENTRY = ("passes", "records_written", "finished")  # what changes when a process goes on


def changed_since_merge(rundir: RunDir) -> list[str]:
    """What was written after compute.json was last written whole (by the merge, or at the
    end of a run): the processes whose compute entry changed since, and "records" when
    records were added (written twice, most often). Empty when nothing changed."""
    try:
        saved = json.loads(rundir.total_compute_path.read_text(encoding="utf-8"))
        before = {_key(e): [e.get(f) for f in ENTRY] for e in saved["invocations"]}
        total = saved["total"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    now = rundir.compute_now()
    changed = [
        f"share {e['shard']}" if e.get("shard") else "the whole run"
        for e in now["invocations"]
        if before.get(_key(e)) != [e.get(f) for f in ENTRY]
    ]
    counts = (now["total"].get("records"), now["total"].get("duplicates"))
    if counts != (total.get("records"), total.get("duplicates")):
        changed.append("records")
    return list(dict.fromkeys(changed))


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in ("shard", "token", "pid", "host", "samples", "offset"))


def status(path: Path, now: float | None = None) -> RunStatus:
    """The state of the run directory `path` now."""
    now = time.time() if now is None else now
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"{path} holds no run (no manifest.json); give a run directory")
    manifest = read_object(manifest_path, "run the command that made it again")
    try:
        ids = [str(x) for x in manifest["task"]["problem_ids"]]
        methods = [str(m["id"]) for m in manifest["methods"]]
    except (KeyError, TypeError) as exc:
        raise UserError(
            f"{manifest_path} lacks the problem ids or methods ({exc}); it is damaged: run the "
            "command that made it again"
        ) from None
    rundir = RunDir(path)
    wanted = {(p, m) for p in ids for m in methods}
    done = len(wanted & {(r["problem"], r["method"]) for r in rundir.read_records()})
    beats = read_beats(path)
    processes = [
        replace(process_status(b, now), held=_held(path, share))
        for share, b in sorted(beats.items(), key=_order)
    ]
    chunks = None
    if (path / CLAIMS).exists():
        owner = Owner(beats, now)
        found = Claims(path, ids).chunks()
        open_ = [c for c in found if not c.done]
        held = [c for c in open_ if c.token is not None and owner.alive(c)]
        gone = [c for c in open_ if c.token is not None and not owner.alive(c)]
        chunks = ChunkStatus(
            total=len(found),
            done=len(found) - len(open_),
            held=len(held),
            abandoned=len(gone),
            free=len(open_) - len(held) - len(gone),
        )
    counts = {parse_shard(share).count for share in beats if share is not None}
    not_started = (
        []
        if chunks is not None
        else [
            f"{i}/{n}" for n in sorted(counts) for i in range(1, n + 1) if f"{i}/{n}" not in beats
        ]
    )
    rate = sum(p.rate or 0.0 for p in processes if p.state == "running")
    remaining = len(wanted) - done
    merged = remaining == 0 and (path / "results.json").exists()
    damaged = [name for name in MERGED if merged and not _an_object(path / name)]
    unaccounted = merged and not damaged and not _accounted(rundir.total_compute_path)
    changed = changed_since_merge(rundir) if merged and not damaged and not unaccounted else []
    return RunStatus(
        path=str(path),
        planned=len(wanted),
        done=done,
        complete=remaining == 0,
        merged=merged and not changed and not damaged and not unaccounted,
        stale=remaining > 0 and (path / "results.json").exists(),
        changed=changed,
        damaged=damaged,
        unaccounted=unaccounted,
        processes=processes,
        chunks=chunks,
        eta_seconds=round(remaining / rate, 1) if rate and remaining else None,
        not_started=not_started if remaining else [],
    )


MERGED = ("results.json", "compute.json")  # JSON objects a merge writes


def _an_object(file: Path) -> bool:
    """Whether `file` is missing or holds a JSON object (a missing compute.json is rebuilt)."""
    try:
        return isinstance(json.loads(file.read_text(encoding="utf-8")), dict)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False


def _accounted(file: Path) -> bool:
    """Whether compute.json is there and accounts for the records (its total says which
    passes made them), as a merge and a run's end write it before results.json."""
    try:
        total = json.loads(file.read_text(encoding="utf-8"))["total"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(total, dict) and "records" in total


def _held(path: Path, share: str | None) -> int | None:
    """The records in a share's samples file (whole lines: a torn last one is not a record),
    whichever invocation wrote them; None for a whole run."""
    if share is None:
        return None
    file = path / samples_name(parse_shard(share))
    return file.read_bytes().count(b"\n") if file.exists() else 0


def _order(item: tuple[str | None, Beat]) -> tuple[int, int]:
    share = item[0]
    if share is None:
        return (0, 0)
    index, count = share.split("/")
    return (int(count), int(index))
