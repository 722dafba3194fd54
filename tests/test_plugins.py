"""Plugins: a pip-installed third-party strategy, broken plugins, the allow- and deny-lists,
method families, the namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pip_install, toy_argv

from dllmbench.api.interfaces import (
    KIND_PROTOCOLS,
    contract_configs,
    is_trained,
    missing_members,
    passes_per_step,
)
from dllmbench.cli.plugins import describe_plugins
from dllmbench.core.errors import PluginError, PluginIncomplete, PluginViolation
from dllmbench.execution.planner import available_families, plan
from dllmbench.loading.manager import PluginSelection, collect, load_plugin_manager
from dllmbench.loading.registry import Registry

STRATEGY = '''
"""A third-party strategy: best-of-n with a twist of lineage, for the plugin test."""
from dataclasses import dataclass

from dllmbench.api.hookspecs import hookimpl


@dataclass(frozen=True)
class PairsConfig:
    n: int = 2

    def __post_init__(self):
        if self.n % 2:
            raise ValueError("n must be even")


class Pairs:
    """n samples drawn as n/2 pairs that share their first half of the steps."""

    Config = PairsConfig
    prefix_field = None
    scorers = ()

    def __init__(self, **config):
        self.config = PairsConfig(**config)

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
    return pip_install(root, tmp_path_factory.mktemp("site"))


def _cli(site: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "dllmbench.cli", *argv],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=pythonpath, **env),
        cwd=site,
    )


@pytest.mark.slow
def test_installed_strategy_is_listed_with_its_distribution(third_party):
    out = _cli(third_party, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    plugins = {(p["kind"], p["name"]): p for p in json.loads(out.stdout)}
    assert plugins["strategy", "pairs"]["distribution"] == "dllmbench-pairs"
    assert plugins["strategy", "pairs"]["version"] == "0.3.1"
    assert plugins["strategy", "independent"]["distribution"] == "dllmbench"


@pytest.mark.slow
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


@pytest.mark.slow
def test_allow_list_leaves_out_unlisted_distributions(third_party):
    out = _cli(third_party, "plugins", "--json", DLLMBENCH_PLUGINS="")
    names = {p["name"] for p in json.loads(out.stdout)}
    assert "pairs" not in names and "independent" in names
    out = _cli(third_party, "plugins", "--json", DLLMBENCH_PLUGINS="dllmbench-pairs")
    assert "pairs" in {p["name"] for p in json.loads(out.stdout)}


def _registry(
    tmp_path: Path, monkeypatch, modules: dict[str, str], disable: tuple[str, ...] = ()
) -> Registry:
    """A fresh registry with the doubles and `modules` (name → source) as plugin modules."""
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        sys.modules.pop(name, None)  # each test imports its own module of that name afresh
    monkeypatch.syspath_prepend(str(tmp_path))
    return Registry.load(PluginSelection(("dllmbench.testing.doubles", *modules), None, disable))


CLASH = """
from dllmbench.api.hookspecs import hookimpl
@hookimpl
def dllmbench_register_strategies(register):
    register('independent', object)
