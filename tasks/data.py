"""Where task data come from: a local jsonl file or folder, or the Hugging Face Hub.

The order is: the task's `data` option (a jsonl file, a folder holding the task's files, or a
folder holding `<task>/` like ../shared/data), then `$DLLMBENCH_DATA/<task>/` when that folder
exists, then the Hub through `datasets.load_dataset`. Rows are checked as they are read: a
malformed row is a UserError naming the file and line. File hashes go to the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllmbench.errors import UserError

DATA_ENV = "DLLMBENCH_DATA"


def shared_data_dir() -> Path:
    """The data folder the project's own tests and contract checks read (never the Hub).

    $DLLMBENCH_DATA when set, else `../shared/data` beside the source checkout.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Row:
    """One record and where it came from (file and 1-based line, or the Hub split and index)."""

    fields: dict[str, Any]
    where: str


def read_jsonl(path: Path, task: str, check: Callable[[dict[str, Any]], str | None]) -> list[Row]:
    """Rows of a jsonl file; `check(row)` returns what is wrong with a row, or None."""
    if not path.is_file():
        raise UserError(
            f"{task}: no data file {path}; pass data=PATH to a file or folder that has it"
        )
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                fields = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(
                    f"{task}: {where} is not valid JSON ({exc.msg}); each line must be one "
                    f"JSON object"
                ) from None
            problem = "is not a JSON object" if not isinstance(fields, dict) else check(fields)
            if problem:
                raise UserError(f"{task}: {where} {problem}")
            rows.append(Row(fields, where))
    return rows


def need_fields(**kinds: type | tuple[type, ...]) -> Callable[[dict[str, Any]], str | None]:
    """A row check: each named field present with the given type."""

    def check(row: dict[str, Any]) -> str | None:
        for name, kind in kinds.items():
            if name not in row:
                return f"has no field {name!r}; rows need {', '.join(kinds)}"
            if not isinstance(row[name], kind):
                return f"field {name!r} is {type(row[name]).__name__}, not {_names(kind)}"
        return None

    return check


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def local_source(task: str, data: str | None) -> Path | None:
    """The local file or folder holding the task's data, or None to use the Hub."""
    if data:
        path = Path(data).expanduser()
        if not path.exists():
            raise UserError(f"{task}: data={data} does not exist; pass a jsonl file or a folder")
        if path.is_dir() and (path / task).is_dir():
            return path / task
        return path
    env = os.environ.get(DATA_ENV)
    if env and (Path(env) / task).is_dir():
        return Path(env) / task
    return None


def split_files(
    task: str, source: Path, names: dict[str, str], default_split: str
) -> dict[str, Path]:
    """Split → file. A folder has one file per split (those present); a file is one split.

    A single file is the split its name says (`train.jsonl` → train), else `default_split`.
    """
    if source.is_file():
        split = next((s for s, n in names.items() if n == source.name), default_split)
        return {split: source}
    found = {split: source / name for split, name in names.items() if (source / name).is_file()}
    if not found:
        wanted = ", ".join(sorted(set(names.values())))
        raise UserError(f"{task}: folder {source} has none of {wanted}; pass data=PATH to one")
    return found


def load_hub(
    task: str, name: str, config: str | None, split: str, revision: str | None
) -> tuple[list[Row], str]:
    """Rows of one split from the Hub, and an identifier of what was loaded for the manifest."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - a dependency of dllmbench
        raise UserError(f"{task}: the datasets package is missing ({exc}); pass data=PATH") from exc
    try:
        ds = datasets.load_dataset(name, config, split=split, revision=revision)
    except Exception as exc:  # network, authentication, unknown revision ...
        raise UserError(
            f"{task}: could not load {name} ({config or 'default'}, {split}) from the Hugging "
            f"Face Hub: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            f"pass data=PATH to local files or set {DATA_ENV}"
        ) from None
    rows = [Row(dict(r), f"{name}[{split}][{i}]") for i, r in enumerate(ds)]
    fingerprint = getattr(ds, "_fingerprint", None) or "unknown"
    return rows, str(fingerprint)


def hub_key(name: str, config: str | None, split: str, revision: str | None) -> str:
    return f"hf://{name}/{config or 'default'}/{split}@{revision or 'default'}"


def check_rows(task: str, rows: Sequence[Row], check: Callable[[dict[str, Any]], str | None]):
    """Apply a row check to rows that did not come from a file (the Hub)."""
    for row in rows:
        problem = check(row.fields)
        if problem:
            raise UserError(f"{task}: {row.where} {problem}")


class TaskData:
    """A task's rows by split, read once, from local files or the Hub.

    `files` maps each split to its file name in a local folder; splits that share one file
    (MBPP) all read it and `select(split, row)` keeps each split's rows. `hub_sizes` are the
    split sizes on the Hub, reported by `splits()` without downloading anything.
    """

    def __init__(
        self,
        task: str,
        *,
        data: str | None,
        revision: str | None,
        files: dict[str, str],
        hub: tuple[str, str | None],
        hub_sizes: dict[str, int],
        check: Callable[[dict[str, Any]], str | None],
        select: Callable[[str, dict[str, Any]], bool] | None = None,
        default_split: str = "test",
    ):
        self.task, self.revision, self.hub = task, revision, hub
        self.hub_sizes, self.check, self.select = hub_sizes, check, select
        source = local_source(task, data)
        self.local: dict[str, Path] | None = None
        if source is not None:
            if source.is_file() and len(set(files.values())) == 1:
                self.local = dict.fromkeys(files, source)
            else:
                self.local = split_files(task, source, files, default_split)
        self._rows: dict[str, list[Row]] = {}
        self._files: dict[Path, list[Row]] = {}
        self._hub_ids: dict[str, str] = {}

    def splits(self) -> dict[str, int]:
        if self.local is None:
            sizes = self.hub_sizes.items()
            return {s: len(self._rows[s]) if s in self._rows else n for s, n in sizes}
        return {split: len(self.rows(split)) for split in self.local}

    def rows(self, split: str) -> list[Row]:
        known = self.local if self.local is not None else self.hub_sizes
        if split not in known:
            raise UserError(f"{self.task} has no split {split!r}; splits: {', '.join(known)}")
        if split not in self._rows:
            if self.local is not None:
                path = self.local[split]
                if path not in self._files:
                    self._files[path] = read_jsonl(path, self.task, self.check)
                rows = self._files[path]
            else:
                name, config = self.hub
                rows, ident = load_hub(self.task, name, config, split, self.revision)
                check_rows(self.task, rows, self.check)
                self._hub_ids[hub_key(name, config, split, self.revision)] = ident
            if self.select is not None:
                rows = [r for r in rows if self.select(split, r.fields)]
            self._rows[split] = rows
        return self._rows[split]

    def data_files(self) -> dict[str, str]:
        """Local files → sha256; Hub splits loaded so far → their dataset fingerprint."""
        if self.local is not None:
            return {str(p): sha256(p) for p in sorted(set(self.local.values()))}
        if self._hub_ids:
            return dict(sorted(self._hub_ids.items()))
        name, config = self.hub
        return {hub_key(name, config, "*", self.revision): "not loaded yet"}
