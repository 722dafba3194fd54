"""The typed façade the core uses to find and build plugins (never `pm.hook.*`)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import types
import typing
from collections.abc import Collection
from typing import Any, Literal, Union

from dllmbench.api.interfaces import (
    KIND_PROTOCOLS,
    Backbone,
    Scorer,
    SearchStrategy,
    Selector,
    Task,
    config_class,
    missing_members,
)
from dllmbench.core.errors import PluginError, PluginIncomplete, PluginViolation, blame
from dllmbench.core.types import Problem
from dllmbench.loading.manager import (
    KINDS,
    Broken,
    Collected,
    MethodFamily,
    PluginInfo,
    PluginSelection,
    collect,
    load_plugin_manager,
)
from dllmbench.loading.provenance import config_data

# Run objects a factory may ask for by parameter name; never configuration.
SHARED = ("backbone",)


def options(factory: Any) -> list[str]:
    """Configuration field names a factory accepts."""
    config_cls = config_class(factory)
    if config_cls is not None:
        return [f.name for f in dataclasses.fields(config_cls)]
    params = inspect.signature(factory).parameters.values()
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.name not in SHARED]


@functools.cache
def _hints(config_cls: type) -> dict[str, Any]:
    """The resolved field types of a `Config` dataclass, read once per class (callers only
    read them)."""
    return typing.get_type_hints(config_cls)


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
    """A configuration's TypeError or ValueError as one line naming the plugin and its options."""
    opts = ",".join(f"{k}={v}" for k, v in config.items())
    where = f"{kind} {name!r} with {opts}" if opts else f"{kind} {name!r}"
    return PluginError(f"{where}: {' '.join(str(exc).split()) or type(exc).__name__}")


