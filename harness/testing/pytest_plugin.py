"""pytest plugin (entry point `pytest11`): parametrise contract checks over every plugin.

A test that asks for `dllmbench_strategy`, `dllmbench_selector`, `dllmbench_backbone`,
`dllmbench_scorer` or `dllmbench_task` runs once per registered plugin of that kind and
per configuration in its factory's `contract_configs` (default: the defaults), receiving
(name, config).
"""

from __future__ import annotations

from dllmbench.manager import KINDS

FIXTURES = {f"dllmbench_{kind}": kind for kind in KINDS}


def pytest_generate_tests(metafunc):
    for fixture, kind in FIXTURES.items():
        if fixture not in metafunc.fixturenames:
            continue
        from dllmbench.registry import registry

        reg = registry()
        params, ids = [], []
        for name in reg.names(kind):
            configs = getattr(reg.info(kind, name).factory, "contract_configs", None) or [{}]
            for config in configs:
                params.append((name, dict(config)))
                opts = ",".join(f"{k}={v}" for k, v in config.items())
                ids.append(f"{name}:{opts}" if opts else name)
        metafunc.parametrize(fixture, params, ids=ids)
