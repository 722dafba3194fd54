"""Where task data come from: your files, the copy shipped with dllmbench, or the Hub.

For each task the order is:

1. the task's `data` option: a `.jsonl` or `.jsonl.gz` file, a folder holding the task's files,
   or a folder holding `<task>/`;
2. `$DLLMBENCH_DATA/<task>/` when that variable is set (a set variable must name a folder; one
   without `<task>/` falls through);
3. the packaged copy in `dllmbench/tasks/packaged/<task>/` (gzip-compressed jsonl);
4. the Hugging Face Hub, only for splits that are not shipped, or for every split when the
   task's `revision` option asks for a Hub revision.

Rows are checked as they are read: a malformed row is a UserError naming the file and line.
`data_files()` identifies the data by content: the sha256 of the uncompressed bytes, under a key
that names the file (the user's path, or `dllmbench:<task>/<file>.jsonl` for the packaged copy).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.hub import hub_offline, hub_unreachable

DATA_ENV = "DLLMBENCH_DATA"
PACKAGED = Path(__file__).resolve().parent / "packaged"
PACKAGED_PREFIX = "dllmbench:"

_HASHES: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class Row:
    """One record and where it came from (file and 1-based line, or the Hub split and index)."""

    fields: dict[str, Any]
    where: str


def _stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def read_bytes(path: Path, task: str, label: str) -> bytes:
    """A data file's uncompressed bytes (gzip when named `.gz` or starting with its magic)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{task}: cannot read {label} ({exc.strerror or exc})") from None
    if path.suffix == ".gz" or raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(
                f"{task}: {label} is not a valid gzip file ({exc}); pass a .jsonl file or a "
                f"gzip-compressed .jsonl.gz"
            ) from None
    _HASHES[_stamp(path)] = hashlib.sha256(raw).hexdigest()
    return raw


def content_sha256(path: Path, task: str = "data") -> str:
    """sha256 of a data file's uncompressed bytes: a .jsonl and its .jsonl.gz hash the same.

    Each file is hashed once per process (until it changes on disk).
    """
    stamp = _stamp(path)
    if stamp not in _HASHES:
        read_bytes(path, task, str(path))
    return _HASHES[stamp]


def read_jsonl(
    path: Path,
    task: str,
    check: Callable[[dict[str, Any]], str | None],
    label: str | None = None,
) -> list[Row]:
    """Rows of a jsonl (or jsonl.gz) file; `check(row)` returns what is wrong with a row, or None.

    `label` names the file in messages and in each row's `where` (default: its path).
    """
    label = label or str(path)
    if not path.is_file():
        raise UserError(
            f"{task}: no data file {label}; pass data=PATH to a file or folder that has it"
        )
    try:
        text = read_bytes(path, task, label).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{task}: {label} is not UTF-8 text ({exc.reason} at byte {exc.start}); pass a "
            f".jsonl file of UTF-8 JSON objects, one per line"
        ) from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{label}:{number}"
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{task}: {where} is not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from None
        problem = "is not a JSON object" if not isinstance(fields, dict) else check(fields)
        if problem:
            raise UserError(f"{task}: {where} {problem}")
        rows.append(Row(fields, where))
    if not rows:
        raise UserError(
            f"{task}: {label} has no rows (it is empty); pass data=PATH to a .jsonl or .jsonl.gz "
            f"file with one JSON object per line"
        )
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
    """The user's file or folder holding the task's data (data=, then $DLLMBENCH_DATA), or None."""
    if data:
        path = Path(data).expanduser()
        if not path.exists():
            raise UserError(
                f"{task}: data={data} does not exist; pass a .jsonl or .jsonl.gz file or a folder"
            )
        if path.is_dir() and (path / task).is_dir():
            return path / task
        return path
    env = os.environ.get(DATA_ENV)
    if env:
        folder = Path(env).expanduser()
        if not folder.is_dir():
            raise UserError(
                f"{task}: ${DATA_ENV}={env} is not a folder; point it at a folder holding "
                f"{task}/ or unset it"
            )
        if (folder / task).is_dir():
            return folder / task
    return None


def _plain_name(path: Path) -> str:
    return path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name


def split_files(
    task: str, source: Path, names: dict[str, str], default_split: str
) -> dict[str, Path]:
    """Split → file. A folder has one file per split (those present, `NAME` or `NAME.gz`); a
    file is one split: the one its name says (`train.jsonl[.gz]` → train), else `default_split`.
    """
    if source.is_file():
        plain = _plain_name(source)
        split = next((s for s, n in names.items() if n == plain), default_split)
        return {split: source}
    found = {}
    for split, name in names.items():
        path = next((p for p in (source / name, source / f"{name}.gz") if p.is_file()), None)
        if path is not None:
            found[split] = path
    if not found:
        wanted = ", ".join(sorted(set(names.values())))
        raise UserError(
            f"{task}: folder {source} has none of {wanted} (or .gz); pass data=PATH to one"
        )
    return found


