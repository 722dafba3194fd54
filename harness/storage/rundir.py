"""The run directory: manifest.json, append-only samples.jsonl, results.json, leaderboard.md,
compute.json, and `.lock` while a run holds it. A share of a sharded run (`shards.Shard`)
appends to its own `samples.shard-I-of-N.jsonl`, counts its compute in
`compute.shard-I-of-N.json` and holds `.lock.shard-I-of-N` (and `.lock` shared with the other
shares); resume and the summary read every samples file.

`acquire()` is the cheap pre-flight a run does before any heavy work: it checks that the
directory can hold a run, takes its lock, and reads every file a resume will read, so a bad
directory is one error and is left as it was. Every record is flushed and fsynced as it is
written, so a crash or Ctrl-C loses nothing already written; a torn last line (a crash
mid-write) is dropped on resume. Running again with the same manifest resumes; a manifest that
differs in what changes results is refused with the differences listed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from dllmbench.core import shape
from dllmbench.core.errors import UserError
from dllmbench.core.jsonfile import read_object
from dllmbench.storage.filesystem import (
    LocksUnsupported,
    append_whole,
    flock,
    remove_temporaries,
    space_checked,
    temporary_name,
)
from dllmbench.storage.heartbeat import HEARTBEAT, heartbeat_name
from dllmbench.storage.shards import (
    Shard,
    compute_name,
    lock_name,
    running_shares,
    samples_name,
    shards_in,
)

# Manifest keys that may change between an interrupted run and its resumption: provenance
# (when, how and with which code and libraries it was started), batch limits (results do not
# depend on them) and settings of the summary only (results.json is recomputed from every
# record at the end of each invocation).
VOLATILE = (
    "created",
    "command",
    "git_revision",
    "versions",
    "execution",
    "reference",
    "statistics",
)

# What a record needs: the keys resume and the summary read, with their types.
RECORD_KEYS: dict[str, type] = {
    "problem": str,
    "method": str,
    "correct": bool,
    "candidates": list,
    "ledger": dict,
}

LOCK = ".lock"
LOCK_RETRIES = 20  # a share's lock, tried for a second: another process may be probing it


def record_problem(value: Any) -> str | None:
    """What keeps `value` from being a record; None when it is one."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    for key, kind in RECORD_KEYS.items():
        if not isinstance(value.get(key), kind):
            return f"no {kind.__name__} {key!r}"
    if not isinstance(value["ledger"].get("total_passes"), int):
        return "no int 'ledger.total_passes'"
    flops = value["ledger"].get("total_flops")
    if flops is not None and (isinstance(flops, bool) or not isinstance(flops, int)):
        return "'ledger.total_flops' is no int"
    for i, candidate in enumerate(value["candidates"]):  # what the summary reads of each
        if not isinstance(candidate, dict):
            return f"candidate {i} is a JSON {type(candidate).__name__}, not an object"
        for key in ("valid", "correct"):
            if not isinstance(candidate.get(key), bool):
                return f"no bool 'candidates[{i}].{key}'"
    return None


def record_mismatch(record: dict[str, Any], method: Mapping[str, Any]) -> str | None:
    """What in a record (`record_problem` found none) disagrees with itself or with its
    method's manifest entry, as the engine never writes it; None when nothing does: its
    `correct` is its selected candidate's (false when none was selected), its `total_passes`
    the sum of its `passes`, and those are its method's `cost` (at most it, kind by kind, for
    a capped method)."""
    selected, candidates = record.get("selected"), record["candidates"]
    if selected is None:
        if record["correct"]:
            return "correct is true, but no candidate was selected"
    elif isinstance(selected, bool) or not isinstance(selected, int):
        return f"selected is {selected!r}, not a candidate's index"
    elif not 0 <= selected < len(candidates):
        return f"selected is {selected}, but it has {len(candidates)} candidates"
    elif record["correct"] != candidates[selected]["correct"]:
        return f"correct is {str(record['correct']).lower()}, unlike its selected candidate's"
    passes = record["ledger"].get("passes")
    if not isinstance(passes, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in passes.values()
    ):
        return "ledger.passes is not passes by kind"
    if sum(passes.values()) != record["ledger"]["total_passes"]:
        return "ledger.total_passes is not the sum of ledger.passes"
    cost = method.get("cost")
    if isinstance(cost, dict):
        spent = {k: v for k, v in passes.items() if v}
        want = {k: v for k, v in cost.items() if v}
        if method.get("capped"):
            if any(v > want.get(k, 0) for k, v in spent.items()):
                return f"ledger.passes {spent} exceed its method's cap {want}"
        elif spent != want:
            return f"ledger.passes {spent} are not its method's cost {want}"
    return None


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values; a list of objects with an `id` (the methods) is keyed by
    their ids, so an added method is one key, not a changed list."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(x, dict) and isinstance(x.get("id"), str) for x in value)
    ):
        value = {x["id"]: x for x in value}
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


