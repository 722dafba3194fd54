"""Errors the command line turns into one clear line."""

from __future__ import annotations


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what would work."""


class PluginError(UserError):
    """A plugin is missing, clashes with another, or is configured wrongly."""


class CostMismatch(RuntimeError):
    """A method spent a different number of passes than it declared."""

    def __init__(self, method: str, problem: str, planned: dict[str, int], spent: dict[str, int]):
        self.method, self.problem, self.planned, self.spent = method, problem, planned, spent
        super().__init__(
            f"method {method!r} spent {dict(sorted(spent.items()))} passes on problem "
            f"{problem!r} but declared {dict(sorted(planned.items()))}"
        )
