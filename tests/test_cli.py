"""Command line: plan, plugins, tasks, run, and one-line user errors with exit status 2."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from conftest import TOY_RUN, assert_user_error, cli_subprocess

import dllmbench.cli.tasks
from dllmbench.cli import COMMANDS, build_parser, main
from dllmbench.core.errors import PluginViolation

H1040 = {
    "Vanilla": 128,
    "Majority@8": 1024,
    "ORM Rerank@8": 1032,
    "PRM Guided K=8 b=64": 1040,
    "Oracle@8": 1024,
}
H4160 = {
    "Vanilla": 128,
    "Majority@32": 4096,
    "ORM Rerank@32": 4128,
    "PRM Guided K=32 b=64": 4160,
    "Oracle@32": 4096,
}


def cli_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("budget,expected", [(1040, H1040), (4160, H4160)])
def test_plan_chooses_the_headline_configurations(capsys, budget, expected):
    out = cli_json(capsys, "plan", "--budget", str(budget), "--steps", "128", "--json")
    passes = {m["id"]: m["passes"] for m in out["methods"]}
    for label, cost in expected.items():
        assert passes[label] == cost
    oracle = next(m for m in out["methods"] if m["family"] == "oracle")
    assert oracle["ceiling"] is True
    assert all(m["passes"] <= budget for m in out["methods"])
    assert all(not m["ceiling"] for m in out["methods"] if "Oracle" not in m["id"])


def test_plan_leaves_out_what_does_not_fit_with_its_smallest_budget(capsys):
    out = cli_json(capsys, "plan", "--budget", "200", "--json")
    left = {x["family"]: x["min_budget"] for x in out["left_out"]}
    assert left["top_m"] == 260
    assert "prm_guided" not in left  # K=1 costs 130
    ids = [m["id"] for m in out["methods"]]
    assert "PRM Guided K=1 b=64" in ids and "Majority@1" in ids


@pytest.mark.parametrize(
    "backbone,capped", [("tiny-block", True), ("tiny:threshold=0.9", True), ("tiny", False)]
)
def test_plan_caps_every_method_on_a_backbone_whose_rows_end_early(cli, backbone, capped):
    """A block model, or a confidence threshold, ends rows before their T: `run` records every
    method's cost as a cap, and `plan` says so before any model loads (it showed them exact)."""
    argv = ["plan", "--budget", "272", "--backbone", backbone, "--methods", "vanilla,majority"]
    result = cli(*argv, "--json")
    assert result.code == 0, result.err
    assert [m["capped"] for m in json.loads(result.out)["methods"]] == [capped, capped]


def test_plan_accepts_specs_with_a_free_size(capsys):
    out = cli_json(
        capsys,
        "plan",
        "--budget",
        "1040",
        "--method",
        "prm_guided:k=*,every=16+first",
        "--method",
        "prm_guided:k=*,every=48+first",
        "--json",
    )
    costs = {m["spec"]: m["passes"] for m in out["methods"]}
    assert {m["id"] for m in out["methods"]} == set(costs)  # labelled with the chosen size
    assert costs["prm_guided:k=7,every=16+first"] == 7 * 136
    assert costs["prm_guided:k=7,every=48+first"] == 7 * 131


def test_plugins_lists_every_builtin_with_distribution_and_version(capsys):
    out = cli_json(capsys, "plugins", "--json")
    mine = {(p["kind"], p["name"]) for p in out if p["distribution"] == "dllmbench"}
    assert {
        ("strategy", "independent"),
        ("strategy", "prm_guided"),
        ("strategy", "smc"),
        ("selector", "first"),
        ("selector", "majority"),
        ("selector", "argmax"),
        ("selector", "weighted_majority"),
        ("selector", "random"),
        ("selector", "oracle"),
    } <= mine
    assert all(p["version"] and p["version"] != "unknown" for p in out)


def test_tasks_lists_splits_and_sizes(capsys):
    out = cli_json(capsys, "tasks", "--json")
    toy = next(t for t in out if t["name"] == "toy_sum")
    assert toy["splits"] == {"train": 200, "test": 40}


