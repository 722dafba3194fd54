"""The folder a command writes (`--out`): checked before any work. A folder that belongs to
something else — a run directory, a collection, a scorer's training, a checkpoint, a report —
or a non-empty folder of other files is refused, as is an empty `--out`; the command's own
kind of folder is resumed or rewritten."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from dllmbench.core.errors import UserError

# what a folder is, by the files a command leaves in it; the first that matches names it
KINDS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("run directory", lambda p: (p / "manifest.json").is_file()),
    ("collection", lambda p: (p / "collect.json").is_file() or (p / "trajectories.jsonl").exists()),
    ("scorer training folder", lambda p: (p / "train.json").is_file() or (p / "latest").is_dir()),
    ("demo folder", lambda p: (p / "build").is_dir()),
    ("checkpoint", lambda p: (p / "config.json").is_file()),
    ("report folder", lambda p: (p / "report.json").is_file()),
    ("scorer controls folder", lambda p: (p / "controls.json").is_file()),
)


def kind_of(path: Path) -> str | None:
    """What the folder `path` is (a run directory, a collection, …), or None."""
    return next((name for name, test in KINDS if test(path)), None) if path.is_dir() else None


def claim(out: str | Path | None, own: str, flag: str = "--out") -> Path:
    """`out` as the folder of a command that writes a `own` (one of `KINDS`' names), checked
    before any work: not empty text, not a file, writable (or creatable), and empty, new or a
    `own` already."""
    if out is None or not str(out).strip():
        raise UserError(f"{flag} is empty; give the folder to write, e.g. {flag} out")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is not a folder; choose another {flag}")
    if path.is_dir():
        kind = kind_of(path)
        if kind is not None and kind != own:
            raise UserError(f"{path} is a {kind}, not a {own}; choose another {flag}")
        if kind is None and any(path.iterdir()):
            raise UserError(
                f"{path} holds other files and no {own}; choose another {flag} "
                "(a new or empty folder)"
            )
        where = path
    else:
        where = next(p for p in path.absolute().parents if p.exists())
        if not where.is_dir():
            raise UserError(f"{flag} {path} cannot be made: {where} is not a folder")
    try:  # a real write: permissions, a read-only mount, a pseudo filesystem such as /proc
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"cannot write to {where} ({reason}); choose another {flag}") from None
    return path
