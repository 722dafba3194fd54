"""The plugin template under docs/plugin-template works as its pyproject says: its entry
point names its module, and its tests (the contract kit on its two plugins, and its own)
pass."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

TEMPLATE = Path(__file__).resolve().parents[1] / "docs" / "plugin-template"


def test_entry_point_names_the_module():
    project = tomllib.loads((TEMPLATE / "pyproject.toml").read_text(encoding="utf-8"))
    (module,) = project["project"]["entry-points"]["dllmbench"].values()
    assert (TEMPLATE / "src" / module / "__init__.py").is_file()
    assert project["project"]["dependencies"] == ["dllmbench"]


@pytest.mark.slow
def test_template_tests_pass(pytester, monkeypatch, registry_with):
    shutil.copytree(TEMPLATE, pytester.path, dirs_exist_ok=True)
    monkeypatch.syspath_prepend(str(pytester.path / "src"))
    registry_with()  # the doubles again once the test is over
    # as if installed: the kit (an entry point, like the command line) reads the environment
    monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", "dllmbench_example")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "-v")
    out = result.stdout.str()
    assert result.ret == 0, out
    for check in (
        "test_strategy_spends_what_it_declares[example_resample:k=3,every=4] PASSED",
        "test_strategy_pool_scores_are_true[example_resample] PASSED",
        "test_selector_returns_an_index_in_range[example_best] PASSED",
        "test_resample_on_the_toy_task PASSED",
        "test_best_picks_the_valid_candidate_with_the_highest_score PASSED",
    ):
        assert check in out, out
    assert "[independent" not in out and "[majority" not in out  # dllmbench_plugins limits
