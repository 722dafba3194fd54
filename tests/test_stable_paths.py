"""Every import path and name that docs/plugin-authors.md ("What is stable") promises a plugin
author imports, and each path is the very module that the layered code uses."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dllmbench

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugin-authors.md"


def _promised() -> dict[str, list[str]]:
    """The table of the section: import path → the backticked names of its row."""
    text = DOC.read_text()
    section = text[text.index("## What is stable") : text.index("## Typed contracts")]
    rows = re.findall(r"^\| `(dllmbench[\w.]*)` \| (.*) \|$", section, re.M)
    unlinked = {path: re.sub(r"\[[^]]*\]\([^)]*\)", "", names) for path, names in rows}
    return {path: re.findall(r"`(\w+)`", names) for path, names in unlinked.items()}


PROMISED = _promised()


def test_the_section_lists_the_plugin_api():
    assert {
        "dllmbench.hookspecs",
        "dllmbench.interfaces",
        "dllmbench.types",
        "dllmbench.ops",
        "dllmbench.errors",
        "dllmbench.testing",
    } <= set(PROMISED)


@pytest.mark.parametrize("path", sorted(PROMISED))
def test_a_promised_path_imports_with_its_names(path: str):
    module = importlib.import_module(path)
    names = [n for n in PROMISED[path] if n != "dllmbench_plugins"]  # an ini option, not a name
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{path} lacks {missing}"


@pytest.mark.parametrize("alias", sorted(dllmbench.STABLE_PATHS))
def test_an_alias_is_the_layered_module_itself(alias: str):
    module = importlib.import_module(alias)
    real = importlib.import_module(dllmbench.STABLE_PATHS[alias])
    assert module is real
    assert module.__spec__.name == real.__name__  # the alias does not rename the module


@pytest.mark.slow
def test_aliases_resolve_in_a_fresh_interpreter_in_any_order():
    code = (
        "from dllmbench.types import Rows\n"
        "from dllmbench.hookspecs import hookimpl\n"
        "import dllmbench.api.hookspecs as h, dllmbench.core.types as t\n"
        "from dllmbench import ops\n"
        "assert h.hookimpl is hookimpl and t.Rows is Rows\n"
        "assert ops.Ops.__module__ == 'dllmbench.api.ops'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
