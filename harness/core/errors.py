"""Errors the command line turns into one clear line."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what would work."""


class Notice(UserWarning):
    """Something the user should know that stops nothing (a prompt the model cannot read in
    full): a Python warning, which the command line prints as one line,
    `dllmbench: warning: …`."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler pre-empting the job): unwinds as Ctrl-C does, so every finished
    record, the compute entry and the locks are saved or released on the way out."""


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


class OverCap(CostMismatch):
    """A method with a cap spent more than its cap on one problem: refused as it happens."""

    def __init__(
        self, method: str, plugin: str, problem: str, cap: dict[str, int], spent: dict[str, int]
    ):
        self.plugin = plugin
        RuntimeError.__init__(
            self,
            f"method {method!r} (strategy {plugin!r}) spent {dict(sorted(spent.items()))} "
            f"passes on problem {problem!r}, over its cap {dict(sorted(cap.items()))}",
        )
        self.method, self.problem, self.planned, self.spent = method, problem, cap, spent


class PluginViolation(Exception):
    """A plugin broke its contract while running (a selector's index out of range, a strategy
    returning too few candidates): a bug in that plugin, not in the user's request. The command
    line prints the message as one line and exits with `EXIT_CODE`."""

    EXIT_CODE = 3

    def __init__(self, plugin: str, distribution: str | None, what: str):
        self.plugin, self.distribution, self.what = plugin, distribution, what
        source = f" (from {distribution})" if distribution else ""
        super().__init__(f"plugin {plugin!r}{source} broke its contract: {what}")


class blame:
    """Around a call into a plugin's own code: an exception it raises becomes `PluginCrashed`,
    naming the plugin (exit status 3), unless it is one of the project's own errors (a plugin
    may raise `UserError` to refuse what it was asked) or a coroutine's `StopIteration`."""

    PASSES = (StopIteration, UserError, PluginViolation, CostMismatch)

    def __init__(self, kind: str, name: str, distribution: str | None):
        self.plugin, self.distribution = f"{kind} {name!r}", distribution

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, self.PASSES):
            raise PluginCrashed(self.plugin, self.distribution, exc) from exc


class Blamed:
    """A built plugin whose every call goes through `blame`: an exception its own code
    raises, in any method, is `PluginCrashed` naming it (one line, exit status 3; `--debug`
    shows the traceback), for code that calls a plugin in many places (training a scorer).
    Attributes that are not methods are read as they are."""

    def __init__(self, plugin: Any, kind: str, name: str, distribution: str | None):
        self._plugin, self._blame = plugin, (kind, name, distribution)

    def __getattr__(self, attribute: str) -> Any:
        with blame(*self._blame):  # a property is the plugin's code too
            value = getattr(self._plugin, attribute)
        if not callable(value):
            return value

        def called(*args: Any, **kwargs: Any) -> Any:
            with blame(*self._blame):
                return value(*args, **kwargs)

        return called


class PluginIncomplete(PluginViolation):
    """A built plugin lacks a member of its kind's Protocol (`dllmbench.interfaces`): a broken
    contract of that plugin, one line naming what it lacks, `EXIT_CODE`."""

    def __init__(self, plugin: str, distribution: str | None, protocol: str, missing: list[str]):
        self.plugin, self.distribution = plugin, distribution
        self.what = f"does not implement dllmbench.interfaces.{protocol}: it lacks " + ", ".join(
            missing
        )
        source = f" from {distribution}" if distribution else ""
        Exception.__init__(self, f"{plugin}{source} {self.what}")


class PluginCrashed(PluginViolation):
    """A plugin's own code raised an exception that is not a `UserError` (a model-loading bug,
    a strategy's `KeyError`): a bug in that plugin, named with its distribution. The command
    line prints one line and exits with `EXIT_CODE`; `--debug` shows the traceback."""

    def __init__(self, plugin: str, distribution: str | None, exc: BaseException):
        self.plugin, self.distribution, self.exc = plugin, distribution, exc
        source = f" (from {distribution})" if distribution else ""
        text = " ".join(str(exc).split())
        self.what = f"raised {type(exc).__name__}" + (f": {text}" if text else "")
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:  # the line that raised it: the plugin's, or a library it called
            self.what += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
        Exception.__init__(self, f"{plugin}{source} {self.what}")
