"""sha256 of files. A big file's digest is cached by (real path, size, mtime_ns) in the user's
cache, so a 15 GB checkpoint is hashed once, not at every run or resume."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

BIG = 64 * 2**20  # files at least this large are cached


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dllmbench" / "sha256.json"


def _digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_cache() -> dict[str, dict]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(data: dict[str, dict]) -> None:
    """Best effort: a cache that cannot be written only costs time."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".sha256-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256 (hex); big files through the cache."""
    real = os.path.realpath(path)
    st = os.stat(real)
    if st.st_size < BIG:
        return _digest(real)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = _read_cache()
    hit = cache.get(real)
    if isinstance(hit, dict) and {k: hit.get(k) for k in stamp} == stamp and "sha256" in hit:
        return hit["sha256"]
    digest = _digest(real)
    cache[real] = {**stamp, "sha256": digest}
    _write_cache(cache)
    return digest
