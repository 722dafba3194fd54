"""Plugin manager: built-ins, entry-point plugins and the allow-list.

Built-ins register through the same hooks as third-party packages. Third-party packages
declare `[project.entry-points.dllmbench]`; `DLLMBENCH_PLUGINS=dist-a,dist-b` loads only those
distributions (empty: none). `DLLMBENCH_PLUGIN_MODULES=pkg.mod,...` registers modules by
import path, for plugins that are not installed as a distribution (like pytest's -p).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
from dataclasses import dataclass
from typing import Any

import pluggy

from dllmbench import hookspecs
from dllmbench.errors import PluginError

# The one place where the core names built-in plugins.
BUILTIN_MODULES = (
    "dllmbench.plugins.backbones.dream",
    "dllmbench.plugins.backbones.llada",
    "dllmbench.plugins.backbones.tiny",
    "dllmbench.plugins.scorers.reward",
    "dllmbench.plugins.strategies.independent",
    "dllmbench.plugins.strategies.prm_guided",
    "dllmbench.plugins.strategies.smc",
    "dllmbench.plugins.selectors.basic",
    "dllmbench.plugins.selectors.voting",
    "dllmbench.plugins.selectors.oracle",
    "dllmbench.tasks.gsm8k",
    "dllmbench.tasks.math500",
    "dllmbench.tasks.mbpp",
    "dllmbench.tasks.arith",
)

KINDS = {
    "backbone": "dllmbench_register_backbones",
    "scorer": "dllmbench_register_scorers",
    "strategy": "dllmbench_register_strategies",
    "selector": "dllmbench_register_selectors",
    "task": "dllmbench_register_tasks",
}


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


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "unknown"


def _allow_list() -> set[str] | None:
    raw = os.environ.get("DLLMBENCH_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def load_plugin_manager() -> tuple[pluggy.PluginManager, dict[int, Source]]:
    """A plugin manager with built-ins, allowed entry points and named modules registered."""
    pm = pluggy.PluginManager("dllmbench")
    pm.add_hookspecs(hookspecs)
    sources: dict[int, Source] = {}
    core = Source("dllmbench", _version("dllmbench"))
    for modname in BUILTIN_MODULES:
        module = importlib.import_module(modname)
        pm.register(module, name=modname)
        sources[id(module)] = core

    allow = _allow_list()
    seen: set[str] = set()
    for ep in md.entry_points(group="dllmbench"):
        dist = ep.dist.name if ep.dist is not None else "unknown"
        if allow is not None and dist not in allow:
            continue
        if (dist, ep.name) in seen:
            continue
        seen.add((dist, ep.name))
        try:
            module = ep.load()
        except Exception as exc:  # a broken third-party plugin is reported, not a traceback
            raise PluginError(f"plugin {ep.name!r} from {dist} failed to load: {exc}") from exc
        if pm.is_registered(module):
            continue
        pm.register(module, name=f"{dist}:{ep.name}")
        sources[id(module)] = Source(dist, ep.dist.version if ep.dist is not None else "unknown")

    for modname in filter(None, os.environ.get("DLLMBENCH_PLUGIN_MODULES", "").split(",")):
        modname = modname.strip()
        try:
            module = importlib.import_module(modname)
        except ImportError as exc:
            raise PluginError(
                f"DLLMBENCH_PLUGIN_MODULES names {modname!r}, which does not import: {exc}"
            ) from exc
        if not pm.is_registered(module):
            pm.register(module, name=modname)
            sources[id(module)] = Source(f"module:{modname}", "local")
    return pm, sources


def collect(
    pm: pluggy.PluginManager, sources: dict[int, Source]
) -> dict[str, dict[str, PluginInfo]]:
    """Call every plugin's register hooks, one plugin at a time, so clashes name both sides."""
    found: dict[str, dict[str, PluginInfo]] = {kind: {} for kind in KINDS}
    for kind, hook_name in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():  # registration order
            source = sources.get(id(impl.plugin), Source("unknown", "unknown"))

            def register(name: str, factory: Any, *, _kind=kind, _src=source, _impl=impl) -> None:
                table = found[_kind]
                if name in table:
                    other = table[name]
                    raise PluginError(
                        f"two plugins register the {_kind} {name!r}: {other.distribution} "
                        f"({other.module}) and {_src.distribution} ({_impl.plugin_name}); "
                        f"uninstall one or limit DLLMBENCH_PLUGINS"
                    )
                table[name] = PluginInfo(
                    name, _kind, factory, _src.distribution, _src.version, _impl.plugin_name
                )

            impl.function(register=register)
    return found
