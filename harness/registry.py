"""The typed façade the core uses to find and build plugins (never `pm.hook.*`)."""

from __future__ import annotations

import dataclasses
import inspect
from functools import lru_cache
from typing import Any

from dllmbench.errors import PluginError
from dllmbench.interfaces import Backbone, Scorer, SearchStrategy, Selector, Task
from dllmbench.manager import KINDS, PluginInfo, collect, load_plugin_manager

# Run objects a factory may ask for by parameter name; never configuration.
SHARED = ("backbone",)


def describe(obj: Any) -> dict[str, Any]:
    """The configuration of a built plugin object, as plain data (its `config` dataclass)."""
    config = getattr(obj, "config", None)
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config)


def options(factory: Any) -> list[str]:
    """Configuration field names a factory accepts."""
    config_cls = getattr(factory, "Config", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        return [f.name for f in dataclasses.fields(config_cls)]
    params = inspect.signature(factory).parameters.values()
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.name not in SHARED]


class Registry:
    """Every registered plugin, by kind and name."""

    def __init__(self, table: dict[str, dict[str, PluginInfo]]):
        self._table = table

    def names(self, kind: str) -> list[str]:
        return sorted(self._table[kind])

    def all(self) -> list[PluginInfo]:
        return [info for kind in KINDS for info in self._table[kind].values()]

    def info(self, kind: str, name: str) -> PluginInfo:
        table = self._table[kind]
        if name not in table:
            known = ", ".join(sorted(table)) or "none installed"
            raise PluginError(f"unknown {kind} {name!r}; known: {known}")
        return table[name]

    def build(
        self, kind: str, name: str, *, shared: dict[str, Any] | None = None, **config: Any
    ) -> Any:
        """Build a plugin from its configuration.

        `shared` holds run objects (the backbone) passed to factories that ask for them by
        parameter name; they are not configuration and never reach the manifest.
        """
        factory = self.info(kind, name).factory
        allowed = options(factory)
        unknown = sorted(set(config) - set(allowed))
        if unknown:
            raise PluginError(
                f"{kind} {name!r} has no option {', '.join(unknown)}; options: "
                f"{', '.join(allowed) or 'none'}"
            )
        params = inspect.signature(factory).parameters
        extra = {k: v for k, v in (shared or {}).items() if k in params}
        try:
            return factory(**extra, **config)
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{kind} {name!r} with {config}: {exc}") from exc

    def backbone(self, name: str, **config: Any) -> Backbone:
        return self.build("backbone", name, **config)

    def scorer(self, name: str, *, shared: dict[str, Any] | None = None, **config: Any) -> Scorer:
        return self.build("scorer", name, shared=shared, **config)

    def strategy(self, name: str, **config: Any) -> SearchStrategy:
        return self.build("strategy", name, **config)

    def selector(self, name: str, **config: Any) -> Selector:
        return self.build("selector", name, **config)

    def task(self, name: str, **config: Any) -> Task:
        return self.build("task", name, **config)


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The process-wide registry (built once; `registry.cache_clear()` reloads it)."""
    pm, sources = load_plugin_manager()
    return Registry(collect(pm, sources))