"""


def test_a_clash_marks_the_name_broken_naming_both_and_the_rest_works(tmp_path, monkeypatch):
    reg = _registry(tmp_path, monkeypatch, {"clash_a": CLASH})
    [broken] = reg.broken()
    assert (broken.kind, broken.name) == ("strategy", "independent")
    assert "dllmbench (" in broken.reason and "module:clash_a (clash_a)" in broken.reason
    assert "independent" not in reg.names("strategy") and "smc" in reg.names("strategy")
    with pytest.raises(PluginError) as err:
        reg.strategy("independent", n=2)
    assert str(err.value).startswith("strategy 'independent' from dllmbench and module:clash_a")
    assert "is broken: registered by" in str(err.value)
    assert reg.strategy("smc", k=2).pool_size() == 2  # a plugin the clash does not touch


@pytest.mark.slow
def test_a_clash_lets_plugins_run_and_refuses_only_the_command_that_needs_it(tmp_path):
    (tmp_path / "clash_b.py").write_text(
        "from dllmbench.api.hookspecs import hookimpl\n"
        "@hookimpl\ndef dllmbench_register_selectors(register):\n"
        "    register('majority', object)\n"
    )
    out = _cli(tmp_path, "plugins", "--json", DLLMBENCH_PLUGIN_MODULES="clash_b")
    assert out.returncode == 0, out.stderr
    listed = {(p["kind"], p["name"]) for p in json.loads(out.stdout)}
    assert ("selector", "first") in listed and ("strategy", "independent") in listed
    out = _cli(tmp_path, "plan", "--budget", "100", "--methods", "vanilla")
    assert out.returncode == 0, out.stderr
    out = _cli(
        tmp_path,
        "plan",
        "--budget",
        "100",
        "--methods",
        "majority",
        DLLMBENCH_PLUGIN_MODULES="clash_b",
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "selector 'majority' from dllmbench and module:clash_b is broken" in out.stderr


@pytest.mark.parametrize(
    "source,reason",
    [
        ("raise ImportError('no module named torch_extra')", "failed to import: ImportError"),
        (
            "from dllmbench.api.hookspecs import hookimpl\n"
            "@hookimpl\ndef dllmbench_register_strategies(register):\n"
            "    register('beam', object)\n    raise RuntimeError('half registered')\n",
            "dllmbench_register_strategies raised RuntimeError: half registered",
        ),
        (
            "from dllmbench.api.hookspecs import hookimpl\n"
            "@hookimpl\ndef dllmbench_register_strategy(register):\n"
            "    register('beam', object)\n",
            "'dllmbench_register_strategy', which is no dllmbench hook; "
            "did you mean dllmbench_register_strategies?",
        ),
    ],
    ids=["import-error", "hook-raises", "misspelt-hook"],
)
def test_a_broken_module_is_reported_and_named_by_a_command_needing_it(
    tmp_path, monkeypatch, source, reason
):
    reg = _registry(tmp_path, monkeypatch, {"bad_plugin": source})
    [broken] = reg.broken()
    assert (broken.name, broken.kind, broken.distribution) == (
        "bad_plugin",
        None,
        "module:bad_plugin",
    )
    assert reason in broken.reason
    assert "beam" not in reg.names("strategy") and "toy" in reg.names("backbone")
    with pytest.raises(PluginError) as err:
        reg.strategy("beam")
    message = str(err.value)
    assert message.startswith(
        "unknown strategy 'beam'; known: adaptive, ensemble, hex, independent"
    )
    assert "broken: plugin 'bad_plugin' from module:bad_plugin is broken: " in message
    assert reason in message and "\n" not in message


def test_deny_list_leaves_out_a_plugin_and_its_families(tmp_path, monkeypatch):
    reg = _registry(tmp_path, monkeypatch, {}, disable=("smc", "toy_sum"))
    assert "smc" not in reg.names("strategy") and "toy_sum" not in reg.names("task")
    assert "prm_guided" in reg.names("strategy")
    families = available_families(reg, 8)
    assert "smc_vote" not in families and "smc_top" not in families and "vanilla" in families
    with pytest.raises(PluginError, match="strategy 'smc' is disabled by DLLMBENCH_DISABLE"):
        reg.strategy("smc")
    with pytest.raises(PluginError, match="unknown strategy 'smcc'"):
        reg.strategy("smcc")


@pytest.mark.slow
def test_deny_list_takes_a_distribution_and_leaves_it_unloaded(third_party):
    out = _cli(third_party, "plugins", "--json", DLLMBENCH_DISABLE="dllmbench-pairs")
    assert out.returncode == 0, out.stderr
    assert "pairs" not in {p["name"] for p in json.loads(out.stdout)}


@pytest.mark.parametrize(
    "var,value,needle",
    [
        ("DLLMBENCH_DISABLE", "smc,smcc", "DLLMBENCH_DISABLE names 'smcc', which is not installed"),
        ("DLLMBENCH_PLUGINS", "dllmbench-pair", "DLLMBENCH_PLUGINS names 'dllmbench-pair'"),
    ],
)
@pytest.mark.slow
def test_a_typo_in_the_plugin_lists_is_one_line(third_party, var, value, needle):
    out = _cli(third_party, "plugins", **{var: value})
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and needle in out.stderr
    assert "Traceback" not in out.stderr


FAMILY = (
    STRATEGY
    + """