class Registry:
    """Every registered plugin, by kind and name; the method families; the broken plugins."""

    def __init__(
        self,
        table: dict[str, dict[str, PluginInfo]],
        families: dict[str, MethodFamily] | None = None,
        broken: list[Broken] | tuple[Broken, ...] = (),
        disabled: frozenset[str] = frozenset(),
    ):
        self._table = table
        self._families = dict(families or {})
        self._broken = list(broken)
        self._disabled = disabled

    @classmethod
    def from_collected(cls, collected: Collected) -> Registry:
        return cls(collected.plugins, collected.families, collected.broken, collected.disabled)

    @classmethod
    def load(cls, selection: PluginSelection | None = None) -> Registry:
        """Load the built-ins and what `selection` names, and collect what they register."""
        return cls.from_collected(collect(load_plugin_manager(selection or PluginSelection())))

    def names(self, kind: str) -> list[str]:
        return sorted(self._table.get(kind, {}))

    def all(self) -> list[PluginInfo]:
        return [info for kind in KINDS for info in self._table.get(kind, {}).values()]

    def broken(self) -> list[Broken]:
        """Plugins left out, with the reason: failed imports, raising hooks, clashing names."""
        return list(self._broken)

    def families(self) -> list[MethodFamily]:
        """Every registered method family, in registration order (built-ins first)."""
        return list(self._families.values())

    def family(self, name: str) -> MethodFamily | None:
        self._refuse_broken("method family", name)
        return self._families.get(name)

    def _refuse_broken(self, kind: str, name: str) -> None:
        if name in self._disabled:
            raise PluginError(
                f"{kind} {name!r} is disabled by DLLMBENCH_DISABLE; take it out of that "
                "variable to use it"
            )
        for b in self._broken:
            if b.kind == kind and b.name == name:
                raise PluginError(b.line())

    def info(self, kind: str, name: str) -> PluginInfo:
        self._refuse_broken(kind, name)
        table = self._table.get(kind, {})
        if name not in table:
            known = ", ".join(sorted(table)) or "none installed"
            modules = [b for b in self._broken if b.kind is None]
            also = "; broken: " + "; ".join(b.line() for b in modules) if modules else ""
            raise PluginError(f"unknown {kind} {name!r}; known: {known}{also}")
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
        config_cls = config_class(factory)
        if config_cls is None:
            return dict(config)
        hints = _hints(config_cls)
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
        return self._config_object(kind, name, config)

    def _config_object(self, kind: str, name: str, config: dict[str, Any]) -> Any:
        """The plugin's `Config` built from checked options (None without a Config class):
        a TypeError or ValueError here is a bad option, the user's to fix."""
        config_cls = config_class(self.info(kind, name).factory)
        if config_cls is None:
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

        Who is at fault: a configuration its `Config` refuses, or that the factory's
        signature cannot take, is a bad option (`PluginError`, exit status 2); an exception the
        factory raises is that plugin's bug (`PluginCrashed`, exit status 3), unless it is a
        `UserError` the plugin raised on purpose.
        """
        info = self.info(kind, name)
        config = self.coerce(kind, name, config)
        self._config_object(kind, name, config)
        signature = inspect.signature(info.factory)
        extra = {k: v for k, v in (shared or {}).items() if k in signature.parameters}
        try:
            signature.bind(**extra, **config)
        except TypeError as exc:
            raise _failed(kind, name, config, exc) from exc
        with blame(kind, name, info.distribution):
            built = info.factory(**extra, **config)
        conform(info, built)
        declarations(info, built)
        return built

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

    def problems(self, name: str, task: Task, split: str) -> list[Problem]:
        """`task.problems(split)` of the task plugin `name`, held to its contract: an exception
        it raises (`PluginCrashed`) and an id that repeats (`PluginViolation`) are the plugin's
        fault, one line each and exit status 3."""
        distribution = self.info("task", name).distribution
        with blame("task", name, distribution):
            problems = list(task.problems(split))
        seen: set[str] = set()
        for problem in problems:
            if problem.id in seen:
                what = f"its {split!r} split repeats the problem id {problem.id!r} (ids are unique)"
                raise PluginViolation(name, distribution, what)
            seen.add(problem.id)
        return problems


def conform(info: PluginInfo, built: Any) -> None:
    """A built plugin must implement its kind's Protocol: what it lacks is its broken
    contract (`PluginIncomplete`, exit status 3), one line naming the members."""
    protocol = KIND_PROTOCOLS[info.kind]
    missing = missing_members(built, protocol)
    if missing:
        plugin = f"{info.kind} {info.name!r}"
        raise PluginIncomplete(plugin, info.distribution, protocol.__name__, missing)


def _names(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value)


def declarations(info: PluginInfo, built: Any) -> None:
    """What a built plugin declares once, of the types the engine reads: a strategy's
    `scorers`, `pool_size()`, `pool_scores()` and an `async def search`, a selector's
    `needs`, and any plugin's `config` as JSON data (the manifest records it). A wrong one is
    its broken contract, one line, instead of a TypeError deep in the engine."""
    found: list[str] = []
    if info.kind == "strategy":
        with blame(info.kind, info.name, info.distribution):
            size, scores = built.pool_size(), built.pool_scores()
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            found.append(f"pool_size() returned {size!r}, not a whole number >= 1")
        if not isinstance(scores, (set, frozenset)) or not all(isinstance(s, str) for s in scores):
            found.append(f"pool_scores() returned {scores!r}, not a frozenset of scorer names")
        if not _names(built.scorers):
            found.append(f"scorers is {built.scorers!r}, not a tuple of scorer names")
        if not inspect.iscoroutinefunction(built.search):
            found.append("search is not a coroutine function: write `async def search(...)`")
    if info.kind == "selector" and not _names(built.needs):
        found.append(f"needs is {built.needs!r}, not a tuple of scorer names")
    try:
        json.dumps(config_data(built), allow_nan=False)
    except (TypeError, ValueError) as exc:
        found.append(f"its config is not JSON data ({exc}); the manifest records it")
    if found:
        raise PluginViolation(info.name, info.distribution, "; ".join(found))


class _Current:
    """The process-wide registry: loaded once, with the selection the entry point set."""

    selection = PluginSelection()
    loaded: Registry | None = None


def use_plugins(selection: PluginSelection) -> None:
    """Make `registry()` load these plugins (the command line passes what the environment
    says). The same selection again keeps the registry already loaded."""
    if selection != _Current.selection:
        _Current.selection, _Current.loaded = selection, None


def selection() -> PluginSelection:
    """What the process-wide registry loads (or will load)."""
    return _Current.selection


def registry() -> Registry:
    """The process-wide registry: the built-ins, the entry points and the modules of the
    selection `use_plugins` set (none set: built-ins and every installed entry point)."""
    if _Current.loaded is None:
        _Current.loaded = Registry.load(_Current.selection)
    return _Current.loaded