def test_run_prints_a_leaderboard_and_writes_the_run_directory(capsys, tmp_path):
    argv = [*TOY_RUN, "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ORM Rerank@8" in out and "Δ vs Vanilla" in out
    assert "ceilings (not ranked)" in out and "Oracle@9" in out
    for name in ("manifest.json", "samples.jsonl", "results.json", "leaderboard.md"):
        assert (tmp_path / "r" / name).exists()
    assert main([*argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in results["methods"]] == [
        "Vanilla",
        "Majority@9",
        "ORM Rerank@8",
        "Oracle@9",
    ]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run", "--task", "nope", "--backbone", "toy"], "unknown task 'nope'; known:"),
        (
            ["run", "--task", "toy_sum", "--backbone", "toy", "--methods", "best"],
            "unknown method 'best'",
        ),
        (  # a strategy's name mistyped: the line lists strategies and names the nearest
            ["run", "--task", "toy_sum", "--backbone", "toy", "--method", "independnt"],
            "did you mean 'independent'? families: vanilla",
        ),
        (
            [
                "run",
                "--task",
                "toy_sum",
                "--backbone",
                "toy",
                "--budget",
                "10",
                "--methods",
                "vanilla",
            ],
            "needs a budget of at least 128",
        ),
        (["run", "--task", "toy_sum:colour=red", "--backbone", "toy"], "has no option 'colour'"),
        (
            ["run", "--task", "toy_sum", "--backbone", "toy", "--split", "dev"],
            "no split 'dev'; splits: train, test",
        ),
        (["run", "--backbone", "toy"], "--task is required"),
        (
            [
                "run",
                "--task",
                "toy_sum",
                "--backbone",
                "toy",
                "--method",
                "prm_guided:k=3,keep=2+first",
                "--scorer",
                "prm=toy",
            ],
            "keep=2 must divide k=3",
        ),
        (["plan", "--budget", "0"], "must be a positive integer, got 0"),
        (["plan"], "--budget"),
        (["run", "--task", "toy_sum", "--backbone", "toy", "--steps", "x"], "must be an integer"),
        (
            [
                "run",
                "--task",
                "toy_sum",
                "--backbone",
                "toy",
                "--method",
                "independent:n=4+argmax",
                "--scorer",
                "prm=toy",
            ],
            "needs scorer orm",
        ),
    ],
)
def test_user_errors_are_one_line_with_exit_2(cli, argv, needle):
    assert_user_error(cli(*argv), needle)


BAD_SELECTOR = """
from dllmbench.api.hookspecs import hookimpl


class Minus:
    \"\"\"Returns -1: no candidate.\"\"\"

    needs = ()
    ceiling = False
    config = None

    def select(self, candidates, *, rng, labels=None):
        return -1


@hookimpl
def dllmbench_register_selectors(register):
    register("minus_one", Minus)
"""


@pytest.mark.slow
def test_a_plugin_breaking_its_contract_is_one_line_with_exit_3(tmp_path):
    (tmp_path / "bad_selector.py").write_text(textwrap.dedent(BAD_SELECTOR))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "DLLMBENCH_PLUGIN_MODULES": "dllmbench.testing.doubles,bad_selector",
    }
    argv = ["run", "--task", "toy_sum:size=2", "--backbone", "toy", "--steps", "8"]
    argv += ["--gen-length", "5", "--method", "independent:n=2+minus_one", "--out", tmp_path / "r"]
    result = cli_subprocess(*argv, env=env, cwd=tmp_path)
    assert result.code == PluginViolation.EXIT_CODE == 3, result.err
    assert "Traceback" not in result.err
    errors = [line for line in result.err.splitlines() if "error" in line]  # progress aside
    assert len(errors) == 1 and errors[0].startswith("dllmbench: error: plugin 'minus_one'")
    assert "-1" in errors[0]


def test_plugin_violation_is_printed_as_one_line_by_the_dispatcher(cli, monkeypatch):
    def broken(args):
        raise PluginViolation("pick", "dllmbench-pick", "returned index 9 for a pool of 8")

    monkeypatch.setattr(dllmbench.cli.tasks, "execute", broken)
    result = cli("tasks")
    assert result.code == 3
    assert result.err == (
        "dllmbench: error: plugin 'pick' (from dllmbench-pick) broke its contract: "
        "returned index 9 for a pool of 8\n"
    )


MINIMAL = {
    "run": ["run"],
    "merge": ["merge", "d"],
    "status": ["status", "d"],
    "report": ["report", "d"],
    "plan": ["plan"],
    "plugins": ["plugins"],
    "tasks": ["tasks"],
    "collect": ["collect", "--task", "t", "--backbone", "b", "--out", "o"],
    "train_scorer": ["train-scorer", "--kind", "prm", "--data", "d", "--out", "o"],
    "diagnose": ["diagnose", "c"],
    "demo": ["demo", "retrain", "--out", "o"],
}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.__name__.rsplit(".", 1)[-1])
def test_every_command_is_a_module_with_its_own_parser_and_json(command):
    argv = MINIMAL[command.__name__.rsplit(".", 1)[-1]]
    args = build_parser().parse_args([*argv, "--json"])
    assert args.json
    assert args.execute.__module__ == command.__name__


@pytest.mark.parametrize("argv", [["tasks"], ["plan", "--budget", "208", "--steps", "24"]])
def test_json_before_or_after_the_command_prints_the_same(capsys, argv):
    after = cli_json(capsys, *argv, "--json")
    before = cli_json(capsys, "--json", *argv)
    assert before == after and after


