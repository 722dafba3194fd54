"""Plugin manager: built-ins, entry-point plugins, the allow-list and the deny-list.

Built-ins register through the same hooks as third-party packages. Third-party packages
declare `[project.entry-points.dllmbench]`. A `PluginSelection` says what else to load: `allow`
loads only those distributions' entry points (empty: none), `modules` registers modules by
import path, for plugins that are not installed as a distribution (like pytest's -p), and
`disable` leaves out distributions, modules or registered plugin names. Only the entry points
(the command line, the pytest plugin) read them from the environment:
`PluginSelection.from_environment()` (`DLLMBENCH_PLUGINS`, `DLLMBENCH_PLUGIN_MODULES`,
`DLLMBENCH_DISABLE`).

A plugin that fails to import, whose hook raises, or that registers a name another plugin
registers too is not fatal: it is recorded as broken, with the reason, and only a command
that needs it refuses. A name in `allow` or `disable` that matches nothing is a one-line error
(a typo), as is a hook implementation with a misspelt name.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata as md
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pluggy

from dllmbench.api import hookspecs
from dllmbench.core.errors import PluginError

# The one place where the core names built-in plugins.
BUILTIN_MODULES = (
    "dllmbench.plugins.backbones.dream",
    "dllmbench.plugins.backbones.llada",
    "dllmbench.plugins.backbones.tiny",
    "dllmbench.plugins.backbones.block",
    "dllmbench.plugins.backbones.fast_dllm_v2",
    "dllmbench.plugins.backbones.llada2",
    "dllmbench.plugins.backbones.tiny_block",
    "dllmbench.plugins.scorers.reward",
    "dllmbench.plugins.scorers.self_verify",
    "dllmbench.plugins.strategies.independent",
    "dllmbench.plugins.strategies.prm_guided",
    "dllmbench.plugins.strategies.smc",
    "dllmbench.plugins.strategies.hex",
    "dllmbench.plugins.strategies.remdm",
    "dllmbench.plugins.strategies.prism",
    "dllmbench.plugins.strategies.ensemble",
    "dllmbench.plugins.strategies.adaptive",
    "dllmbench.plugins.strategies.threshold",
    "dllmbench.plugins.strategies.temporal",
    "dllmbench.plugins.strategies.prophet",
    "dllmbench.plugins.selectors.basic",
    "dllmbench.plugins.selectors.voting",
    "dllmbench.plugins.selectors.oracle",
    "dllmbench.plugins.methods",
    "dllmbench.tasks.gsm8k",
    "dllmbench.tasks.math500",
    "dllmbench.tasks.mbpp",
    "dllmbench.tasks.humaneval",
    "dllmbench.tasks.arith",
)

KINDS = {
    "backbone": "dllmbench_register_backbones",
    "scorer": "dllmbench_register_scorers",
    "strategy": "dllmbench_register_strategies",
    "selector": "dllmbench_register_selectors",
    "task": "dllmbench_register_tasks",
}
FAMILY_HOOK = "dllmbench_register_methods"


@dataclass(frozen=True)
class Source:
    """Where a plugin module came from."""

    distribution: str
    version: str


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin."""

    name: str
    kind: str
    factory: Any
    distribution: str
    version: str
    module: str

    def as_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "kind": self.kind,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
        }


@dataclass(frozen=True)
class MethodFamily:
    """A method template whose free size (`*`) the planner chooses."""

    name: str
    label: str  # formatted with the strategy's configuration, e.g. "ORM Rerank@{n}"
    spec: str  # "{half}" stands for T // 2, the segment length of the guided families
    distribution: str = "dllmbench"
    module: str = ""
    version: str = ""  # its distribution's version


@dataclass(frozen=True)
class Broken:
    """A plugin left out, and why: a whole module (`kind` None) or one registered name."""

    name: str
    kind: str | None
    distribution: str
    module: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        what = f"{self.kind} {self.name!r}" if self.kind else f"plugin {self.name!r}"
        return f"{what} from {self.distribution} is broken: {self.reason}"


@dataclass
class Loaded:
    """A plugin manager with its modules' sources, and the plugins that failed to load."""

    pm: pluggy.PluginManager
    sources: dict[int, Source]
    broken: list[Broken] = field(default_factory=list)
    disabled: set[str] = field(default_factory=set)  # names DLLMBENCH_DISABLE gives
    known: set[str] = field(default_factory=set)  # distributions and modules it may name


