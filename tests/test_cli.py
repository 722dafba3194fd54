"""Command line: plan, plugins, tasks, run, and one-line user errors with exit status 2."""

from __future__ import annotations

import json

import pytest
from conftest import TOY_RUN, assert_user_error

from dllmbench.cli import main

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