def test_the_sampling_arguments_are_defined_once_and_shared(capsys):
    """run, plan and collect take the same --steps, --gen-length and --prompt."""
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    for name in ("run", "plan", "collect"):
        options = subs[name]._option_string_actions
        assert options["--prompt"].choices == ("chat", "fewshot"), name
        assert "--gen-length" in options and "--steps" in options, name
    for name in ("run", "collect"):  # filled from --preset, or a demo model's own protocol
        assert subs[name].get_default("steps") is None, name


def test_plugins_verbose_shows_options_summary_and_cost(capsys, cli):
    described = {(p["kind"], p["name"]): p for p in cli_json(capsys, "plugins", "-v", "--json")}
    guided = described["strategy", "prm_guided"]
    assert {"name": "k", "type": "int", "default": 8} in guided["options"]
    assert guided["summary"] and "\n" not in guided["summary"]
    assert "k·T" in guided["cost"]
    assert described["backbone", "tiny"]["summary"].startswith("The shipped demo model")
    assert all(p["broken"] is None for p in described.values())

    text = cli("plugins", "--verbose")
    assert text.code == 0, text.err
    assert "strategy prm_guided  (dllmbench" in text.out
    assert "  cost: denoise: k·T" in text.out and "    k: int = 8" in text.out
    assert "3-shot, [BEGIN]/[DONE])" in text.out  # no markup eaten


def test_plugins_verbose_shows_allowed_values_own_docstrings_and_every_family(capsys, cli):
    """A string option with a fixed set of values lists them; each plugin's summary is its
    own docstring, never one its class inherits; every method family, by the name --methods
    takes, with its label."""
    described = {(p["kind"], p["name"]): p for p in cli_json(capsys, "plugins", "-v", "--json")}
    final = {o["name"]: o for o in described["strategy", "prm_guided"]["options"]}["final"]
    assert final == {
        "name": "final",
        "type": "'prune' | 'keep'",
        "choices": ["prune", "keep"],
        "default": "prune",
    }
    dtype = {o["name"]: o for o in described["backbone", "dream"]["options"]}["dtype"]
    assert dtype["choices"] == ["float32", "bfloat16", "float16"]
    assert dtype["type"] == "'float32' | 'bfloat16' | 'float16' | None"
    summaries = {key: p["summary"] for key, p in described.items() if key[0] != "family"}
    assert all(summaries.values()), [k for k, v in summaries.items() if not v]
    assert summaries["scorer", "prm"] != summaries["scorer", "orm"]
    assert "Base of" not in summaries["scorer", "prm"]
    assert summaries["selector", "oracle"].startswith("A ceiling")
    families = {key[1]: p for key, p in described.items() if key[0] == "family"}
    assert {"vanilla", "majority", "prm_guided", "hex", "prism"} <= set(families)

    text = cli("plugins", "--verbose").out
    assert "    final: 'prune' | 'keep' = 'prune'" in text
    assert "    remasking: 'low_confidence' | 'random' = 'low_confidence'" in text
    assert "method families (the names --methods takes" in text
    for name, family in families.items():
        assert f"family {name}  (" in text and f"  label: {family['label']}" in text
    assert cli("plan", "--budget", "1040", "--methods", ",".join(families)).code == 0


def test_an_option_outside_its_allowed_values_is_one_line_naming_them(cli):
    result = cli("plan", "--budget", "1040", "--method", "prm_guided:k=8,every=64,final=x+first")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "'prune'" in result.err and "'keep'" in result.err


@pytest.mark.slow
def test_plugins_lists_a_broken_plugin_with_its_reason_and_still_runs(tmp_path):
    (tmp_path / "needs_extra.py").write_text("raise ImportError('no module named torch_extra')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "DLLMBENCH_PLUGIN_MODULES": "dllmbench.testing.doubles,needs_extra",
    }
    listed = cli_subprocess("plugins", "--json", env=env, cwd=tmp_path)
    assert listed.code == 0, listed.err
    broken = [p for p in json.loads(listed.out) if p["broken"]]
    assert [(p["name"], p["distribution"]) for p in broken] == [
        ("needs_extra", "module:needs_extra")
    ]
    assert "torch_extra" in broken[0]["broken"]
    for argv in (["plugins"], ["plugins", "--verbose"]):
        shown = cli_subprocess(*argv, env={**env, "COLUMNS": "200"}, cwd=tmp_path)
        assert shown.code == 0, shown.err
        assert "broken: plugin 'needs_extra' from module:needs_extra: " in shown.out
        assert "torch_extra" in shown.out and "prm_guided" in shown.out
