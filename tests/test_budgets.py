"""Several budgets in one run: every family planned at each budget, shared methods run once,
each budget's results those of a run at that budget alone, the leaderboard grouped by budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TOY_RUN, assert_user_error, snapshot

from dllmbench.cli import build_parser
from dllmbench.cli.run import DEMO, run_config
from dllmbench.execution.planner import default_budget, plan
from dllmbench.loading.registry import registry

SMALL, LARGE = 72, 288  # the toy run's budget and four times it (T = 8)


def toy(*budget: str) -> list[str]:
    """TOY_RUN with its `--budget` replaced (or dropped, with no argument)."""
    argv = list(TOY_RUN)
    at = argv.index("--budget")
    del argv[at : at + 2]
    return argv + (["--budget", ",".join(budget)] if budget else [])


def read(run: Path) -> tuple[dict, list[dict], dict]:
    manifest = json.loads((run / "manifest.json").read_text())
    records = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    return manifest, records, json.loads((run / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The toy run at both budgets in one directory, and at each budget alone."""
    from dllmbench.cli import main

    base = tmp_path_factory.mktemp("budgets")
    out = {}
    for name, budget in [
        ("both", f"{LARGE},{SMALL}"),
        ("small", str(SMALL)),
        ("large", str(LARGE)),
    ]:
        out[name] = base / name
        assert main([*toy(budget), "--out", str(out[name])]) == 0
    return out


def test_a_method_planned_at_both_budgets_runs_once_and_carries_both(runs):
    manifest, records, _ = read(runs["both"])
    assert manifest["budget"] == LARGE and manifest["budgets"] == [SMALL, LARGE]
    planned = {m["id"]: m["budgets"] for m in manifest["methods"]}
    assert planned == {
        "Vanilla": [SMALL, LARGE],
        "Majority@9": [SMALL],
        "Majority@36": [LARGE],
        "ORM Rerank@8": [SMALL],
        "ORM Rerank@32": [LARGE],
        "Oracle@9": [SMALL],
        "Oracle@36": [LARGE],
    }
    pairs = [(r["problem"], r["method"]) for r in records]
    assert len(pairs) == len(set(pairs)) == 4 * len(planned)  # one record per (problem, method)
    for r in records:
        assert r["budgets"] == planned[r["method"]]


def test_the_independent_pool_is_generated_once_at_its_largest_size(runs):
    """Vanilla, @8, @9, @32 and @36 share one pool of 36 rows per problem: 4 problems × 36
    rows × T = 8 steps, not one pool per budget."""
    compute = json.loads((runs["both"] / "compute.json").read_text())
    [invocation] = compute["invocations"]
    assert invocation["physical"]["denoise"]["rows"] == 4 * 36 * 8
    alone = json.loads((runs["small"] / "compute.json").read_text())["invocations"][0]
    assert alone["physical"]["denoise"]["rows"] == 4 * 9 * 8


def _decisions(records: list[dict]) -> dict[tuple[str, str], tuple]:
    return {
        (r["problem"], r["method"]): (
            r["selected"],
            r["correct"],
            [(c["text"], c["key"], c["correct"], c["lineage"]) for c in r["candidates"]],
            r["ledger"]["passes"],
        )
        for r in records
    }


@pytest.mark.parametrize("alone,budget", [("small", SMALL), ("large", LARGE)])
def test_each_budget_has_the_results_of_a_run_at_that_budget_alone(runs, alone, budget):
    _, records, results = read(runs["both"])
    _, single_records, single = read(runs[alone])
    assert results["budgets"] == [SMALL, LARGE] and single["budgets"] == [budget]
    at = [m for m in results["methods"] if m["budget"] == budget]
    assert [m["id"] for m in at] == [m["id"] for m in single["methods"]]
    assert at == single["methods"]  # accuracy, intervals, pool, paired differences, share
    both = _decisions(records)
    for key, decision in _decisions(single_records).items():
        assert both[key] == decision


def test_a_shared_method_has_its_share_of_each_budget(runs):
    _, _, results = read(runs["both"])
    vanilla = [m for m in results["methods"] if m["id"] == "Vanilla"]
    assert [m["budget"] for m in vanilla] == [SMALL, LARGE]
    assert [m["share_of_budget"] for m in vanilla] == [round(8 / SMALL, 6), round(8 / LARGE, 6)]
    assert vanilla[0]["accuracy"] == vanilla[1]["accuracy"]


def test_the_leaderboard_has_a_section_per_budget_each_with_the_reference(runs):
    text = (runs["both"] / "leaderboard.md").read_text()
    assert text.startswith("# toy_sum (test, 4 problems) · toy · budgets 72, 288\n")
    small, large = text.split("## Budget 72\n", 1)[1].split("## Budget 288\n")
    assert "| Vanilla |" in small and "| Vanilla |" in large
    assert "Majority@9 " in small and "Majority@36" not in small
    assert "Majority@36 " in large and "Majority@9 " not in large
    assert "Ceilings" in small and "Ceilings" in large
    # a run at one budget keeps its single table
    single = (runs["small"] / "leaderboard.md").read_text()
    assert "## Budget" not in single and "· budget 72\n" in single


