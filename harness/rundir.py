"""The run directory: manifest.json, append-only samples.jsonl, results.json, leaderboard.md,
compute.json, and `.lock` while a run holds it.

`acquire()` is the cheap pre-flight a run does before any heavy work: it checks that the
directory can hold a run, takes its lock, and reads every file a resume will read, so a bad
directory is one error and is left as it was. Every record is flushed and fsynced as it is
written, so a crash or Ctrl-C loses nothing already written; a torn last line (a crash
mid-write) is dropped on resume. Running again with the same manifest resumes; a manifest that
differs in what changes results is refused with the differences listed.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any, NoReturn

from dllmbench.errors import UserError

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


def record_problem(value: Any) -> str | None:
    """What keeps `value` from being a record; None when it is one."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    for key, kind in RECORD_KEYS.items():
        if not isinstance(value.get(key), kind):
            return f"no {kind.__name__} {key!r}"
    if not isinstance(value["ledger"].get("total_passes"), int):
        return "no int 'ledger.total_passes'"
    return None


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


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


def manifest_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys (dotted) whose values differ. Volatile keys are left out, and so is a config
    field that located checkpoint files: those are compared by their hashes under `weights`."""
    skip = _located(old) | _located(new)
    a = _flatten({k: v for k, v in old.items() if k not in VOLATILE})
    b = _flatten({k: v for k, v in new.items() if k not in VOLATILE})
    return [
        f"{k}: {a.get(k, '(absent)')!r} → {b.get(k, '(absent)')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and not any(k == s or k.startswith(f"{s}.") for s in skip)
    ]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _read_json(path: Path, fix: str = "choose another --out") -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {fix}") from exc


class RunDir:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"
        self.samples_path = self.path / "samples.jsonl"
        self.results_path = self.path / "results.json"
        self.leaderboard_path = self.path / "leaderboard.md"
        self.compute_path = self.path / "compute.json"
        self.lock_path = self.path / LOCK
        self._lock_fd: int | None = None
        self._made: list[Path] = []  # directories acquire() created, deepest first
        self._compute: dict[str, Any] = {"invocations": []}
        self._slot: int | None = None  # this invocation's index in compute.json
        self._scanned: tuple[list[dict[str, Any]], int, int] | None = None  # by acquire()

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
        is still empty."""
        if self._lock_fd is None:
            return
        try:
            os.unlink(self.lock_path)  # while held: a waiting opener sees it gone and retries
            for folder in self._made:
                os.rmdir(folder)
        except OSError:
            pass  # a folder that holds something stays
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
        self._made = [p for p in (self.path, *self.path.parents) if not p.exists()]
        while True:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self._made = []
                raise UserError(
                    f"cannot write to run directory {self.path} ({exc.strerror}); "
                    "choose another --out"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                self._made = []
                raise UserError(
                    f"run directory {self.path} is in use by another dllmbench run "
                    f"({holder}); wait for it to finish or choose another --out"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # its last holder removed that file as we locked it: open it anew
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())

    def _check_contents(self) -> None:
        try:
            self._read_contents()
        except OSError as exc:
            raise UserError(
                f"cannot read {exc.filename or self.path} ({exc.strerror}); choose another --out"
            ) from exc

    def _read_contents(self) -> None:
        if not self.manifest_path.exists():
            if any(p.name != LOCK for p in self.path.iterdir()):
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
        self._scanned = self._scan()  # open() resumes from this read: big files are read once
        if self.compute_path.exists():
            fix = "move it away (it only counts compute) or choose another --out"
            data = _read_json(self.compute_path, fix)
            if not isinstance(data, dict) or not isinstance(data.get("invocations"), list):
                raise UserError(
                    f"{self.compute_path} is not an object with an 'invocations' list; {fix}"
                )
            self._compute = data

    # -- manifest and records ---------------------------------------------------------------
    def open(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """Start the run directory, or resume it; return the records already written."""
        # normalise through JSON so tuples and the like compare as they will be read back
        manifest = json.loads(json.dumps(manifest))
        if self.manifest_path.exists():
            old = _read_json(self.manifest_path)
            diffs = manifest_differences(old, manifest)
            if diffs:
                raise UserError(
                    f"{self.path} holds a different run; choose another --out. "
                    f"Differences: {'; '.join(diffs)}"
                )
            records, good, size = self._scanned or self._scan()
            if good < size:  # a torn last line: cut off, and its record is redone
                with open(self.samples_path, "r+b") as fh:
                    fh.truncate(good)
            return records
        self.path.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.manifest_path, json.dumps(manifest, indent=2) + "\n")
        self._made = []  # a run directory now: it stays
        return []

    def read_records(self) -> list[dict[str, Any]]:
        """Records in samples.jsonl (a torn last line left out)."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[dict[str, Any]], int, int]:
        """The records, the bytes they fill and the file's size: a torn last line (a crash
        mid-write) is the difference; damage before it is an error naming the line."""
        if not self.samples_path.exists():
            return [], 0, 0
        data = self.samples_path.read_bytes()
        lines = data.splitlines(keepends=True)
        records, good = [], 0
        for number, line in enumerate(lines, start=1):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no newline")
                record = json.loads(line)
            except ValueError as exc:
                if number == len(lines):
                    break  # torn by a crash mid-write: dropped, and redone on resume
                self._damaged(number, f"not JSON: {exc}")
            problem = record_problem(record)
            if problem is not None:
                self._damaged(number, problem)
            records.append(record)
            good += len(line)
        return records, good, len(data)

    def _damaged(self, number: int, problem: str) -> NoReturn:
        raise UserError(
            f"{self.samples_path} line {number} is damaged ({problem}); delete that line "
            "(its problem and method run again) or choose another --out"
        )

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        new = not self.samples_path.exists()
        with open(self.samples_path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        if new:
            _fsync_dir(self.path)

    def write_results(self, results: dict[str, Any], leaderboard: str) -> None:
        _write_atomic(self.results_path, json.dumps(results, indent=2, allow_nan=False) + "\n")
        _write_atomic(self.leaderboard_path, leaderboard)

    def save_invocation(self, entry: dict[str, Any]) -> None:
        """Write this invocation's entry of compute.json: appended the first time, replaced
        after (the run saves it as it goes, so an interrupted invocation counts too)."""
        invocations = self._compute.setdefault("invocations", [])
        if self._slot is None:
            self._slot = len(invocations)
            invocations.append(entry)
        else:
            invocations[self._slot] = entry
        _write_atomic(self.compute_path, json.dumps(self._compute, indent=2) + "\n")
