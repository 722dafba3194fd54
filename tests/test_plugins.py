"""Plugins: a pip-installed third-party strategy, clashes, the allow-list, the namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dllmbench.errors import PluginError
from dllmbench.manager import collect, load_plugin_manager
from dllmbench.registry import Registry

STRATEGY = '''
"""A third-party strategy: best-of-n with a twist of lineage, for the plugin test."""
from dataclasses import dataclass

from dllmbench.hookspecs import hookimpl


@dataclass(frozen=True)
class PairsConfig:
    n: int = 2


class Pairs:
    """n samples drawn as n/2 pairs that share their first half of the steps."""

    Config = PairsConfig
    prefix_field = None
    scorers = ()

    def __init__(self, **config):
        self.config = PairsConfig(**config)
        if self.config.n % 2:
            raise ValueError("n must be even")

    def cost(self, total_steps):
        half = total_steps // 2
        n = self.config.n
        return {"denoise": n // 2 * half + n * (total_steps - half)}

    def pool_size(self):
        return self.config.n

    def pool_scores(self):
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=self.config.n // 2)
        rows = await ops.denoise(rows, ops.T // 2)
        rows = await ops.denoise(rows.repeat(2), ops.T - ops.T // 2)
        return ops.pool(rows)


@hookimpl
def dllmbench_register_strategies(register):
    register("pairs", Pairs)
'''


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def third_party(tmp_path_factory) -> Path:
    """Build and pip-install a throwaway package into its own target folder."""
    root = tmp_path_factory.mktemp("pkg")
    (root / "dllmbench_pairs").mkdir()
    (root / "dllmbench_pairs" / "__init__.py").write_text(STRATEGY)
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "dllmbench-pairs"
        version = "0.3.1"

        [project.entry-points.dllmbench]
        pairs = "dllmbench_pairs"
    """)
    )
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(root),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def _cli(site: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "dllmbench.cli", *argv],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=pythonpath, **env),
        cwd=site,
    )


def test_installed_strategy_is_listed_with_its_distribution(third_party):
    out = _cli(third_party, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    plugins = {(p["kind"], p["name"]): p for p in json.loads(out.stdout)}
    assert plugins["strategy", "pairs"]["distribution"] == "dllmbench-pairs"
    assert plugins["strategy", "pairs"]["version"] == "0.3.1"
    assert plugins["strategy", "independent"]["distribution"] == "dllmbench"


def test_installed_strategy_runs_and_is_charged(third_party, tmp_path):
    out = _cli(
        third_party,
        "run",
        "--task",
        "toy_sum:size=3",
        "--backbone",
        "toy",
        "--steps",
        "8",
        "--gen-length",
        "5",
        "--budget",
        "72",
        "--methods",
        "vanilla,majority",
        "--method",
        "pairs:n=*+majority",
        "--out",
        str(tmp_path / "r"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    pairs = next(m for m in results["methods"] if m["spec"].startswith("pairs"))
    assert pairs["spec"] == "pairs:n=12+majority"  # 6·4 + 12·4 = 72; n=14 costs 84
    assert pairs["passes_per_problem"] == pairs["planned_passes"] <= 72
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    mine = next(m for m in manifest["methods"] if m["spec"].startswith("pairs"))
    assert mine["strategy"]["distribution"] == "dllmbench-pairs"


def test_allow_list_leaves_out_unlisted_distributions(third_party):
    out = _cli(third_party, "plugins", "--json", DLLMBENCH_PLUGINS="")
    names = {p["name"] for p in json.loads(out.stdout)}
    assert "pairs" not in names and "independent" in names
    out = _cli(third_party, "plugins", "--json", DLLMBENCH_PLUGINS="dllmbench-pairs")
    assert "pairs" in {p["name"] for p in json.loads(out.stdout)}


def test_two_plugins_with_one_name_is_an_error_naming_both(tmp_path, monkeypatch):
    (tmp_path / "clash_a.py").write_text(
        "from dllmbench.hookspecs import hookimpl\n"
        "@hookimpl\ndef dllmbench_register_strategies(register):\n"
        "    register('independent', object)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", "clash_a")
    with pytest.raises(PluginError) as err:
        Registry(collect(*load_plugin_manager()))
    message = str(err.value)
    assert "strategy 'independent'" in message
    assert "dllmbench (" in message and "module:clash_a" in message


def test_clash_reaches_the_user_as_one_line(tmp_path):
    (tmp_path / "clash_b.py").write_text(
        "from dllmbench.hookspecs import hookimpl\n"
        "@hookimpl\ndef dllmbench_register_selectors(register):\n"
        "    register('majority', object)\n"
    )
    out = _cli(tmp_path, "plugins", DLLMBENCH_PLUGIN_MODULES="clash_b")
    assert out.returncode == 2
    assert (
        out.stderr.count("\n") == 1 and "two plugins register the selector 'majority'" in out.stderr
    )


def test_one_namespace_and_no_bare_top_level_packages(tmp_path):
    code = (
        "import importlib.util, dllmbench, dllmbench.plugins, dllmbench.tasks;"
        "print([importlib.util.find_spec(n) is None for n in ('harness','plugins','tasks')])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(PYTHONPATH=""),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[True, True, True]"


def test_core_imports_no_builtin_plugin_outside_the_registration_list():
    core = Path(__file__).resolve().parents[1] / "harness"
    offenders = []
    for path in core.rglob("*.py"):
        text = path.read_text()
        if "dllmbench.plugins." in text and path.name != "manager.py":
            offenders.append(path.name)
    assert offenders == []