@hookimpl
def dllmbench_register_methods(register):
    register("pairs_vote", spec="pairs:n=*+majority", label="Pairs Vote@{n}")
"""
)


def test_a_registered_family_joins_all_with_its_label(tmp_path, monkeypatch):
    reg = _registry(tmp_path, monkeypatch, {"pairs_family": FAMILY})
    family = reg.family("pairs_vote")
    assert family is not None and family.distribution == "module:pairs_family"
    assert [f.name for f in reg.families()][:2] == ["vanilla", "majority"]  # built-ins first
    chosen = plan(reg, 72, 8, ["all"], scorers=set())
    ids = [p.method.id for p in chosen.methods]
    assert "Pairs Vote@12" in ids and "Majority@9" in ids  # 6·4 + 12·4 = 72
    assert [p.method.family for p in chosen.methods if p.method.id == "Pairs Vote@12"] == [
        "pairs_vote"
    ]
    needs = {x.family: x for x in chosen.left_out}
    assert needs["orm_rerank"].reason == "needs scorer orm" and needs["orm_rerank"].missing == ()
    assert plan(reg, 72, 8, scorers=set()).as_dict() == chosen.as_dict()  # no entries: all


@pytest.mark.slow
def test_methods_all_runs_a_third_party_family_onto_the_leaderboard(tmp_path):
    (tmp_path / "pairs_family.py").write_text(FAMILY)
    out = _cli(
        tmp_path,
        "run",
        "--task",
        "toy_sum:size=2",
        "--backbone",
        "toy",
        "--steps",
        "8",
        "--gen-length",
        "5",
        "--budget",
        "72",
        "--methods",
        "all",
        "--out",
        str(tmp_path / "r"),
        "--json",
        DLLMBENCH_PLUGIN_MODULES="dllmbench.testing.doubles,pairs_family",
    )
    assert out.returncode == 0, out.stderr
    ids = [m["id"] for m in json.loads(out.stdout)["methods"]]
    assert "Pairs Vote@12" in ids and "Vanilla" in ids
    assert "Pairs Vote@12" in (tmp_path / "r" / "leaderboard.md").read_text()


def test_a_family_needing_a_missing_plugin_is_an_error_only_when_named(tmp_path, monkeypatch):
    source = """
    from dllmbench.api.hookspecs import hookimpl
    @hookimpl
    def dllmbench_register_methods(register):
        register("beam", spec="beam:k=*+first", label="Beam K={k}")
    """
    reg = _registry(tmp_path, monkeypatch, {"beam_family": source})
    assert "beam" not in available_families(reg, 8)
    with pytest.raises(PluginError, match="unknown strategy 'beam'"):
        plan(reg, 72, 8, ["beam"])


@pytest.mark.slow
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


DESCRIBED = '''
"""Plugins of every shape, for describe_plugins and the Protocol check."""
from dataclasses import dataclass

from dllmbench.api.hookspecs import hookimpl


class Half:
    """Half a strategy: it forgot pool_scores."""

    scorers = ()
    prefix_field = None

    def cost(self, total_steps):
        """denoise: 2·T (two samples)

        More words that the listing leaves out.
        """
        return {"denoise": 2 * total_steps}

    def pool_size(self):
        return 2

    async def search(self, problem, ops):
        return ops.pool(await ops.denoise(ops.start(problem, copies=2), ops.T))


def pick_last(*, offset: int = 0, scorer: str | None = None):
    """The last candidate, from a plain function factory."""
    raise ValueError("not built in this test")


@hookimpl
def dllmbench_register_strategies(register):
    register("half", Half)


@hookimpl
def dllmbench_register_selectors(register):
    register("pick_last", pick_last)
'''


def _described(reg: Registry) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["name"]): d for d in describe_plugins(reg)}


def test_describe_plugins_gives_options_summary_and_cost(tmp_path, monkeypatch):
    reg = _registry(tmp_path, monkeypatch, {"described": DESCRIBED, "bad_one": "1/0"})
    plugins = _described(reg)
    independent = plugins["strategy", "independent"]
    assert independent["summary"].startswith("N samples, each T steps.")
    assert independent["options"] == [{"name": "n", "type": "int", "default": 1}]
    assert independent["cost"] == "denoise: n·T" and independent["broken"] is None
    assert plugins["strategy", "prm_guided"]["cost"] == (
        "denoise: k·T; score:<scorer>: k·ceil(T / every)"
    )
    assert {
        "name": "final",
        "type": "'prune' | 'keep'",
        "choices": ["prune", "keep"],
        "default": "prune",
    } in (plugins["strategy", "prm_guided"]["options"])
    checkpoint = plugins["scorer", "prm"]["options"][0]
    assert checkpoint == {"name": "checkpoint", "type": "str | None", "default": None}
    assert plugins["strategy", "half"]["cost"] == "denoise: 2·T (two samples)"  # the docstring
    assert plugins["selector", "pick_last"]["summary"] == (
        "The last candidate, from a plain function factory."
    )
    assert plugins["selector", "pick_last"]["options"] == [
        {"name": "offset", "type": "int", "default": 0},
        {"name": "scorer", "type": "str | None", "default": None},
    ]
    assert "cost" not in plugins["selector", "first"]
    broken = plugins["plugin", "bad_one"]
    assert broken["broken"] == "failed to import: ZeroDivisionError: division by zero"
    json.dumps(describe_plugins(reg))  # plain data, for --json


def test_a_built_plugin_missing_a_protocol_member_is_its_fault_in_one_line(
    tmp_path, monkeypatch, cli
):
    """A member its kind's Protocol lacks is the plugin's broken contract: exit status 3, as
    any plugin's fault, not a user error."""
    reg = _registry(tmp_path, monkeypatch, {"described_b": DESCRIBED})
    with pytest.raises(PluginIncomplete) as err:
        reg.strategy("half")
    line = (
        "strategy 'half' from module:described_b does not implement "
        "dllmbench.interfaces.SearchStrategy: it lacks pool_scores"
    )
    assert str(err.value) == line
    assert isinstance(err.value, PluginViolation) and not isinstance(err.value, PluginError)
    assert reg.check("strategy", "half") is None  # options alone are fine: no Config
    monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", "dllmbench.testing.doubles,described_b")
    argv = ["run", *toy_argv(2)[1:], "--method", "half+first", "--budget", "16"]
    result = cli(*argv, "--out", tmp_path / "run")
    assert (result.code, result.err.strip()) == (3, f"dllmbench: error: {line}")


