"""Defaults the command line shares with a configuration dataclass, read from the dataclass's
source instead of its module: the modules holding `Sampling`, `Capacity`, `RunConfig` and the
scorers' configurations import torch, which `dllmbench --help`, `--version` and an argument
error never need. The dataclass stays the one source of each value (tests/test_defaults.py
compares every parser default with the imported dataclass's).

A default read here is a literal (`128`, `"chat"`, `2e-5`), a module-level constant of the
module (`RESAMPLES`), or a name that module imports from another (followed there). Anything
else is a `TypeError` when the parsers are built: a default computed at import time cannot be
read without importing its module.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import Any


def declared_default(dataclass_path: str, name: str) -> Any:
    """The default of field `name` of the dataclass at `dataclass_path` (`module.Class`),
    as its source declares it, without importing the module."""
    module, _, cls = dataclass_path.rpartition(".")
    for node in _class(module, cls).body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            if node.value is None:
                break
            return _value(module, _default_of(node.value, dataclass_path, name))
    raise KeyError(f"{dataclass_path} declares no field {name!r} with a default")


def _default_of(value: ast.expr, where: str, name: str) -> ast.expr:
    """The default's expression: the value itself, or `field(default=...)`'s."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return keyword.value
        raise TypeError(f"{where}.{name} has no plain default (a default_factory?)")
    return value


def _value(module: str, expr: ast.expr) -> Any:
    """A literal, or a constant of `module` (or one it imports), evaluated without imports."""
    if isinstance(expr, ast.Name):
        return _value(*_constant(module, expr.id))
    try:
        return ast.literal_eval(expr)
    except ValueError:
        raise TypeError(
            f"a default in {module} is no literal: {ast.unparse(expr)!r}; give the command "
            "line's option a literal or a module constant"
        ) from None


def _constant(module: str, name: str) -> tuple[str, ast.expr]:
    """(module, expression) of a module-level `name = ...`, or where an import brings it from."""
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return module, node.value
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", None) == name
            and node.value is not None
        ):
            return module, node.value
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _constant(node.module, alias.name)
    raise TypeError(f"{module} defines no constant {name!r} that a default can name")


def _class(module: str, cls: str) -> ast.ClassDef:
    for node in _tree(module).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return node
    raise KeyError(f"{module} defines no class {cls!r}")


@functools.cache
def _tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)  # imports the parent packages only (light)
    if spec is None or spec.origin is None:
        raise KeyError(f"no module {module!r}")
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"), filename=spec.origin)