def test_the_run_prints_a_table_per_budget(cli, tmp_path):
    result = cli(*toy(f"{SMALL},{LARGE}"), "--out", tmp_path / "r")
    assert result.code == 0, result.err
    assert "budget 72 passes/problem" in result.out and "budget 288 passes/problem" in result.out
    assert result.out.index("Majority@9") < result.out.index("Majority@36")


def test_a_resume_keeps_the_runs_budgets(cli, tmp_path):
    out = tmp_path / "r"
    assert cli(*toy(f"{SMALL},{LARGE}"), "--out", out).code == 0
    before = snapshot(out)
    refused = cli(*toy(str(SMALL)), "--out", out)
    assert_user_error(refused, "--budget 72,288", "not --budget 72")
    refused = cli(*toy(f"{SMALL},{LARGE},1000"), "--out", out)
    assert_user_error(refused, "--budget 72,288", "not --budget 72,288,1000")
    assert snapshot(out) == before
    for argv in (toy(), toy(f"{LARGE},{SMALL}")):  # no --budget, or the same list in any order
        resumed = cli(*argv, "--out", out)
        assert resumed.code == 0, resumed.err
        assert "0 records written, 28 resumed" in resumed.out.replace("\n", " ")
    assert json.loads((out / "results.json").read_text())["budgets"] == [SMALL, LARGE]


@pytest.mark.parametrize(
    "value,needle",
    [
        ("0", "must be a positive integer, got 0"),
        ("10,abc", "must be an integer, got 'abc' in '10,abc'"),
        ("72,,288", "got '' in '72,,288'"),
        ("72,0", "must be a positive integer, got 0 in '72,0'"),
        ("72,288,72", "lists 72 twice"),
    ],
)
@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_bad_budget_list_is_one_line(cli, tmp_path, value, needle, command):
    argv = toy(value) if command == "run" else ["plan", "--steps", "8", "--budget", value]
    result = cli(*argv, "--out", tmp_path / "r") if command == "run" else cli(*argv)
    assert_user_error(result, "argument --budget", needle)
    assert not (tmp_path / "r").exists()


def test_a_budget_no_method_fits_is_named(cli, tmp_path):
    result = cli(*toy(f"3,{SMALL}"), "--out", tmp_path / "r")
    assert_user_error(result, "no method fits budget 3", "vanilla: does not fit 3 passes")


def test_plan_lists_each_budget(cli):
    result = cli("plan", "--steps", "8", "--budget", "288,72", "--methods", "vanilla,majority")
    assert result.code == 0, result.err
    assert "budget of 72 passes" in result.out and "budget of 288 passes" in result.out
    data = json.loads(
        cli(
            "plan", "--steps", "8", "--budget", "72,288", "--methods", "vanilla,majority", "--json"
        ).out
    )
    assert data["budget"] == LARGE and data["budgets"] == [SMALL, LARGE]
    assert [(m["id"], m["budgets"], m["share"]) for m in data["methods"]] == [
        ("Vanilla", [SMALL, LARGE], round(8 / SMALL, 4)),
        ("Majority@9", [SMALL], 1.0),
        ("Majority@36", [LARGE], 1.0),
    ]


def test_the_planner_merges_identical_methods_and_keeps_entry_order():
    chosen = plan(registry(), [SMALL, LARGE], 8, ["majority", "vanilla"])
    assert [(p.method.id, p.budgets) for p in chosen.methods] == [
        ("Majority@9", [SMALL]),
        ("Majority@36", [LARGE]),
        ("Vanilla", [SMALL, LARGE]),
    ]
    assert [p.method.id for p in chosen.at(LARGE)] == ["Majority@36", "Vanilla"]
    one = plan(registry(), SMALL, 8, ["majority", "vanilla"])
    assert one.budgets == [SMALL] and [p.budgets for p in one.methods] == [[SMALL], [SMALL]]


def test_the_demo_runs_at_its_budget_and_four_times_it():
    args = build_parser().parse_args(["run"])
    cfg = run_config(args)
    budget = default_budget(DEMO["steps"])
    assert cfg.budgets() == [budget, 4 * budget]
    assert cfg.run_dir().name == f"arith-tiny-b{budget}+{4 * budget}-seed0"
    explicit = run_config(build_parser().parse_args(["run", "--budget", str(budget)]))
    assert explicit.budgets() == [budget]
    # a FLOP budget names the directory as it is typed (it was `bFlops(1000000000)`)
    flops = run_config(build_parser().parse_args(["run", "--budget", "1e9flops,2.5e12flops"]))
    assert flops.run_dir().name == "arith-tiny-b1e9flops+2.5e12flops-seed0"
    # the README's `run --limit 100` after the demo is a run of its own, not the demo refused;
    # the demo's own 40, given or not, is the demo
    hundred = run_config(build_parser().parse_args(["run", "--limit", "100"]))
    assert hundred.run_dir().name == f"arith-tiny-b{budget}+{4 * budget}-seed0-n100"
    forty = run_config(build_parser().parse_args(["run", "--limit", "40"]))
    assert forty.run_dir() == cfg.run_dir() and forty.limit == cfg.limit == 40
    argv = ["run", "--task", "arith", "--backbone", "tiny", "--budget", "64", "--limit", "7"]
    assert run_config(build_parser().parse_args(argv)).run_dir().name == "arith-tiny-b64-seed0-n7"