TWICE = """
from dllmbench.api.hookspecs import hookimpl
from dllmbench.testing.doubles import ToySum


class Twice(ToySum):
    def problems(self, split):
        first = super().problems(split)
        return [*first, first[0]]


class Crashes(ToySum):
    def problems(self, split):
        raise KeyError(split)


@hookimpl
def dllmbench_register_tasks(register):
    register("twice", Twice)
    register("crashes", Crashes)
"""


@pytest.mark.parametrize(
    ("task", "line"),
    [
        (
            "twice",
            "plugin 'twice' (from module:twice_tasks) broke its contract: its 'test' split "
            "repeats the problem id 'test-0' (ids are unique)",
        ),
        (
            "crashes",
            "task 'crashes' (from module:twice_tasks) raised KeyError: 'test' "
            "(at twice_tasks.py:14) "
            "(--debug shows the traceback)",
        ),
    ],
)
def test_a_task_whose_problems_break_its_contract_is_its_fault_in_one_line(
    tmp_path, monkeypatch, cli, task, line
):
    """Problem ids that repeat, or `problems()` raising, are the task plugin's fault: one line,
    exit status 3, before any model loads (not a traceback, not a run that writes twice)."""
    _registry(tmp_path, monkeypatch, {"twice_tasks": TWICE})
    monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", "dllmbench.testing.doubles,twice_tasks")
    argv = toy_argv(3, prm=False)
    argv[argv.index("toy_sum:size=3")] = f"{task}:size=3"
    methods = ("--methods", "vanilla,orm_rerank", "--budget", "72")
    result = cli(*argv, *methods, "--out", tmp_path / "run")
    last = result.err.strip().splitlines()[-1]  # after the progress line, if the run began
    assert (result.code, last) == (3, f"dllmbench: error: {line}")
    assert "Traceback" not in result.err


