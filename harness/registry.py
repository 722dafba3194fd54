"""The typed façade the core uses to find and build plugins (never `pm.hook.*`)."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Collection
from functools import lru_cache
from typing import Any, Literal, Union

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


class _Mismatch(Exception):
    """A value does not have the type an option declares."""


def _type_name(tp: Any) -> str:
    """`int` → "an int", `str | None` → "a string", `Literal["a", "b"]` → "one of 'a', 'b'"."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return "a comma-free list"
    names = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any) -> Any:
    """`value` if it has type `tp` (an int passes for a float, a list for a tuple)."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                try:
                    return _coerce(value, arg)
                except _Mismatch:
                    pass
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in typing.get_args(tp)):
            return value
        raise _Mismatch
    if origin in (tuple, list) and isinstance(value, (tuple, list)):
        return origin(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, (int, float)):  # `revision=1234567`, `path=2024`
        return ("true" if value else "false") if isinstance(value, bool) else str(value)
    if tp is int and isinstance(value, bool):
        raise _Mismatch
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _Mismatch
    return value


def _failed(kind: str, name: str, config: dict[str, Any], exc: BaseException) -> PluginError:
    """A factory's TypeError or ValueError as one line naming the plugin and its options."""
    opts = ",".join(f"{k}={v}" for k, v in config.items())
    where = f"{kind} {name!r} with {opts}" if opts else f"{kind} {name!r}"
    return PluginError(f"{where}: {' '.join(str(exc).split()) or type(exc).__name__}")


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

    def coerce(
        self, kind: str, name: str, config: dict[str, Any], *, unchecked: Collection[str] = ()
    ) -> dict[str, Any]:
        """`config` checked against the plugin's options: every name known and every value
        of its declared type (from the `Config` dataclass); keys in `unchecked` skip the type
        check (a planner's free size). A mistake is a one-line PluginError."""
        factory = self.info(kind, name).factory
        allowed = options(factory)
        unknown = sorted(set(config) - set(allowed))
        if unknown:
            raise PluginError(
                f"{kind} {name!r} has no option {', '.join(map(repr, unknown))}; options: "
                f"{', '.join(allowed) or 'none'}"
            )
        config_cls = getattr(factory, "Config", None)
        if config_cls is None or not dataclasses.is_dataclass(config_cls):
            return dict(config)
        hints = typing.get_type_hints(config_cls)
        out = {}
        for key, value in config.items():
            if key in unchecked or key not in hints:
                out[key] = value
                continue
            try:
                out[key] = _coerce(value, hints[key])
            except _Mismatch:
                raise PluginError(
                    f"{kind} {name!r} option {key} wants {_type_name(hints[key])}, got {value!r}"
                ) from None
        return out

    def check(self, kind: str, name: str, **config: Any) -> Any:
        """Validate a configuration without building the plugin: names, types and the
        `Config` dataclass's own checks. Returns the Config object (None without one)."""
        config = self.coerce(kind, name, config)
        config_cls = getattr(self.info(kind, name).factory, "Config", None)
        if config_cls is None or not dataclasses.is_dataclass(config_cls):
            return None
        try:
            return config_cls(**config)
        except (TypeError, ValueError) as exc:
            raise _failed(kind, name, config, exc) from exc

    def build(
        self, kind: str, name: str, *, shared: dict[str, Any] | None = None, **config: Any
    ) -> Any:
        """Build a plugin from its configuration.

        `shared` holds run objects (the backbone) passed to factories that ask for them by
        parameter name; they are not configuration and never reach the manifest.
        """
        factory = self.info(kind, name).factory
        config = self.coerce(kind, name, config)
        params = inspect.signature(factory).parameters
        extra = {k: v for k, v in (shared or {}).items() if k in params}
        try:
            return factory(**extra, **config)
        except (TypeError, ValueError) as exc:
            raise _failed(kind, name, config, exc) from exc

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