SHOWN_DIFFERENCES = 6  # differences a refusal lists (then: "and N more")
SHOWN_CHARACTERS = 48  # of each value


def _brief(value: Any) -> str:
    """A value's repr, cut to a readable length."""
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    more = f" ({len(value)} items)" if isinstance(value, (list, dict)) else ""
    return text[: SHOWN_CHARACTERS - 1] + "…" + more


def brief_differences(diffs: list[str]) -> str:
    """The first differences and how many more: one short line."""
    shown = "; ".join(diffs[:SHOWN_DIFFERENCES])
    rest = len(diffs) - SHOWN_DIFFERENCES
    return shown + (f"; and {rest} more" if rest > 0 else "")


def _located(manifest: dict[str, Any]) -> set[str]:
    """Dotted config keys of the plugins' fields that located checkpoint files (`weights`)."""
    plugins = {"backbone": manifest.get("backbone")}
    scorers = manifest.get("scorers")
    if isinstance(scorers, dict):
        plugins.update({f"scorers.{name}": entry for name, entry in scorers.items()})
    return {
        f"{where}.config.{field}"
        for where, entry in plugins.items()
        if isinstance(entry, dict) and isinstance(entry.get("weights"), dict)
        for field in entry["weights"]
    }


# top-level manifest keys whose differences follow from others: listed after them
_DERIVED = {"methods": 1, "reference_row": 2}