def test_every_builtin_factory_meets_the_protocols_it_claims():
    reg = Registry.from_collected(collect(load_plugin_manager()))
    for kind in ("strategy", "selector", "task"):
        for name in reg.names(kind):
            factory = reg.info(kind, name).factory
            for config in contract_configs(factory):
                built = reg.build(kind, name, **config)  # the registry's Protocol check
                assert missing_members(built, KIND_PROTOCOLS[kind]) == []
    llada = reg.check("backbone", "llada", cfg_scale=1.0)
    assert passes_per_step(llada) == 2 and passes_per_step(reg.check("backbone", "dream")) == 1
    assert is_trained(reg.check("scorer", "prm")) is False


@pytest.mark.slow
def test_a_family_a_clash_breaks_is_left_out_with_the_reason_and_families_are_listed(tmp_path):
    """`all` never drops a family in silence: one whose selector a clash broke is listed
    under "left out" with the reason; `dllmbench plugins` lists the families, their labels
    and cost formulas, and marks that one broken."""
    (tmp_path / "clash_c.py").write_text(
        "from dllmbench.api.hookspecs import hookimpl\n"
        "@hookimpl\ndef dllmbench_register_selectors(register):\n"
        "    register('majority', object)\n"
    )
    out = _cli(tmp_path, "plan", "--budget", "208", "--json", DLLMBENCH_PLUGIN_MODULES="clash_c")
    assert out.returncode == 0, out.stderr
    left = {x["family"]: x["reason"] for x in json.loads(out.stdout)["left_out"]}
    assert "selector 'majority' is not available" in left["majority"]
    assert "is broken" in left["hex"]
    listed = _cli(tmp_path, "plugins", "--json", DLLMBENCH_PLUGIN_MODULES="clash_c")
    families = {p["name"]: p for p in json.loads(listed.stdout) if p["kind"] == "family"}
    assert families["hex"]["label"] == "HEX@{n}" and families["hex"]["broken"]
    assert families["orm_rerank"]["cost"] == "denoise: n·T" and not families["orm_rerank"]["broken"]
    assert families["prism"]["cost"].startswith("denoise: Σ_k width_k")
    table = _cli(tmp_path, "plugins")
    assert "method families" in table.stdout and "orm_rerank" in table.stdout


FAMILIES = {
    "fam_plugins": """
from dllmbench.api.hookspecs import hookimpl


@hookimpl
def dllmbench_register_selectors(register):
    register("loud", object)
    raise RuntimeError("no speaker")


@hookimpl
def dllmbench_register_methods(register):
    register("beam", spec="beam:k=*+first", label="Beam K={k}")  # strategy: beam_strategy
    register("loud", spec="independent:n=*+loud", label="Loud@{n}")
    register("weird", spec="independent:n=*+first+x", label="Weird@{n}")
    register("oracle", spec="independent:n=*+first", label="Mine@{n}")  # a built-in's name
""",
    "beam_strategy": "raise ImportError('no module named torch_extra')\n",
    "clash_sel": """
from dllmbench.api.hookspecs import hookimpl


@hookimpl
def dllmbench_register_selectors(register):
    register("majority", object)
""",
}

# family → what its line says: its strategy missing (module failed to import), its selector
# missing (hook raised), its selector clashing, its spec unreadable, its own name clashing
LEFT_OUT = {
    "beam": (
        "strategy 'beam' is not available: unknown strategy 'beam'; known: ",
        "broken: plugin 'beam_strategy' from module:beam_strategy is broken: failed to import: "
        "ImportError: no module named torch_extra",
    ),
    "loud": (
        "selector 'loud' is not available: unknown selector 'loud'",
        "dllmbench_register_selectors raised RuntimeError: no speaker",
    ),
    "majority": (
        "selector 'majority' is not available: selector 'majority' from dllmbench and "
        "module:clash_sel is broken: registered by",
    ),
    "weird": ("its spec 'independent:n=*+first+x' does not parse: method spec",),
    "oracle": ("registered by dllmbench (dllmbench.plugins.methods) and module:fam_plugins",),
}