FAULTS = """
import resource, sys
import torch
from dllmbench.running.allocator import keep_freed_memory

kept = keep_freed_memory() if sys.argv[1] == "kept" else True
torch.set_num_threads(1)


def forward():  # a forward holds several blocks at once, then frees them all
    blocks = [torch.empty(8 << 18).fill_(1.0) for _ in range(6)]  # 6 x 8 MiB
    del blocks


forward(), forward()  # the heap grows to its size
before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
for _ in range(10):
    forward()
print(kept, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
"""


@pytest.mark.slow
def test_freed_memory_is_kept_for_the_next_forward():
    """On Linux with glibc the thresholds are raised: blocks a forward held together and freed
    stay mapped, so ten more forwards fault in fewer pages than one forward's blocks hold
    (glibc's defaults, whose trim threshold follows the last freed mmap, trimmed them away in
    most runs here: up to 122,560 pages, every block of every forward, though not in every run,
    as it depends on the heap's layout). Measured in a fresh interpreter: the heap an earlier
    test left behind decides what is trimmed, so an in-process count depends on test order."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FAULTS, "kept"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True"  # the thresholds were set
    one_forward = 6 * (8 << 20) // 4096
    assert int(out[1]) < one_forward  # ten forwards, not 10 × 12,288 pages faulted in again


def _config(out: Path, **changes):
    import dataclasses

    cfg = run_config(build_parser().parse_args([*toy(f"{SMALL},{LARGE}"), "--out", str(out)]))
    return dataclasses.replace(cfg, **changes)


def test_budget_by_budget_decides_as_every_budget_at_once(runs, tmp_path):
    """The default serves the smaller budget first and reuses its rows; served all at once
    instead, the run makes the same records and computes the same denoising rows."""
    from dllmbench.running.runner import run

    run(_config(tmp_path / "together", by_budget=False))
    _, phased, _ = read(runs["both"])
    _, together, _ = read(tmp_path / "together")
    assert _decisions(phased) == _decisions(together)
    rows = [
        json.loads((path / "compute.json").read_text())["total"]["physical"]["denoise"]["rows"]
        for path in (runs["both"], tmp_path / "together")
    ]
    assert rows[0] == rows[1] == 4 * 36 * 8


def test_the_smaller_budgets_results_come_before_the_larger_budgets_work(tmp_path):
    """The first problem is served whole (every method at every budget); then the smaller
    budget on every other problem, its table, and the larger budget's work after it."""
    from dllmbench.running.runner import run

    events: list[tuple[str, object]] = []
    outcome = run(
        _config(tmp_path / "r"),
        on_record=lambda r: events.append(("record", (r["problem"], r["method"]))),
        on_budget=lambda results, budget: events.append(("table", (results, budget))),
    )
    tables = [i for i, (kind, _) in enumerate(events) if kind == "table"]
    assert len(tables) == 1  # the larger budget's table is the run's own, at the end
    results, budget = events[tables[0]][1]
    assert budget == SMALL
    first_planned = {p.method.id: min(p.budgets) for p in outcome.plan.methods}
    records = [record for kind, record in events if kind == "record"]
    first = records[0][0]
    whole = len(first_planned)
    assert {p for p, _ in records[:whole]} == {first}  # the first problem, every method
    assert {m for _, m in records[:whole]} == set(first_planned)
    before = {m for kind, (p, m) in events[: tables[0]] if kind == "record" and p != first}
    after = [(p, m) for kind, (p, m) in events[tables[0] :] if kind == "record"]
    assert {first_planned[m] for m in before} == {SMALL}
    assert {first_planned[m] for _, m in after} == {LARGE}
    assert first not in {p for p, _ in after}
    # that early table is the final one at the smaller budget
    final = [m for m in outcome.results["methods"] if m["budget"] == SMALL]
    early = [m for m in results["methods"] if m["budget"] == SMALL]
    assert early == final


def test_the_early_table_is_printed_once_and_never_into_json(cli, tmp_path):
    shown = cli(*toy(f"{SMALL},{LARGE}"), "--out", tmp_path / "a")
    assert shown.code == 0, shown.err
    assert shown.out.count(f"budget {SMALL} passes/problem") == 1
    assert shown.out.count(f"budget {LARGE} passes/problem") == 1
    assert shown.out.index(f"budget {SMALL} ") < shown.out.index(f"budget {LARGE} ")
    as_json = cli("--json", *toy(f"{SMALL},{LARGE}"), "--out", tmp_path / "b")
    assert as_json.code == 0 and json.loads(as_json.out)["budgets"] == [SMALL, LARGE]
