"""The run directory: manifest.json, append-only samples.jsonl, results.json, leaderboard.md.

Every record is flushed and fsynced as it is written, so a crash or Ctrl-C loses nothing
already written; a torn last line (a crash mid-write) is dropped on resume. Running again
with the same manifest resumes; a different manifest is refused with the differences listed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dllmbench.errors import UserError

# Manifest keys that may change between an interrupted run and its resumption: when and how
# it was started, batch limits (results do not depend on them) and settings of the summary
# only (results.json is recomputed from every record at the end of each invocation).
VOLATILE = ("created", "command", "execution", "reference", "statistics")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def manifest_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys (dotted) whose values differ, volatile keys left out."""
    a = _flatten({k: v for k, v in old.items() if k not in VOLATILE})
    b = _flatten({k: v for k, v in new.items() if k not in VOLATILE})
    return [
        f"{k}: {a.get(k, '(absent)')!r} → {b.get(k, '(absent)')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"
        self.samples_path = self.path / "samples.jsonl"
        self.results_path = self.path / "results.json"
        self.leaderboard_path = self.path / "leaderboard.md"

    def open(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """Create the directory, or resume it; return the records already written."""
        # normalise through JSON so tuples and the like compare as they will be read back
        manifest = json.loads(json.dumps(manifest))
        if self.manifest_path.exists():
            try:
                old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise UserError(
                    f"{self.manifest_path} is not valid JSON ({exc}); choose another --out"
                ) from exc
            diffs = manifest_differences(old, manifest)
            if diffs:
                raise UserError(
                    f"{self.path} holds a different run; choose another --out. "
                    f"Differences: {'; '.join(diffs)}"
                )
            return self.read_records(repair=True)
        if self.path.exists() and any(self.path.iterdir()):
            raise UserError(f"{self.path} exists and is not a run directory; choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.manifest_path, json.dumps(manifest, indent=2) + "\n")
        return []

    def read_records(self, repair: bool = False) -> list[dict[str, Any]]:
        """Records in samples.jsonl; with `repair`, a torn last line is cut off the file."""
        if not self.samples_path.exists():
            return []
        data = self.samples_path.read_bytes()
        lines = data.splitlines(keepends=True)
        records, good = [], 0
        for number, line in enumerate(lines, start=1):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no newline")
                records.append(json.loads(line))
            except ValueError as exc:
                if number == len(lines):
                    break  # torn by a crash mid-write: dropped, and redone on resume
                raise UserError(
                    f"{self.samples_path} line {number} is damaged ({exc}); "
                    "only a torn last line can be repaired"
                ) from exc
            good += len(line)
        if repair and good < len(data):
            with open(self.samples_path, "r+b") as fh:
                fh.truncate(good)
        return records

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        with open(self.samples_path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def write_results(self, results: dict[str, Any], leaderboard: str) -> None:
        _write_atomic(self.results_path, json.dumps(results, indent=2, allow_nan=False) + "\n")
        _write_atomic(self.leaderboard_path, leaderboard)

    def add_invocation(self, entry: dict[str, Any]) -> None:
        """Append this invocation's physical compute to compute.json."""
        path = self.path / "compute.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        data.setdefault("invocations", []).append(entry)
        _write_atomic(path, json.dumps(data, indent=2) + "\n")