@pytest.fixture
def broken_families(tmp_path, monkeypatch, registry_with) -> Registry:
    """The doubles and FAMILIES as plugins: a family of each way to be unusable."""
    for name, text in FAMILIES.items():
        (tmp_path / f"{name}.py").write_text(text)
        sys.modules.pop(name, None)
    monkeypatch.syspath_prepend(str(tmp_path))
    return registry_with(*FAMILIES)


def test_describe_plugins_lists_families_with_label_cost_and_why_broken(broken_families):
    families = {d["name"]: d for d in describe_plugins(broken_families) if d["kind"] == "family"}
    vanilla = families["vanilla"]
    assert (vanilla["label"], vanilla["spec"]) == ("Vanilla", "independent:n=1+first")
    assert (vanilla["cost"], vanilla["broken"], vanilla["distribution"]) == (
        "denoise: n·T",
        None,
        "dllmbench",
    )
    assert families["smc_vote"]["cost"] == "denoise: k·T; score:<scorer>: k·ceil(T / every)"
    assert families["beam"]["distribution"] == "module:fam_plugins"
    for name, needles in LEFT_OUT.items():
        assert families[name]["broken"] is not None, name
        assert all(n in families[name]["broken"] for n in needles), families[name]["broken"]
    # a broken selector leaves the strategy's formula known; no strategy, no formula
    assert families["majority"]["cost"] == families["loud"]["cost"] == "denoise: n·T"
    assert families["beam"]["cost"] is families["weird"]["cost"] is None
    assert not [d for d in describe_plugins(broken_families) if d["kind"] == "method family"]
    json.dumps(describe_plugins(broken_families))


def test_plugins_command_shows_families_in_its_table_and_json(broken_families, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    shown = cli("plugins")
    assert shown.code == 0, shown.err
    assert "method families" in shown.out
    assert any(
        "│ vanilla" in line and "Vanilla" in line and "n·T" in line
        for line in shown.out.splitlines()
    )
    assert "broken: family 'beam' from module:fam_plugins: strategy 'beam' is not" in shown.out
    listed = json.loads(cli("plugins", "--json").out)
    families = {e["name"]: e for e in listed if e["kind"] == "family"}
    version = next(e["version"] for e in listed if e["name"] == "independent")
    assert families["prm_guided"] == {
        "kind": "family",
        "name": "prm_guided",
        "distribution": "dllmbench",
        "version": version,
        "module": "dllmbench.plugins.methods",
        "label": "PRM Guided K={k} b={every}",
        "spec": "prm_guided:k=*,every={half},final=keep+argmax:scorer=prm",
        "cost": "denoise: k·T; score:<scorer>: k·ceil(T / every)",
        "broken": None,
    }
    assert version not in ("", "unknown") and families["beam"]["version"] == "local"
    assert families["oracle"]["broken"].startswith("registered by dllmbench")
    assert families["hybrid_oracle"]["broken"] is None


def test_plan_and_run_list_every_unusable_family_under_left_out(broken_families, cli, tmp_path):
    planned = cli("plan", "--budget", "1040", "--json")
    assert planned.code == 0, planned.err
    left_out = {x["family"]: x["reason"] for x in json.loads(planned.out)["left_out"]}
    for name, needles in LEFT_OUT.items():
        assert all(n in left_out.get(name, "") for n in needles), (name, left_out.get(name))
    shown = cli("plan", "--budget", "1040")
    lines = [line for line in shown.out.splitlines() if line.startswith("left out: ")]
    assert {line.split(" — ")[0].removeprefix("left out: ") for line in lines} >= set(LEFT_OUT)
    run = cli(
        "run", "--task", "toy_sum:size=1", "--backbone", "toy", "--steps", "4",
        "--gen-length", "5", "--budget", "8", "--resamples", "10", "--out", tmp_path / "r",
    )  # fmt: skip
    assert run.code == 0, run.err
    assert "left out: beam — strategy 'beam' is not available" in run.out
    assert "left out: oracle — method family 'oracle' from dllmbench and module:fam_pl" in run.out
    named = cli("plan", "--budget", "1040", "--methods", "weird")
    assert named.code == 2 and len(named.err.strip().splitlines()) == 1, named.err
    assert "method family 'weird': its spec 'independent:n=*+first+x' does not parse" in named.err
