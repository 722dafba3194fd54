"""What the core records of the plugins it runs: their configuration as plain data (what
manifests record and the engine compares to share runs), and where they came from (to name a
plugin that breaks its contract while running)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dllmbench.api.interfaces import Configured
from dllmbench.core.errors import PluginViolation, blame


def config_data(plugin: Any) -> dict[str, Any]:
    """The configuration of a built plugin object, as plain data (its `config` dataclass)."""
    config = plugin.config if isinstance(plugin, Configured) else None
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config)


@dataclass(frozen=True)
class Origins:
    """Which plugin plays each part of a run and which distribution registered it, so that a
    plugin breaking its contract mid-run is named in the error (`PluginViolation`).

    Strategies and selectors are named by their methods' specs; the backbone, the task and the
    scorers (by run name) are named here. `distributions` maps (kind, plugin name) to the
    distribution that registered it; a plugin missing there is named without one.
    """

    backbone: str = "backbone"
    task: str = "task"
    scorers: Mapping[str, str] = field(default_factory=dict)  # run name → plugin name
    distributions: Mapping[tuple[str, str], str | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        reg: Any,
        backbone: str,
        task: str,
        scorers: Mapping[str, str],
        parts: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
    ) -> Origins:
        """Who plays the backbone, the task, the scorers (run name → plugin) and `parts`
        ((kind, name): strategies, selectors) of a run, with the distributions of the
        registry `reg` that registered them."""
        every = {("backbone", backbone), ("task", task), *parts}
        every |= {("scorer", plugin) for plugin in scorers.values()}
        return cls(
            backbone=backbone,
            task=task,
            scorers=dict(scorers),
            distributions={part: reg.info(*part).distribution for part in every},
        )

    def distribution(self, kind: str, name: str) -> str | None:
        return self.distributions.get((kind, name))

    def violation(self, kind: str, name: str, what: str) -> PluginViolation:
        """The error for plugin `name` of `kind` having done `what`."""
        return PluginViolation(name, self.distribution(kind, name), what)

    def blame(self, kind: str, name: str) -> blame:
        """Around a call into plugin `name` of `kind`: what it raises (not a dllmbench error)
        is `PluginCrashed`, naming it and its distribution."""
        return blame(kind, name, self.distribution(kind, name))

    def scorer(self, run_name: str) -> str:
        return self.scorers.get(run_name, run_name)