def manifest_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys (dotted) whose values differ. Volatile keys are left out, and so is a config
    field that located checkpoint files: those are compared by their hashes under `weights`."""
    skip = _located(old) | _located(new)
    a = _flatten({k: v for k, v in old.items() if k not in VOLATILE})
    b = _flatten({k: v for k, v in new.items() if k not in VOLATILE})
    absent = object()
    keys = [
        k
        for k in sorted(set(a) | set(b))
        if a.get(k, absent) != b.get(k, absent)
        and not any(k == s or k.startswith(f"{s}.") for s in skip)
    ]
    # a method added or dropped is one difference, not one per key of its entry
    groups: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split(".")
        group = ".".join(parts[:2]) if parts[0] == "methods" else k
        groups.setdefault(group, []).append(k)
    out = []
    # what the user changed (task, sampling, budgets, plugins) before what follows from it
    # (each method's price, the reference row), so a cut list still names the cause
    ordered = sorted(groups.items(), key=lambda item: _DERIVED.get(item[0].split(".")[0], 0))
    for group, members in ordered:
        if group.startswith("methods.") and all(k not in a for k in members):
            out.append(f"{group}: added")
        elif group.startswith("methods.") and all(k not in b for k in members):
            out.append(f"{group}: dropped")
        else:
            out += [
                f"{k}: {_brief(a[k]) if k in a else '(absent)'} → "
                f"{_brief(b[k]) if k in b else '(absent)'}"
                for k in members
            ]
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path, text: str | bytes) -> Path:
    """`text` (or bytes, written as they are) in a temporary file beside `path`, named for
    this process, fsynced: renamed over `path`, it is whole even after a power cut (a rename
    of data not yet on disk can leave an empty file). A write that fails (a full disk:
    `DiskFull`, one line) leaves none."""
    tmp = temporary_name(path)
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    try:
        with space_checked(path), open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_atomic(path: Path, text: str | bytes, durable: bool = True) -> None:
    """Replace `path` whole; a failed write leaves `path` as it was and no temporary file.
    The new content is fsynced before the rename, so whenever a kill or a power cut comes
    `path` holds the old content or the new, never an empty or torn file. `durable=False`
    skips the directory's fsync only: after a power cut the rename itself may be lost (the
    file as it was before), not the file."""
    tmp = _temporary(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def _create_atomic(path: Path, text: str) -> bool:
    """Write `path` whole unless it exists (two shares starting at once: one writes it)."""
    tmp = _temporary(path, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: replace, as before shares
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


def _read_json(path: Path, fix: str = "choose another --out") -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {fix}") from exc


def compute_document(
    entries: list[dict[str, Any]], accounts: Accounts | None = None
) -> dict[str, Any]:
    """compute.json: every invocation's entry (every process of a sharded run) and their
    total: passes charged, physical forwards, rows, seconds and tokens per kind, with the
    padding ratio (tokens computed over real tokens). With `accounts` (the records of every
    samples file, read at the end of a run or by merge), the total also says which of the
    charged passes made the records kept (`passes`: exactly the sum of their ledgers), which
    made records written twice (`duplicates`) and which made no record (`unrecorded`: work in
    flight when a process stopped), and each entry says what it recorded."""
    charged: Counter[str] = Counter()
    charged_flops: Counter[str] = Counter()
    physical: dict[str, Counter[str]] = {}
    for entry in entries:
        charged.update(entry.get("passes", {}))
        charged_flops.update(entry.get("flops", {}))
        for kind, numbers in entry.get("physical", {}).items():
            physical.setdefault(kind, Counter()).update(
                {k: v for k, v in numbers.items() if k != "padding"}
            )
    total: dict[str, Any] = {
        "processes": len(entries),
        "records_written": sum(e.get("records_written", 0) for e in entries),
        "wall_seconds": round(sum(e.get("wall_seconds", 0.0) for e in entries), 6),
        "waited_seconds": round(sum(e.get("waited_seconds", 0.0) for e in entries), 6),
        "charged": _sorted(charged),
        "charged_flops": _sorted(charged_flops),
        "physical": {kind: _physical(physical[kind]) for kind in sorted(physical)},
    }
    if accounts is not None:
        entries = [
            {**e, "recorded": accounts.recorded[i]} if i in accounts.recorded else e
            for i, e in enumerate(entries)
        ]
        unrecorded = Counter(charged)
        unrecorded.subtract(accounts.passes)
        unrecorded.subtract(accounts.duplicate_passes)
        total.update(
            records=accounts.records,
            passes=_sorted(accounts.passes),
            flops=_sorted(accounts.flops),
            duplicates={
                "records": accounts.duplicates,
                "passes": _sorted(accounts.duplicate_passes),
            },
            unrecorded=_sorted(unrecorded),
        )
    return {"invocations": entries, "total": total}


def _sorted(counts: Counter[str]) -> dict[str, int]:
    return {k: v for k, v in sorted(counts.items()) if v}


@dataclass
class Accounts:
    """What the records of a run directory's samples files spent: the records kept (the
    first of each (problem, method)), those written twice, and per compute entry (by index)
    the records it wrote: the lines of its samples file from its `offset` to the next
    invocation's."""

    records: int = 0
    passes: Counter[str] = field(default_factory=Counter)
    flops: Counter[str] = field(default_factory=Counter)  # of the records kept
    duplicates: int = 0
    duplicate_passes: Counter[str] = field(default_factory=Counter)
    recorded: dict[int, dict[str, Any]] = field(default_factory=dict)


def _physical(numbers: Counter[str]) -> dict[str, Any]:
    out: dict[str, Any] = dict(numbers)
    out["seconds"] = round(numbers["seconds"], 6)
    if numbers.get("real_tokens"):
        out["padding"] = round(numbers["tokens"] / numbers["real_tokens"], 6)
    return out


