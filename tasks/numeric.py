"""Numeric answer extraction for GSM-style tasks (gsm8k, arith).

`extract_strict` is the protocol's extractor (PROTOCOL.md, "Tasks"): the first `#### <number>`,
else the first "answer is <number>", else the first `\\boxed{<number>}`, else the last number in
the text. `extract_flexible` is lm-eval's flexible-extract (the last number-like run), kept as a
diagnostic only. A sign before `$` is the number's ("-$3" → "-3", "#### -$5" → "-5").
Both return a canonical decimal string: commas, `$` and `%` gone, no leading
zeros, no trailing fractional zeros ("3.50" → "3.5", "-0" → "0"), so that equal numbers give
equal strings; `number_key` turns it into a Decimal for comparison (3.5 ≠ 3).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# a number as written in a solution: digits with thousands commas, decimals
_UNSIGNED = r"(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
# an amount, captured: a sign before the dollar sign ("-$3", "-\\$3") or after it ("$-3", "-3")
_AMOUNT = r"((?:-\\?\$\s*|(?:\\?\$\s*)?-?)" + _UNSIGNED + ")"

_HASHES = re.compile(r"####\s*" + _AMOUNT)
_ANSWER_IS = re.compile(r"(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*" + _AMOUNT, re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*" + _AMOUNT + r"\s*(?:\\?%)?\s*\}")
_ANY = re.compile(_AMOUNT)
# lm-eval gsm8k "flexible-extract": regex (-?[$0-9.,]{2,})|(-?[0-9]+), last match
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def canonical(raw: str) -> str | None:
    """`raw` as a canonical decimal string, or None when it is not a number."""
    text = re.sub(r"\\?\$\s*", "", raw.strip())  # "$3", "-$3", "\\$ 3"
    text = text.replace(",", "").replace("%", "").rstrip(".")
    match = re.fullmatch(r"(-?)(\d*)(?:\.(\d*))?", text)
    if match is None:
        return None
    sign, whole, frac = match.group(1), match.group(2), match.group(3) or ""
    if not whole and not frac:
        return None
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    return body if body == "0" else sign + body


def number_key(answer: str) -> Decimal | None:
    """The value of a canonical answer (exact: Decimal construction never rounds)."""
    text = canonical(answer)
    if text is None:
        return None
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - canonical() only lets digits through
        return None


def same_number(answer: str | None, gold: str) -> bool:
    """Whether an extracted answer equals the gold answer as a number (3.50 == 3.5 != 3)."""
    key = None if answer is None else number_key(answer)
    return key is not None and key == number_key(gold)


def extract_strict(text: str) -> str | None:
    """The protocol's extractor: first `####`, "answer is", `\\boxed{}`, then the last number."""
    for pattern in (_HASHES, _ANSWER_IS, _BOXED):
        match = pattern.search(text)
        if match is not None:
            value = canonical(match.group(1))
            if value is not None:
                return value
    numbers = _ANY.findall(text)
    for raw in reversed(numbers):
        value = canonical(raw)
        if value is not None:
            return value
    return None


def extract_flexible(text: str) -> str | None:
    """lm-eval's flexible-extract: the last number-like run (a diagnostic, never the protocol).

    lm-eval compares the raw match after removing commas, `$` and a final period; a match that
    is then no number at all (such as "..") counts here as no answer.
    """
    matches = _FLEXIBLE.findall(text)
    if not matches:
        return None
    first, second = matches[-1]
    return canonical(first or second)
