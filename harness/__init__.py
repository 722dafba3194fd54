"""dllmbench: which way of spending test-time search on a diffusion LM wins at equal compute.

The code is grouped by layer, each a subpackage that imports only from the layers below it:

    core       types, keys, errors, the record schema, the ledger, small file utilities
    api        what a plugin implements and calls: hookspecs, interfaces (Protocols), ops
    loading    the plugin manager, the registry, provenance
    execution  method specs, the planner, the engine and its scheduler
    storage    run directories and their shares
    analysis   statistics, results, leaderboard, pooled estimators, diagnostics, report
    running    one run from configuration to run directory; merging shares; presets
    scoring    collecting trajectories and training scorers
    demo       the shipped tiny model and the code that rebuilds it
    cli        the `dllmbench` command
    testing    the contract kit and helpers for plugin authors' tests

`STABLE_PATHS` keeps the import paths that docs/plugin-authors.md promises plugin authors
(`dllmbench.hookspecs`, `dllmbench.types`, ...): each is the same module object as the one in
its layer, loaded only when imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

try:
    __version__ = version("dllmbench")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"

STABLE_PATHS = {
    "dllmbench.hookspecs": "dllmbench.api.hookspecs",
    "dllmbench.interfaces": "dllmbench.api.interfaces",
    "dllmbench.ops": "dllmbench.api.ops",
    "dllmbench.types": "dllmbench.core.types",
    "dllmbench.keys": "dllmbench.core.keys",
    "dllmbench.errors": "dllmbench.core.errors",
    "dllmbench.flops": "dllmbench.core.flops",
}


class _StablePaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a stable path as the module it names, the very same object."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in STABLE_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def create_module(self, spec):
        module = importlib.import_module(STABLE_PATHS[spec.name])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias's spec on the real module: give its own back.
        module.__spec__ = self._specs[module.__spec__.name]


if not any(isinstance(finder, _StablePaths) for finder in sys.meta_path):
    sys.meta_path.append(_StablePaths())

__all__ = ["STABLE_PATHS", "__version__"]