class RunDir:
    def __init__(self, path: str | os.PathLike[str], shard: Shard | None = None):
        self.path = Path(path)
        self.shard = shard
        self.manifest_path = self.path / "manifest.json"
        # this invocation's samples and compute files (a share's own, else the run's)
        self.samples_path = self.path / (samples_name(shard) if shard else "samples.jsonl")
        self.results_path = self.path / "results.json"
        self.leaderboard_path = self.path / "leaderboard.md"
        self.compute_path = self.path / (compute_name(shard) if shard else "compute.json")
        self.total_compute_path = self.path / "compute.json"
        self.lock_path = self.path / LOCK
        self._lock_fd: int | None = None
        self._share_fd: int | None = None  # a share's own lock
        self._made: list[Path] = []  # directories acquire() created, deepest first
        self._compute: dict[str, Any] = {"invocations": []}
        self._slot: int | None = None  # this invocation's index in compute.json
        self._scanned: tuple[list[dict[str, Any]], int, int] | None = None  # by acquire()
        self.samples_offset = 0  # where this invocation's records start in its samples file
        self.notices: list[str] = []  # what acquire() found and mended, to be said
        self.opened = False  # open() accepted the manifest: the run began
        # a run this invocation began anew: the folders acquire() made and compute.json's
        # bytes before (None: none), to take the start back (`take_back`)
        self._began: tuple[list[Path], bytes | None] | None = None

    # -- pre-flight and lock ----------------------------------------------------------------
    def acquire(self) -> None:
        """Check the directory, hold its lock, and read what a resume reads; cheap. An error
        leaves the directory as it was."""
        self._check_location()
        try:
            self._lock()
            self._check_contents()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give the lock back, removing the lock file and any directory acquire() made that
        is still empty. A share removes `.lock` only when no other share holds it."""
        if self._share_fd is not None:
            _unlock(self.path / lock_name(self.shard), self._share_fd)  # type: ignore[arg-type]
            self._share_fd = None
        if self._lock_fd is None:
            for folder in self._made:  # a lock refused (no flock): the folders it made go
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            self._made = []
            return
        try:
            if self.shard is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last share?
            os.unlink(self.lock_path)  # while held: a waiting opener sees it gone and retries
            for folder in self._made:
                os.rmdir(folder)
        except OSError:
            pass  # a folder that holds something stays; a lock other shares hold stays
        finally:
            os.close(self._lock_fd)  # closing releases the lock
            self._lock_fd = None
            self._made = []

    def __enter__(self) -> RunDir:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _check_location(self) -> None:
        try:
            if self.path.exists() and not self.path.is_dir():
                raise UserError(
                    f"run directory {self.path} is not a directory; choose another --out"
                )
            if self.path.is_dir():  # `.` and `/` have no parent to make it in
                return
            parent = next(p for p in self.path.parents if p.exists())
        except OSError as exc:
            raise UserError(
                f"cannot reach run directory {self.path} ({exc.strerror}); choose another --out"
            ) from exc
        if not parent.is_dir():
            raise UserError(
                f"run directory {self.path} cannot be made: {parent} is not a directory; "
                "choose another --out"
            )

    def _lock(self) -> None:
        """`.lock`: exclusive for a whole run, shared by the shares of a sharded run, each of
        which also holds its own `.lock.shard-I-of-N` exclusively."""
        self._made = [p for p in (self.path, *self.path.parents) if not p.exists()]
        mode = fcntl.LOCK_EX if self.shard is None else fcntl.LOCK_SH
        try:
            fd = _take(self.path, self.lock_path, mode)
        except BlockingIOError as busy:
            self._made = []
            shares = ", ".join(s.label for s in running_shares(self.path))
            holder = busy.args[0] or (
                f"share {shares} of a sharded run" if shares else "a process starting now"
            )
            raise UserError(
                f"run directory {self.path} is in use by another dllmbench run ({holder}); "
                "wait for it to finish or choose another --out"
            ) from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        if self.shard is None:
            with space_checked(self.lock_path):
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
            # no other process writes here while this one holds `.lock` alone: a temporary
            # file of another is what a process killed mid-write left
            remove_temporaries(self.path)
            return
        self._share_fd = self._lock_share(self.shard)
        # the share's own files are written by the holder of its lock alone
        own = {compute_name(self.shard), heartbeat_name(self.shard.suffix)}
        remove_temporaries(self.path, lambda name: name in own)

    def _lock_share(self, shard: Shard) -> int:
        path = self.path / lock_name(shard)
        for _ in range(LOCK_RETRIES):
            try:
                fd = _take(self.path, path, fcntl.LOCK_EX)
                break
            except BlockingIOError as busy:
                holder = busy.args[0]
                time.sleep(0.05)
        else:
            raise UserError(
                f"share {shard.label} of run directory {self.path} is already running "
                f"({holder or 'unknown'}); wait for it to finish or run another share"
            )
        os.ftruncate(fd, 0)
        try:
            with space_checked(path):
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        except BaseException:
            _unlock(path, fd)
            raise
        return fd

    def _check_contents(self) -> None:
        try:
            self._read_contents()
        except OSError as exc:
            raise UserError(
                f"cannot read {exc.filename or self.path} ({exc.strerror}); choose another --out"
            ) from exc

    def _read_contents(self) -> None:
        if not self.manifest_path.exists():
            records = [p.name for p in self.path.glob("samples*.jsonl")]
            if records:
                raise UserError(
                    f"{self.path} holds records ({', '.join(sorted(records))}) but no "
                    "manifest.json (deleted or moved?); put the manifest back to resume, or "
                    "choose another --out"
                )
            if any(not _ours(p.name) for p in self.path.iterdir()):
                raise UserError(
                    f"{self.path} exists and is not a run directory; choose another --out"
                )
            return
        manifest = _read_json(self.manifest_path)
        if not isinstance(manifest, dict):
            raise UserError(
                f"{self.manifest_path} holds a JSON {type(manifest).__name__}, not a "
                "manifest object; choose another --out"
            )
        self._scanned = self._scan_all()  # open() resumes from this read: read once
        if shape.manifest_problem(manifest) is None:  # else `open` finds it another run's
            self.refuse_strays(self._scanned[0], manifest)
        if self.compute_path.exists():
            fix = "move it away (it only counts compute) or choose another --out"
            data = _read_json(self.compute_path, fix)
            if not isinstance(data, dict) or not isinstance(data.get("invocations"), list):
                raise UserError(
                    f"{self.compute_path} is not an object with an 'invocations' list; {fix}"
                )
            entries = [e for e in data["invocations"] if isinstance(e, dict)]
            if self.shard is None:
                # compute.json lists the shares' entries too; their own files keep them
                entries = [e for e in entries if not e.get("shard")]
            # a share's own compute file holds only its invocations: every one is kept
            self._compute = {"invocations": entries}
        else:
            self._rebuild_compute()

    def _rebuild_compute(self) -> None:
        """This process's compute file is missing while its samples file holds records (moved
        away, deleted): the entry of the invocations that wrote them is rebuilt from their
        ledgers (their physical forwards and seconds are unknown), and said."""
        records, _, _ = self._scan(self.samples_path)
        if not records:
            return
        passes: Counter[str] = Counter()
        for record in records:
            passes.update(record["ledger"].get("passes", {}))
        entry = {
            "created": None,
            "finished": False,
            "rebuilt": True,  # from the records: nothing else of those invocations is known
            "records_written": len(records),
            "shard": None if self.shard is None else self.shard.label,
            "host": None,
            "pid": None,
            "token": None,
            "samples": self.samples_path.name,
            "offset": 0,
            "wall_seconds": 0.0,
            "waited_seconds": 0.0,
            "passes": _sorted(passes),
            "physical": {},
        }
        self._compute = {"invocations": [entry]}
        self.notices.append(
            f"{self.compute_path} is missing: its entry is rebuilt from the ledgers of the "
            f"{len(records)} records in {self.samples_path.name} (their forwards and seconds "
            "are unknown)"
        )

    # -- manifest and records ---------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        """The manifest on disk; one line naming the file if it is not a JSON object."""
        return read_object(self.manifest_path, "run the command that made it again")

    def open(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """Start the run directory, or resume it; return the records already written (in
        every samples file)."""
        # normalise through JSON so tuples and the like compare as they will be read back
        manifest = json.loads(json.dumps(manifest))
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(manifest, indent=2) + "\n"
        if self.manifest_path.exists() or not _create_atomic(self.manifest_path, text):
            old = _read_json(self.manifest_path)
            diffs = manifest_differences(old, manifest)
            if diffs:
                raise UserError(
                    f"{self.path} holds a different run; choose another --out. "
                    f"Differences: {brief_differences(diffs)}"
                )
            records, good, size = self._scanned or self._scan_all()
            self.refuse_strays(records, manifest)
            if good < size:  # a torn last line: cut off, and its record is redone
                with open(self.samples_path, "r+b") as fh:
                    fh.truncate(good)
            self.samples_offset = good
            self.opened = True
            return records
        compute = self.compute_path.read_bytes() if self.compute_path.exists() else None
        self._began = (self._made, compute)
        self._made = []  # a run directory now: it stays
        self.opened = True
        return []

    def take_back(self) -> bool:
        """Take back a run this invocation began anew and wrote no record to (a setting its
        backbone refused at the first problem): the manifest goes, compute.json is as it was,
        and `release` removes the folders `acquire` made, so the command, corrected, can use
        the same --out. False, and nothing done, for a resumed run, a share of one, or once a
        record is written; False too when a file cannot be removed or put back, with the
        manifest still there (the run begun, as a resume finds it)."""
        written = self.samples_path.exists() and self.samples_path.stat().st_size > 0
        if self._began is None or self.shard is not None or written:
            return False
        made, compute = self._began
        # the manifest goes last: a take-back cut short (a kill, a disk that refuses) leaves
        # the run begun, which the same command resumes, not files without a manifest, which
        # every command refuses; a failure is not said (the refusal being taken back is)
        try:
            self.samples_path.unlink(missing_ok=True)
            if compute is None:
                self.compute_path.unlink(missing_ok=True)
            else:
                _write_atomic(self.compute_path, compute)
            _fsync_dir(self.path)
            self.manifest_path.unlink(missing_ok=True)
        except (OSError, UserError):  # DiskFull, writing compute.json back, is a UserError
            return False
        self._made, self._began, self.opened = made, None, False
        return True

    def samples_files(self) -> list[Path]:
        """Every samples file of the run: samples.jsonl, then the shares' in (N, I) order."""
        files = [self.path / "samples.jsonl"]
        files += [self.path / samples_name(s) for s in shards_in(self.path)]
        if self.samples_path not in files:
            files.append(self.samples_path)
        return [f for f in files if f.exists()]

    def read_records(self, manifest: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Records of every samples file (torn last lines left out); a (problem, method)
        written twice (two runs of different share counts at once) is taken once. With the
        run's `manifest`, a record that is not of the run is refused (`refuse_strays`)."""
        records = self._scan_all()[0]
        if manifest is not None:
            self.refuse_strays(records, manifest)
        return records

    def refuse_strays(self, records: list[dict[str, Any]], manifest: Mapping[str, Any]) -> None:
        """One line naming the first record whose method, or problem, the run's `manifest`
        does not have (`methods`, `task.problem_ids` where it lists them): a line edited or
        copied from another run. The summary would leave it out and the report read it."""
        methods = {m["id"]: m for m in manifest["methods"]}
        ids = manifest["task"].get("problem_ids")
        problems = None if ids is None else set(map(str, ids))
        for record in records:
            problem, method = record["problem"], record["method"]
            if method not in methods:
                why = f"its method {method!r} is not one of the run's {len(methods)} methods"
            elif problems is not None and problem not in problems:
                why = f"its problem {problem!r} is not one of the run's {len(problems)} problems"
            else:
                why = record_mismatch(record, methods[method])
                if why is None:
                    continue
                path, number = self._line_of(problem, method)
                raise UserError(
                    f"{path} line {number} does not hold together ({why}): a line edited; "
                    "delete that line (its problem and method run again)"
                )
            path, number = self._line_of(problem, method)
            raise UserError(
                f"{path} line {number} is not a record of this run ({why}); delete that line"
            )

    def _line_of(self, problem: str, method: str) -> tuple[Path, int]:
        """The samples file and line number of the record of (problem, method) read first."""
        for path in self.samples_files():
            for number, line in enumerate(path.read_bytes().splitlines(), start=1):
                with contextlib.suppress(ValueError, TypeError, KeyError):  # a torn last line
                    record = json.loads(line)
                    if (record["problem"], record["method"]) == (problem, method):
                        return path, number
        raise AssertionError(f"no line holds the record of {problem!r}, {method!r}")

    def _scan_all(self) -> tuple[list[dict[str, Any]], int, int]:
        """The records of every samples file, and the bytes the records of this invocation's
        own file fill and its size (a torn last line is the difference)."""
        records: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        good = size = 0
        for path in self.samples_files():
            found, filled, length = self._scan(path)
            if path == self.samples_path:
                good, size = filled, length
            for record in found:
                if (record["problem"], record["method"]) not in seen:
                    seen.add((record["problem"], record["method"]))
                    records.append(record)
        return records, good, size

    def _scan(self, path: Path) -> tuple[list[dict[str, Any]], int, int]:
        """The records, the bytes they fill and the file's size: a torn last line (a crash
        mid-write, or a share writing now) is the difference; damage before it is an error
        naming the line."""
        if not path.exists():
            return [], 0, 0
        data = path.read_bytes()
        lines = data.splitlines(keepends=True)
        records, good = [], 0
        for number, line in enumerate(lines, start=1):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no newline")
                if b"\0" in line:
                    raise ValueError("it holds NUL bytes, as a write cut short by a crash leaves")
                record = json.loads(line.decode("utf-8"))
            except ValueError as exc:
                if number == len(lines):
                    break  # torn by a crash mid-write: dropped, and redone on resume
                self._damaged(path, number, f"not JSON: {exc}")
            problem = record_problem(record)
            if problem is not None:
                self._damaged(path, number, problem)
            records.append(record)
            good += len(line)
        return records, good, len(data)

    def _damaged(self, path: Path, number: int, problem: str) -> NoReturn:
        raise UserError(
            f"{path} line {number} is damaged ({problem}); delete that line "
            "(its problem and method run again) or choose another --out"
        )

    def append(self, record: dict[str, Any]) -> None:
        """Append a record, flushed and fsynced. A write that fails (a full disk: `DiskFull`,
        one line) is cut off again, so the file ends with the last whole record."""
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        new = not self.samples_path.exists()
        append_whole(self.samples_path, line.encode("utf-8"))
        if new:
            _fsync_dir(self.path)

    def write_results(self, results: dict[str, Any], leaderboard: str) -> None:
        _write_atomic(self.results_path, json.dumps(results, indent=2, allow_nan=False) + "\n")
        _write_atomic(self.leaderboard_path, leaderboard)

    def save_invocation(self, entry: dict[str, Any], durable: bool = True) -> None:
        """Write this invocation's entry of compute.json (a share's: of its own compute file):
        appended the first time, replaced after (the run saves it before each record and as it
        goes, so an interrupted invocation counts too). `durable=False`: no fsync."""
        invocations = self._compute.setdefault("invocations", [])
        if self._slot is None:
            self._slot = len(invocations)
            invocations.append(entry)
        else:
            invocations[self._slot] = entry
        if self.shard is not None:
            text = json.dumps(self._compute, indent=2) + "\n"
            _write_atomic(self.compute_path, text, durable)
        else:
            self.write_compute(invocations, durable=durable)

    def write_compute(
        self,
        own: list[dict[str, Any]] | None = None,
        accounted: bool = False,
        durable: bool = True,
    ) -> None:
        """compute.json: the whole-run invocations (`own`, else those it holds) and every
        share's, with their total; `accounted`: with what the records spent (reads every
        samples file: at the end of a run and by merge)."""
        if own is None:
            own = self._whole_run_invocations()
        entries = list(own)
        for shard in shards_in(self.path, "compute"):  # a process that wrote no record too
            entries += _invocations(self.path / compute_name(shard))
        document = compute_document(entries, self.accounts(entries) if accounted else None)
        _write_atomic(self.total_compute_path, json.dumps(document, indent=2) + "\n", durable)

    def compute_now(self) -> dict[str, Any]:
        """compute.json as a merge would write it now, from every compute and samples file on
        disk (nothing is written): what `status` compares the one written with."""
        entries = [e for e in _invocations(self.total_compute_path) if not e.get("shard")]
        for shard in shards_in(self.path, "compute"):
            entries += _invocations(self.path / compute_name(shard))
        return compute_document(entries, self.accounts(entries))

    def accounts(self, entries: list[dict[str, Any]]) -> Accounts:
        """What the records of every samples file spent, kept and written twice, and which
        compute entry wrote each (by file and byte offset)."""
        starts: dict[str, list[tuple[int, int]]] = {}
        for i, entry in enumerate(entries):
            name, offset = entry.get("samples"), entry.get("offset")
            if isinstance(name, str) and isinstance(offset, int):
                starts.setdefault(name, []).append((offset, i))
        out = Accounts()
        seen: set[tuple[str, str]] = set()
        for path in self.samples_files():
            writers = sorted(starts.get(path.name, []))
            position = 0
            for line in path.read_bytes().splitlines(keepends=True):
                start, position = position, position + len(line)
                try:
                    record = json.loads(line) if line.endswith(b"\n") else None
                except ValueError:
                    record = None
                if record is None or record_problem(record) is not None:
                    continue  # a torn last line
                passes = Counter(record["ledger"].get("passes", {}))
                key = (record["problem"], record["method"])
                if key in seen:
                    out.duplicates += 1
                    out.duplicate_passes.update(passes)
                else:
                    seen.add(key)
                    out.records += 1
                    out.passes.update(passes)
                    out.flops.update(record["ledger"].get("flops", {}))
                owner = [i for offset, i in writers if offset <= start]
                if owner:
                    mine = out.recorded.setdefault(owner[-1], {"records": 0, "passes": {}})
                    mine["records"] += 1
                    mine["passes"] = dict(sorted((Counter(mine["passes"]) + passes).items()))
        return out

    def _whole_run_invocations(self) -> list[dict[str, Any]]:
        if self.shard is None:
            return self._compute.get("invocations", [])
        entries = _invocations(self.total_compute_path)
        return [e for e in entries if not e.get("shard")]


def _ours(name: str) -> bool:
    """A lock file, a heartbeat (a process starting), or another process's temporary file
    while it writes the manifest."""
    return (
        name.startswith(LOCK)
        or HEARTBEAT.match(name) is not None
        or (name.startswith(".") and name.endswith(".tmp"))
    )


def _invocations(path: Path) -> list[dict[str, Any]]:
    """The entries of a compute file; none when it is missing or not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    entries = data.get("invocations") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _take(folder: Path, path: Path, mode: int) -> int:
    """Open `path` (made if missing) and lock it without blocking; BlockingIOError, with the
    holder's line, when another process holds it. A file its holder removed as we locked
    it is opened anew."""
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(
                f"cannot write to run directory {folder} ({exc.strerror}); choose another --out"
            ) from exc
        try:
            flock(fd, mode | fcntl.LOCK_NB, folder)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip()
            os.close(fd)
            raise BlockingIOError(holder) from None
        except LocksUnsupported:
            os.close(fd)
            if not existed:  # made by this attempt: nothing of it stays
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _unlock(path: Path, fd: int) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)
