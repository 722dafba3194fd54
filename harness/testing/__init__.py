"""The contract kit and helpers for plugin authors' tests.

`dllmbench.testing.contracts` holds the checks every plugin of a kind must pass;
`dllmbench.testing.pytest_plugin` is the pytest entry point that parametrises them over every
registered plugin; `dllmbench.testing.doubles` holds small deterministic plugins to run them
on. The helpers below (from `dllmbench.testing.helpers`) build candidates, rows and pools by
hand and run one method on the toy task. They load on first use, so that pytest, which
imports this package as a plugin, does not import torch for every test session.
"""

from __future__ import annotations

from typing import Any

HELPERS = ("make_candidate", "make_candidates", "make_rows", "make_pool", "run_strategy")
__all__ = list(HELPERS)


def __getattr__(name: str) -> Any:
    if name in HELPERS:
        from dllmbench.testing import helpers

        return getattr(helpers, name)
    raise AttributeError(f"module 'dllmbench.testing' has no attribute {name!r}")
