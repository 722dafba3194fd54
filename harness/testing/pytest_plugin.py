"""pytest plugin (entry point `pytest11`): parametrise contract checks over every plugin.

A test that asks for `dllmbench_strategy`, `dllmbench_selector`, `dllmbench_backbone`,
`dllmbench_scorer` or `dllmbench_task` runs once per registered plugin of that kind and
per configuration in its factory's `contract_configs` (default: the defaults), receiving
(name, config). The ini option `dllmbench_plugins` (names) limits them to those plugins.
"""

from __future__ import annotations

import os

# Every pytest session in an environment with dllmbench installed loads this module: it
# imports nothing of dllmbench (nor torch) until a test asks for a plugin fixture.
KINDS = ("backbone", "scorer", "strategy", "selector", "task")  # = manager.KINDS (tested)
FIXTURES = {f"dllmbench_{kind}": kind for kind in KINDS}


def pytest_addoption(parser):
    parser.addini(
        "dllmbench_plugins",
        "names of the plugins the dllmbench contract checks run on (default: every one)",
        type="args",
        default=[],
    )


def pytest_generate_tests(metafunc):
    only = set(metafunc.config.getini("dllmbench_plugins"))
    for fixture, kind in FIXTURES.items():
        if fixture not in metafunc.fixturenames:
            continue
        from dllmbench.api.interfaces import contract_configs
        from dllmbench.loading.manager import PluginSelection
        from dllmbench.loading.registry import registry, use_plugins

        # an entry point like the command line: the environment says which plugins load
        use_plugins(PluginSelection.from_environment(os.environ))
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