@dataclass
class Collected:
    """Everything the plugins registered."""

    plugins: dict[str, dict[str, PluginInfo]]
    families: dict[str, MethodFamily]
    broken: list[Broken]
    disabled: frozenset[str] = frozenset()  # registered names DLLMBENCH_DISABLE removed


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "unknown"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    return tuple(name.strip() for name in raw.split(",") if name.strip())


@dataclass(frozen=True)
class PluginSelection:
    """Which plugins load besides the built-ins (always loaded)."""

    modules: tuple[str, ...] = ()  # module paths registered as plugins (DLLMBENCH_PLUGIN_MODULES)
    allow: tuple[str, ...] | None = None  # distributions whose entry points load; None: all
    disable: tuple[str, ...] = ()  # distributions, modules or plugin names left out

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> PluginSelection:
        """What `DLLMBENCH_PLUGIN_MODULES`, `DLLMBENCH_PLUGINS` and `DLLMBENCH_DISABLE` say."""
        return cls(
            modules=_names(env.get("DLLMBENCH_PLUGIN_MODULES")) or (),
            allow=_names(env.get("DLLMBENCH_PLUGINS")),
            disable=_names(env.get("DLLMBENCH_DISABLE")) or (),
        )


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


def _unknown(var: str, names: list[str], known: set[str]) -> None:
    """A one-line error for a name in `var` that matches none of `known`."""
    norm = {_norm(k) for k in known}
    typos = [n for n in names if _norm(n) not in norm]
    if typos:
        listed = ", ".join(sorted(known)) or "none installed"
        raise PluginError(
            f"{var} names {', '.join(map(repr, typos))}, which is not installed; known: {listed}"
        )


def _add(loaded: Loaded, name: str, load: Any, source: Source) -> None:
    """Import a plugin module with `load()` and register it; a failure marks it broken."""
    try:
        module = load()
    except Exception as exc:  # a broken plugin is reported, not a traceback
        reason = f"failed to import: {_reason(exc)}"
        loaded.broken.append(Broken(name, None, source.distribution, name, reason))
        return
    if loaded.pm.is_registered(module):
        return
    try:
        loaded.pm.register(module, name=name)
    except pluggy.PluginValidationError as exc:  # a hook with the wrong arguments
        loaded.broken.append(Broken(name, None, source.distribution, name, _reason(exc)))
        return
    loaded.sources[id(module)] = source


def _drop_unknown_hooks(loaded: Loaded) -> None:
    """`pm.check_pending()`, one plugin at a time: a plugin implementing a hook that no spec
    declares (a misspelt name) is unregistered and marked broken."""
    hooks = [*KINDS.values(), FAMILY_HOOK]
    while True:
        try:
            loaded.pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            plugin = exc.plugin
            name = loaded.pm.get_name(plugin) or repr(plugin)
            wrong = [h.name for h in loaded.pm.get_hookcallers(plugin) or () if not h.has_spec()]
            close = difflib.get_close_matches(wrong[0], hooks, n=1) if wrong else []
            hint = f"; did you mean {close[0]}?" if close else f"; hooks: {', '.join(hooks)}"
            source = loaded.sources.pop(id(plugin), Source("unknown", "unknown"))
            loaded.pm.unregister(plugin)
            reason = f"implements {', '.join(map(repr, wrong))}, which is no dllmbench hook{hint}"
            loaded.broken.append(Broken(name, None, source.distribution, name, reason))


def load_plugin_manager(selection: PluginSelection | None = None) -> Loaded:
    """A plugin manager with built-ins, allowed entry points and named modules registered."""
    selection = selection or PluginSelection()
    pm = pluggy.PluginManager("dllmbench")
    pm.add_hookspecs(hookspecs)
    loaded = Loaded(pm, {}, disabled={_norm(n) for n in selection.disable})
    core = Source("dllmbench", _version("dllmbench"))
    for modname in BUILTIN_MODULES:
        _add(loaded, modname, lambda m=modname: importlib.import_module(m), core)

    entry_points = list(md.entry_points(group="dllmbench"))
    dists = {ep.dist.name if ep.dist is not None else "unknown" for ep in entry_points}
    allow = selection.allow
    if allow is not None:
        _unknown("DLLMBENCH_PLUGINS", allow, dists)
    loaded.known |= dists | {ep.name for ep in entry_points}
    seen: set[tuple[str, str]] = set()
    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "unknown"
        if allow is not None and _norm(dist) not in {_norm(a) for a in allow}:
            continue
        if (dist, ep.name) in seen or loaded.disabled & {_norm(dist), _norm(ep.name)}:
            continue
        seen.add((dist, ep.name))
        version = ep.dist.version if ep.dist is not None else "unknown"
        _add(loaded, f"{dist}:{ep.name}", ep.load, Source(dist, version))

    for modname in selection.modules:
        loaded.known.add(modname)
        if _norm(modname) not in loaded.disabled:
            load = lambda m=modname: importlib.import_module(m)  # noqa: E731
            _add(loaded, modname, load, Source(f"module:{modname}", "local"))
    _drop_unknown_hooks(loaded)
    return loaded


