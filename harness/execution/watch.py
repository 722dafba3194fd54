"""Forwards nobody is charged for: a model run by plugin code instead of through `ops`.

The engine computes every forward a run is charged for, between the moments strategies and
selectors run. While an engine runs, a process-wide forward hook counts every torch module
call made while plugin code runs (a strategy's `search` between two requests, a selector's
`select`) and every call made on another thread (a rollout started in the background): a
strategy that found the backbone object (through `gc`, say) and ran it itself, or a copy of
its weights, is caught at the next check and the run refuses, naming it.

The hook costs one Python call per module call; it is removed when the engine's run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.nn.modules.module import register_module_forward_pre_hook

from dllmbench.core.errors import PluginViolation


class ComputeWatch:
    """Counts module forwards made by plugin code, or away from the engine's thread."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._plugin = False
        self.calls = 0  # module calls by plugin code, since the last `take`
        self.elsewhere = 0  # module calls on other threads

    def _hook(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:
            self.elsewhere += 1
        elif self._plugin:
            self.calls += 1

    @contextmanager
    def watching(self) -> Iterator[ComputeWatch]:
        """Count while the engine runs (on this thread)."""
        self._thread = threading.get_ident()
        handle = register_module_forward_pre_hook(self._hook)
        try:
            yield self
        finally:
            handle.remove()

    @contextmanager
    def plugin(self) -> Iterator[None]:
        """Plugin code runs: any module forward now is one it made itself."""
        self._plugin = True
        try:
            yield
        finally:
            self._plugin = False

    def check(self, kind: str, name: str, distribution: str | None) -> None:
        """Refuse the run if the plugin just run (`kind` `name`) ran a model itself."""
        calls, self.calls = self.calls, 0
        if calls:
            what = (
                f"its {kind} ran a model itself ({calls} module forwards outside ops, "
                "charged to no one); every forward must go through ops"
            )
            raise PluginViolation(name, distribution, what)

    def check_threads(self) -> None:
        """Refuse the run if a model ran on another thread while the engine ran."""
        if self.elsewhere:
            raise PluginViolation(
                "unknown",
                None,
                f"a model ran on another thread during the run ({self.elsewhere} module "
                "forwards outside ops, charged to no one); every forward must go through ops",
            )
