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


class PluginViolation(Exception):
    """A plugin broke its contract while running (a selector's index out of range, a strategy
    returning too few candidates): a bug in that plugin, not in the user's request. The command
    line prints the message as one line and exits with `EXIT_CODE`."""

    EXIT_CODE = 3

    def __init__(self, plugin: str, distribution: str | None, what: str):
        self.plugin, self.distribution, self.what = plugin, distribution, what
        source = f" (from {distribution})" if distribution else ""
        super().__init__(f"plugin {plugin!r}{source} broke its contract: {what}")
