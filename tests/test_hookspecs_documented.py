"""Every hookspec is exercised by a test and documented with its signature.

This module is a plugin implementing every hook of `dllmbench.api.hookspecs`; the tests load it
through the real plugin manager and check that each hook was called and what it registered
arrived. A new hookspec fails here until it has an implementation below and a block in
docs/plugin-authors.md.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from dllmbench.api import hookspecs
from dllmbench.api.hookspecs import hookimpl
from dllmbench.loading.manager import KINDS
from dllmbench.plugins.selectors.basic import First
from dllmbench.plugins.strategies.independent import Independent
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugin-authors.md"
HOOKSPECS = {
    name: fn
    for name, fn in vars(hookspecs).items()
    if inspect.isfunction(fn) and hasattr(fn, "dllmbench_spec")
}
CALLED: list[str] = []


@hookimpl
def dllmbench_register_backbones(register):
    CALLED.append("dllmbench_register_backbones")
    register("meta_backbone", ToyBackbone)


@hookimpl
def dllmbench_register_scorers(register):
    CALLED.append("dllmbench_register_scorers")
    register("meta_scorer", ToyScorer)


@hookimpl
def dllmbench_register_strategies(register):
    CALLED.append("dllmbench_register_strategies")
    register("meta_strategy", Independent)


@hookimpl
def dllmbench_register_selectors(register):
    CALLED.append("dllmbench_register_selectors")
    register("meta_selector", First)


@hookimpl
def dllmbench_register_tasks(register):
    CALLED.append("dllmbench_register_tasks")
    register("meta_task", ToySum)


@hookimpl
def dllmbench_register_methods(register):
    CALLED.append("dllmbench_register_methods")
    register("meta_family", spec="meta_strategy:n=*+meta_selector", label="Meta@{n}")


IMPLEMENTED = {
    name
    for name, fn in list(globals().items())
    if inspect.isfunction(fn) and hasattr(fn, "dllmbench_impl")
}


def test_every_hookspec_has_an_implementation_here():
    assert HOOKSPECS, "found no hookspecs in dllmbench.api.hookspecs"
    missing = sorted(set(HOOKSPECS) - IMPLEMENTED)
    assert not missing, f"hookspecs with no implementation in {__name__}: {missing}"


@pytest.fixture
def meta_registry(registry_with):
    CALLED.clear()
    return registry_with(__name__)


def test_every_hookspec_is_called_through_the_manager(meta_registry):
    assert sorted(CALLED) == sorted(HOOKSPECS)
    assert not [b.line() for b in meta_registry.broken() if __name__ in b.module], "broken"
    for kind in KINDS:
        info = meta_registry.info(kind, f"meta_{kind}")
        assert (info.distribution, info.module) == (f"module:{__name__}", __name__)
    assert meta_registry.strategy("meta_strategy", n=2).pool_size() == 2
    family = meta_registry.family("meta_family")
    assert family is not None
    assert (family.spec, family.label) == ("meta_strategy:n=*+meta_selector", "Meta@{n}")


def _written(node: ast.FunctionDef) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"({ast.unparse(node.args)}){ret}"


def signature(fn) -> str:
    """A hookspec's signature as its source writes it: `(register: Register[Backbone]) -> None`.
    Its parameters are checked against `inspect.signature` too."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    assert names == list(inspect.signature(fn).parameters)
    return _written(node)


def documented_hookspecs(markdown: str) -> dict[str, str]:
    """Each `@hookspec` function in the doc's python blocks → its signature, as written."""
    found = {}
    for block in re.findall(r"```python\n(.*?)```", markdown, flags=re.S):
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d) == "hookspec" for d in node.decorator_list
            ):
                found[node.name] = _written(node)
    return found


def test_every_hookspec_is_documented_with_its_signature():
    documented = documented_hookspecs(DOC.read_text(encoding="utf-8"))
    for name, fn in HOOKSPECS.items():
        assert name in documented, f"{name} is not in docs/plugin-authors.md"
        assert documented[name] == signature(fn), (name, documented[name], signature(fn))
    extra = sorted(set(documented) - set(HOOKSPECS))
    assert not extra, f"docs/plugin-authors.md shows hookspecs that do not exist: {extra}"


def test_the_doc_parser_sees_signatures():
    doc = "```python\n@hookspec\ndef dllmbench_x(register: R[int], *, k: int = 2) -> None:\n"
    doc += '    """Doc."""\n\ndef helper(x):\n    pass\n```\n```python\nnot python(\n```'
    assert documented_hookspecs(doc) == {"dllmbench_x": "(register: R[int], *, k: int=2) -> None"}
    assert signature(hookspecs.dllmbench_register_tasks) == "(register: Register[Task]) -> None"
