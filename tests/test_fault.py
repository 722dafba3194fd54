"""Errors say who is at fault: a bad option is the user's (exit status 2, one line); an
exception raised in a plugin's own code is that plugin's (exit status 3, one line naming it and
its distribution); `--debug` or DLLMBENCH_DEBUG=1 adds the traceback. And the pytest plugin
that every installed dllmbench brings to pytest imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import assert_user_error

pytest_plugins = ("pytester",)

FAULTY = """
from dataclasses import dataclass

from dllmbench.hookspecs import hookimpl
from dllmbench.plugins.strategies.independent import Independent


@dataclass(frozen=True)
class FaultyConfig:
    n: int = 1

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


class BreaksWhenBuilt:
    Config = FaultyConfig

    def __init__(self, **config):
        self.config = FaultyConfig(**config)
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")


class BreaksWhenSearching(Independent):
    async def search(self, problem, ops):
        raise KeyError("lost")


class StartsAnother(Independent):
    async def search(self, problem, ops):
        other = type(problem)(problem.id + "-other", problem.question, problem.gold)
        return ops.pool(await ops.denoise(ops.start(other, copies=1)))


class PoolsTheFirst(Independent):
    first = None

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=1))
        PoolsTheFirst.first = PoolsTheFirst.first or rows
        return ops.pool(PoolsTheFirst.first)


class ChangesScores:
    needs = ()
    ceiling = False

    def select(self, candidates, *, rng, labels=None):
        candidates[0].scores["orm"] = 1.0  # a score nobody paid for
        return 0


class SortsInPlace(ChangesScores):
    def select(self, candidates, *, rng, labels=None):
        candidates.sort(key=lambda c: -c.index)  # `selected` would index another candidate
        return 0


@hookimpl
def dllmbench_register_selectors(register):
    register("changes_scores", ChangesScores)
    register("sorts_in_place", SortsInPlace)


@hookimpl
def dllmbench_register_strategies(register):
    register("breaks_when_built", BreaksWhenBuilt)
    register("breaks_when_searching", BreaksWhenSearching)
    register("starts_another", StartsAnother)
    register("pools_the_first", PoolsTheFirst)