class _Collector:
    """Gathers what one plugin at a time registers; clashes and raising hooks mark broken."""

    def __init__(self, loaded: Loaded):
        self.loaded = loaded
        self.plugins: dict[str, dict[str, PluginInfo]] = {kind: {} for kind in KINDS}
        self.families: dict[str, MethodFamily] = {}
        self.clashes: dict[tuple[str, str], list[str]] = {}  # (kind, name) → "dist (module)"

    def _source(self, impl: Any) -> Source:
        return self.loaded.sources.get(id(impl.plugin), Source("unknown", "unknown"))

    def _taken(self, kind: str, name: str, table: dict[str, Any], src: Source, mod: str) -> bool:
        if name not in table and (kind, name) not in self.clashes:
            return False
        if name in table:
            other = table.pop(name)
            self.clashes[kind, name] = [f"{other.distribution} ({other.module})"]
        self.clashes[kind, name].append(f"{src.distribution} ({mod})")
        return True

    def _register(self, kind: str, impl: Any, name: str, factory: Any = None, **family: str):
        """The `register` callback one plugin's hook receives."""
        src, mod = self._source(impl), impl.plugin_name
        table: dict[str, Any] = self.families if kind == "method" else self.plugins[kind]
        if self._taken(kind, name, table, src, mod):
            return
        if kind == "method":
            table[name] = MethodFamily(
                name, distribution=src.distribution, module=mod, version=src.version, **family
            )
        else:
            table[name] = PluginInfo(name, kind, factory, src.distribution, src.version, mod)

    def call(self, hook_name: str, kind: str) -> None:
        for impl in getattr(self.loaded.pm.hook, hook_name).get_hookimpls():  # in order
            table: dict[str, Any] = self.families if kind == "method" else self.plugins[kind]
            before = dict(table)
            try:
                impl.function(register=functools.partial(self._register, kind, impl))
            except Exception as exc:  # its hook is broken: what it registered there is dropped
                table.clear()
                table.update(before)
                src = self._source(impl)
                reason = f"{hook_name} raised {_reason(exc)}"
                self.loaded.broken.append(
                    Broken(impl.plugin_name, None, src.distribution, impl.plugin_name, reason)
                )

    def broken(self) -> list[Broken]:
        out = list(self.loaded.broken)
        for (kind, name), sides in self.clashes.items():
            reason = (
                f"registered by {' and '.join(sides)}; uninstall one, limit DLLMBENCH_PLUGINS "
                "or set DLLMBENCH_DISABLE"
            )
            dists = " and ".join(s.split(" (")[0] for s in sides)
            out.append(
                Broken(name, "method family" if kind == "method" else kind, dists, "", reason)
            )
        return out


def collect(loaded: Loaded) -> Collected:
    """Call every plugin's register hooks, one plugin at a time, so clashes name both sides."""
    collector = _Collector(loaded)
    for kind, hook_name in KINDS.items():
        collector.call(hook_name, kind)
    collector.call(FAMILY_HOOK, "method")
    plugins, families = collector.plugins, collector.families
    registered = {n for table in plugins.values() for n in table} | set(families)
    _unknown(
        "DLLMBENCH_DISABLE",
        [n for n in loaded.disabled if _norm(n) not in {_norm(k) for k in registered}],
        loaded.known | registered,
    )
    removed = set()
    for table in (*plugins.values(), families):
        for name in [n for n in table if _norm(n) in loaded.disabled]:
            del table[name]
            removed.add(name)
    return Collected(plugins, families, collector.broken(), frozenset(removed))
