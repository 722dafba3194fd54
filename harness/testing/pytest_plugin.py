"""pytest plugin (entry point `pytest11`): parametrise contract checks over every plugin.

A test that asks for `dllmbench_strategy`, `dllmbench_selector`, `dllmbench_backbone`,
`dllmbench_scorer` or `dllmbench_task` runs once per registered plugin of that kind and
per configuration in its factory's `contract_configs` (default: the defaults), receiving
(name, config). The ini option `dllmbench_plugins` (names) limits them to those plugins.

Like the command line, the plugin is an entry point that reads the environment:
`DLLMBENCH_PLUGIN_MODULES`, `DLLMBENCH_PLUGINS` and `DLLMBENCH_DISABLE` say which plugins the
session's registry loads (for the contract checks, and for `run_strategy` and the other
helpers). The selection a session set is undone when it ends.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

# Every pytest session in an environment with dllmbench installed loads this module: it
# imports nothing of dllmbench (nor torch) until a test asks for a plugin fixture.
KINDS = ("backbone", "scorer", "strategy", "selector", "task")  # = manager.KINDS (tested)
FIXTURES = {f"dllmbench_{kind}": kind for kind in KINDS}
PREVIOUS = pytest.StashKey[Any]()  # the registry's selection before this session set one


def pytest_addoption(parser):
    parser.addini(
        "dllmbench_plugins",
        "names of the plugins the dllmbench contract checks run on (default: every one)",
        type="args",
        default=[],
    )


def _select_from_environment(config) -> None:
    """Point the registry at the plugins the environment names, once per session; remember
    what it loaded before, for `pytest_unconfigure`."""
    from dllmbench.loading.manager import PluginSelection
    from dllmbench.loading.registry import selection, use_plugins

    if PREVIOUS not in config.stash:
        config.stash[PREVIOUS] = selection()
    use_plugins(PluginSelection.from_environment(os.environ))


def pytest_collection_finish(session):
    # a session whose tests import dllmbench (helpers such as run_strategy) sees the plugins
    # the environment names; a session that does not import it stays free of torch
    if "dllmbench.loading.registry" in sys.modules:
        _select_from_environment(session.config)


def pytest_unconfigure(config):
    previous = config.stash.get(PREVIOUS, None)
    if previous is not None:
        from dllmbench.loading.registry import use_plugins

        use_plugins(previous)


def requested_problems(reg, only) -> list[str]:
    """One line per plugin named in `dllmbench_plugins` that the checks cannot run on: not
    registered under any kind (a typo, a package not installed), or broken (a failed import,
    a raising hook, a name clash)."""
    problems = []
    # a module that failed to import or whose hook raised may be the one that registers it
    modules = "".join(f"; broken: {b.line()}" for b in reg.broken() if b.kind is None)
    for name in sorted(only):
        broken = [b for b in reg.broken() if b.name == name]
        if broken:
            problems.append(f"dllmbench_plugins names {name!r}: {broken[0].line()}")
        elif not any(name in reg.names(kind) for kind in KINDS):
            known = sorted({n for kind in KINDS for n in reg.names(kind)})
            problems.append(
                f"dllmbench_plugins names {name!r}, which no installed plugin registers "
                f"(is its package installed? known: {', '.join(known)}){modules}"
            )
    return problems


def pytest_collection_modifyitems(session, config, items):
    """Asked to check named plugins, fail (not skip) when one of them cannot be checked;
    a session that collects no contract check (a package's other tests) is left alone."""
    only = config.getini("dllmbench_plugins")
    if not only or not any(
        FIXTURES.keys() & set(getattr(item, "fixturenames", ())) for item in items
    ):
        return
    from dllmbench.loading.registry import registry

    _select_from_environment(config)
    problems = requested_problems(registry(), only)
    if problems:
        raise pytest.UsageError("; ".join(problems))


def pytest_generate_tests(metafunc):
    only = set(metafunc.config.getini("dllmbench_plugins"))
    for fixture, kind in FIXTURES.items():
        if fixture not in metafunc.fixturenames:
            continue
        from dllmbench.api.interfaces import contract_configs
        from dllmbench.loading.registry import registry

        _select_from_environment(metafunc.config)
        reg = registry()
        params, ids = [], []
        for name in reg.names(kind):
            if only and name not in only:
                continue
            for config in contract_configs(reg.info(kind, name).factory):
                params.append((name, dict(config)))
                opts = ",".join(f"{k}={v}" for k, v in config.items())
                ids.append(f"{name}:{opts}" if opts else name)
        metafunc.parametrize(fixture, params, ids=ids)