"""

RUN = ("run", "--task", "toy_sum:size=2", "--backbone", "toy", "--steps", "4", "--gen-length", "5")
RUN_TAIL = ("--budget", "8", "--resamples", "10")


@pytest.fixture
def faulty(tmp_path, monkeypatch, registry_with):
    (tmp_path / "faulty_plugins.py").write_text(textwrap.dedent(FAULTY))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("faulty_plugins", None)
    registry_with("faulty_plugins")


def _run(cli, tmp_path, method: str, *extra: str):
    return cli(*RUN, "--method", method, *RUN_TAIL, "--out", tmp_path / "run", *extra)


def _one_line_naming_the_plugin(result, plugin: str, raised: str) -> None:
    lines = [line for line in result.err.splitlines() if " records (" not in line]  # progress
    assert result.code == 3, result
    assert "Traceback" not in result.err, result.err
    assert len(lines) == 1, result.err
    assert lines[0].startswith("dllmbench: error: ")
    assert f"strategy '{plugin}' (from module:faulty_plugins) raised {raised}" in lines[0]


def test_a_plugin_raising_typeerror_when_built_exits_3_naming_it(cli, tmp_path, faulty):
    result = _run(cli, tmp_path, "breaks_when_built:n=1+first")
    _one_line_naming_the_plugin(result, "breaks_when_built", "TypeError: unsupported operand")


def test_a_plugin_raising_while_searching_exits_3_naming_it(cli, tmp_path, faulty):
    result = _run(cli, tmp_path, "breaks_when_searching:n=1+first")
    _one_line_naming_the_plugin(result, "breaks_when_searching", "KeyError: 'lost'")


def test_ops_misuse_is_the_plugins_fault_in_one_line(cli, tmp_path, faulty):
    result = _run(cli, tmp_path, "starts_another:n=1+first")
    _one_line_naming_the_plugin(result, "starts_another", "ValueError: ops.start was given")
    pooled = _run(cli, tmp_path / "b", "pools_the_first:n=1+first")
    _one_line_naming_the_plugin(pooled, "pools_the_first", "ValueError: ops.pool was given rows")
    assert "but this search serves problem" in pooled.err


@pytest.mark.parametrize(
    ("selector", "raised"),
    [
        (
            "changes_scores",
            "TypeError: a candidate's scores are read-only; copy them with dict(...)",
        ),
        ("sorts_in_place", "AttributeError: 'tuple' object has no attribute 'sort'"),
    ],
)
def test_a_selector_changing_its_candidates_exits_3_naming_it(
    cli, tmp_path, faulty, selector, raised
):
    """A selector receives a tuple of read-only candidates: changing them is its fault."""
    result = _run(cli, tmp_path, f"independent:n=2+{selector}")
    lines = [line for line in result.err.splitlines() if " records (" not in line]
    assert result.code == 3, result
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert f"selector '{selector}' (from module:faulty_plugins) raised {raised}" in lines[0]


def test_a_bad_option_is_the_users_mistake(cli, tmp_path, faulty):
    refused = _run(cli, tmp_path, "breaks_when_built:n=0+first")  # its Config refuses n=0
    assert_user_error(refused, "strategy 'breaks_when_built' with n=0: n must be >= 1, got 0")
    unknown = _run(cli, tmp_path, "breaks_when_built:width=2+first")
    assert_user_error(unknown, "strategy 'breaks_when_built' has no option 'width'")
    typed = _run(cli, tmp_path, "breaks_when_built:n=two+first")
    assert_user_error(typed, "option n wants an int, got 'two'")


@pytest.mark.parametrize("how", ["--debug", "DLLMBENCH_DEBUG"])
def test_debug_shows_the_traceback(cli, tmp_path, faulty, monkeypatch, how):
    extra = ("--debug",) if how == "--debug" else ()
    if how == "DLLMBENCH_DEBUG":
        monkeypatch.setenv("DLLMBENCH_DEBUG", "1")
    crashed = _run(cli, tmp_path, "breaks_when_built:n=1+first", *extra)
    assert crashed.code == 3
    assert "Traceback" in crashed.err and "faulty_plugins.py" in crashed.err
    assert crashed.err.strip().splitlines()[-1].startswith("dllmbench: error: strategy ")
    refused = _run(cli, tmp_path, "breaks_when_built:n=0+first", *extra)
    assert refused.code == 2 and "Traceback" in refused.err


def test_debug_goes_before_the_command_too(cli, tmp_path, faulty):
    result = cli(
        "--debug",
        *RUN,
        "--method",
        "breaks_when_built:n=1+first",
        *RUN_TAIL,
        "--out",
        tmp_path / "run",
    )
    assert result.code == 3 and "Traceback" in result.err


@pytest.mark.slow
def test_the_pytest_plugin_imports_nothing_heavy(tmp_path):
    """`python -X importtime -m pytest --co` on a file that does not use dllmbench: the
    pytest11 entry point loads, and neither torch nor transformers comes with it."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pytest", "--co", "-q", "-s",
         "--trace-config", "-p", "no:cacheprovider", "test_plain.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the entry point did load
    assert "registered: <module 'dllmbench.testing.pytest_plugin'" in done.stdout, done.stdout
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "transformers", "numpy"))
    assert not heavy, heavy[:5]


def test_the_pytest_plugin_knows_every_kind():
    from dllmbench.loading.manager import KINDS
    from dllmbench.testing.pytest_plugin import KINDS as FIXTURE_KINDS

    assert sorted(FIXTURE_KINDS) == sorted(KINDS)


SECOND = '''
from dllmbench.hookspecs import hookimpl
from dllmbench.plugins.strategies.independent import Independent


class Second(Independent):
    """An independent pool under another name."""


@hookimpl
def dllmbench_register_strategies(register):
    register("second_pool", Second)
'''


def test_the_pytest_plugin_gives_helpers_the_plugins_the_environment_names(
    pytester, monkeypatch, registry_with
):
    """A plugin author's test that calls run_strategy (no contract fixture) sees the plugin
    named in DLLMBENCH_PLUGIN_MODULES; the session's selection is undone when it ends."""
    registry_with()  # the doubles again once this test is over
    pytester.makepyfile(second_plugin=SECOND)
    pytester.makepyfile(
        test_second="""
        from dllmbench.testing import run_strategy

        def test_second_runs():
            records = run_strategy("second_pool:n=2+first", problems=2)
            assert len(records) == 2
        """
    )
    monkeypatch.syspath_prepend(str(pytester.path))
    monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", "dllmbench.testing.doubles,second_plugin")
    from dllmbench.loading.registry import selection

    before = selection()
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.str()
    assert selection() == before