def load_hub(
    task: str, name: str, config: str | None, split: str, revision: str | None, file: str
) -> tuple[list[Row], str]:
    """Rows of one split from the Hub, and an identifier of what was loaded for the manifest.

    Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) only a cached copy can load; otherwise the
    endpoint is probed first so that no route to the Hub fails in seconds, without retries.
    """
    what = f"{name} ({config or 'default'}, {split}{f'@{revision}' if revision else ''})"
    supply = f"pass data=PATH to a local {file} or put it in ${DATA_ENV}/{task}/"
    reason = None if hub_offline("HF_DATASETS_OFFLINE") else hub_unreachable()
    if reason:
        raise UserError(
            f"{task}: cannot reach the Hugging Face Hub ({reason}) for {what}; {supply}"
        )
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - a dependency of dllmbench
        raise UserError(f"{task}: the datasets package is missing ({exc}); {supply}") from None
    try:
        ds = datasets.load_dataset(name, config, split=split, revision=revision)
    except Exception as exc:  # offline without a cache, authentication, unknown revision ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(
            f"{task}: could not load {what} from the Hugging Face Hub: "
            f"{type(exc).__name__}: {first}; {supply}"
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
    """A task's rows by split, read once, from the user's files, the packaged copy or the Hub.

    `files` maps each split to its file name in a folder; splits that share one file (MBPP) all
    read it and `select(split, row)` keeps each split's rows. `sizes` are the splits' known sizes
    (the packaged copy's and the Hub's), reported by `splits()` without reading anything.
    """

    def __init__(
        self,
        task: str,
        *,
        data: str | None,
        revision: str | None,
        files: dict[str, str],
        hub: tuple[str, str | None],
        sizes: dict[str, int],
        check: Callable[[dict[str, Any]], str | None],
        select: Callable[[str, dict[str, Any]], bool] | None = None,
        default_split: str = "test",
    ):
        self.task, self.revision, self.hub, self.files = task, revision, hub, files
        self.sizes, self.check, self.select = sizes, check, select
        self.packaged = False
        source = local_source(task, data)
        if source is not None:  # the user's files: only the splits they hold
            if source.is_file() and len(set(files.values())) == 1:
                self.local = dict.fromkeys(files, source)
            else:
                self.local = split_files(task, source, files, default_split)
            self.order = list(self.local)
        else:
            self.local = {}
            if revision is None and (PACKAGED / task).is_dir():
                self.local = split_files(task, PACKAGED / task, files, default_split)
                self.packaged = True
            self.order = list(sizes)
        self._rows: dict[str, list[Row]] = {}
        self._files: dict[Path, list[Row]] = {}
        self._hub_ids: dict[str, str] = {}

    def key(self, path: Path) -> str:
        """The manifest's name of a file: location-independent for the packaged copy."""
        if self.packaged:
            return f"{PACKAGED_PREFIX}{self.task}/{_plain_name(path)}"
        return str(path)

    def splits(self) -> dict[str, int]:
        sizes = {}
        for split in self.order:
            if split in self._rows:
                sizes[split] = len(self._rows[split])
            elif split in self.local and not self.packaged:
                sizes[split] = len(self.rows(split))
            else:
                sizes[split] = self.sizes[split]
        return sizes

    def rows(self, split: str) -> list[Row]:
        if split not in self.order:
            raise UserError(f"{self.task} has no split {split!r}; splits: {', '.join(self.order)}")
        if split not in self._rows:
            if split in self.local:
                path = self.local[split]
                if path not in self._files:
                    self._files[path] = read_jsonl(path, self.task, self.check, self.key(path))
                rows = self._files[path]
            else:
                name, config = self.hub
                file = self.files[split]
                rows, ident = load_hub(self.task, name, config, split, self.revision, file)
                check_rows(self.task, rows, self.check)
                self._hub_ids[hub_key(name, config, split, self.revision)] = ident
            if self.select is not None:
                rows = [r for r in rows if self.select(split, r.fields)]
            self._rows[split] = rows
        return self._rows[split]

    def data_files(self) -> dict[str, str]:
        """Each file behind a split → sha256 of its uncompressed bytes (hashed once); Hub
        splits loaded so far → their dataset fingerprint."""
        out = {self.key(p): content_sha256(p, self.task) for p in set(self.local.values())}
        out.update(self._hub_ids)
        if not out:
            name, config = self.hub
            out[hub_key(name, config, "*", self.revision)] = "not loaded yet"
        return dict(sorted(out.items()))
