"""No module reaches into another's private names: `from dllmbench.x import _y` between
modules of the package (harness, plugins, tasks) or the benchmarks is refused. Tests may use
the private helpers of the module they test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("harness", "plugins", "tasks", "benchmarks")


def private_imports(path: Path) -> list[str]:
    """`module:line name` for every private name imported from a dllmbench module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dllmbench"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}:{node.lineno} {alias.name}")
    return found


def test_the_scan_finds_a_private_import(tmp_path: Path):
    source = tmp_path / "m.py"
    source.write_text(
        "from dllmbench import __version__\n"
        "from dllmbench.storage.rundir import RunDir\n"
        "def f():\n"
        "    from dllmbench.running.runner import _helper as helper\n"
    )
    assert private_imports(source) == ["dllmbench.running.runner:4 _helper"]


@pytest.mark.parametrize(
    "path",
    sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_module_imports_another_modules_private_names(path: Path):
    assert not private_imports(path), (
        f"{path.relative_to(ROOT)} imports private names: {private_imports(path)}; "
        "give them a public home"
    )
