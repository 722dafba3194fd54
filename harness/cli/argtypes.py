"""argparse `type=` validators: a bad value is argparse's one-line error, exit status 2."""

from __future__ import annotations

import argparse

from dllmbench.core.flops import Flops
from dllmbench.core.numbers import INT_MAX, ascii_float, ascii_int


def _int(text: str, most: int = INT_MAX) -> int:
    """ASCII digits with an optional sign (not `2_08`, not `٢٠٨`), at most `most`."""
    value = ascii_int(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}")
    if value > most:
        raise argparse.ArgumentTypeError(f"must be at most {most}, got {text.strip()}")
    return value


def _float(text: str) -> float:
    value = ascii_float(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
    return value


def positive_int(text: str, most: int = INT_MAX) -> int:
    """An integer >= 1 (and at most `most`)."""
    value = _int(text, most)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def natural_int(text: str) -> int:
    """An integer >= 0 (seeds, warm-up steps)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def name_list(text: str) -> list[str]:
    """Comma-separated names without empty items: `vanilla,majority`."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item; write names separated by single commas, "
            "e.g. vanilla,majority"
        )
    return items


def scorer_entry(text: str) -> str:
    """`NAME` or `NAME=PLUGIN[:k=v,...]` with a name and, after '=', a plugin."""
    name, eq, plugin = text.partition("=")
    if not name.strip() or (eq and not plugin.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r} wants NAME or NAME=PLUGIN[:k=v,...], e.g. prm or orm=orm:checkpoint=DIR"
        )
    return text


# passes per problem: ten million is a pool of 78,000 candidates at T = 128, far beyond any
# search the planner's families make sense at (the paper's budgets are 1040 and 4160)
MAX_BUDGET = 10_000_000


def flop_budget(text: str) -> Flops:
    """FLOPs per problem: a positive number followed by `flops`, e.g. 2.1e15flops."""
    value = ascii_float(text.strip()[: -len("flops")])
    if value is None or not 1 <= value < 1e30:
        raise argparse.ArgumentTypeError(
            f"a FLOP budget is a number >= 1 then 'flops', e.g. 2.1e15flops; got {text.strip()!r}"
        )
    return Flops(round(value))


def budgets(text: str) -> int | list[int]:
    """One budget (`1040`, an int) or several (`1040,4160`, a list, ascending): positive
    integers of passes up to `MAX_BUDGET`, or FLOPs (`2.1e15flops`, `Flops`), one unit for
    all, each given once."""
    parts = text.split(",")
    in_flops = [p.strip().lower().endswith("flops") for p in parts]
    if any(in_flops) and not all(in_flops):
        raise argparse.ArgumentTypeError(
            f"mixes passes and FLOPs in {text!r}; give every budget in one unit"
        )
    try:
        if all(in_flops):
            items: list[int] = [flop_budget(item) for item in parts]
        else:
            items = [positive_int(item.strip(), MAX_BUDGET) for item in parts]
    except argparse.ArgumentTypeError as exc:
        if len(parts) == 1:
            raise
        raise argparse.ArgumentTypeError(f"{exc} in {text!r}; e.g. 1040,4160") from None
    twice = sorted({b for b in items if items.count(b) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"lists {twice[0]} twice in {text!r}; give each once")
    return items[0] if len(items) == 1 else sorted(items)
