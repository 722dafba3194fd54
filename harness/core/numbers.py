"""Numbers as a person types them: ASCII digits only. Python's `int` and `float` also read
`2_08` and `٢٠٨` (Arabic-Indic digits) as 208; a command line and a plugin option do not."""

from __future__ import annotations

import re

# the largest integer an option takes: a signed 64-bit integer (a seed, a count)
INT_MAX = 2**63 - 1

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)


def ascii_int(text: str) -> int | None:
    """The integer `text` writes in ASCII digits (an optional sign, spaces around), or None."""
    text = text.strip()
    return int(text) if _INT.fullmatch(text) else None


def ascii_float(text: str) -> float | None:
    """The number `text` writes in ASCII (`2.5`, `1e-3`, `inf`), or None."""
    text = text.strip()
    return float(text) if _FLOAT.fullmatch(text) else None
