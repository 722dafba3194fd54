"""A JSON object read from a file, or one clear line saying what is wrong with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError


def read_object(file: Path, fix: str) -> dict[str, Any]:
    """The object in `file`; a file that is not JSON, or not an object, is a UserError naming
    it and ending with `fix` (what would work)."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(f"{file} is not valid JSON ({reason}); {fix}") from None
    if not isinstance(value, dict):
        raise UserError(f"{file} is not a JSON object; {fix}")
    return value
