"""`dllmbench report`: report.md, report.json and figures from finished run directories."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import assert_user_error, snapshot, toy_argv
from matplotlib.image import imread

from dllmbench.analysis import report_sections as sections
from dllmbench.cli import main
from dllmbench.core import schema

# a toy run with every family (scorers prm and orm) at two budgets: pools nest, guided
# strategies record their segments and checkpoints
GUIDED_RUN = [*toy_argv(4), "--resamples", "200"]
PNG = b"\x89PNG\r\n\x1a\n"
DIAGNOSTIC_KEYS = (
    "roc_auc_by_mask",
    "kendall_tau",
    "removal_risk",
    "unique_answers",
    "entropy_bits",
    "ess_before",
    "ess_after",
)


def _run(out: Path, *extra: str, cli=None) -> Path:
    """A finished run in `out` (through `cli` when given, so its progress is captured)."""
    argv = [*GUIDED_RUN, *extra, "--out", str(out)]
    code = main(argv) if cli is None else cli(*argv).code
    assert code == 0
    return out


@pytest.fixture(scope="module")
def two_budgets(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("runs") / "b", "--budget", "40,80")


@pytest.fixture(scope="module")
def reported(two_budgets, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("report")
    assert main(["report", str(two_budgets), "--out", str(out)]) == 0
    return out, json.loads((out / "report.json").read_text())


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _by_budget(entries: list[dict], default: int) -> dict[tuple[str, int], dict]:
    return {(m["id"], int(m.get("budget", default))): m for m in entries}


def test_report_writes_markdown_json_and_readable_pngs(reported):
    out, data = reported
    text = (out / "report.md").read_text()
    for heading in (
        "## Accuracy by method and budget",
        "### Budget 40",
        "### Budget 80",
        "## Pooled independent curves",
        "### Scorer discrimination",
        "### Pools",
        "### Removal risk",
        "### SMC",
    ):
        assert heading in text, heading
    assert set(data["figures"]) == {"pareto", "roc_auc_by_mask", "pool_diversity", "smc_ess"}
    for name, file in data["figures"].items():
        raw = (out / file).read_bytes()
        assert raw.startswith(PNG), name
        assert len(raw) > 10_000, (name, len(raw))
        pixels = imread(out / file)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 300, (name, pixels.shape)
        assert pixels.std() > 0.01, name  # not a blank canvas
        assert f"]({file})" in text


def test_report_numbers_at_each_budget_equal_results_json(two_budgets, reported):
    _, data = reported
    results = json.loads((two_budgets / "results.json").read_text())
    expected = _by_budget(results["methods"], results["budget"])
    got = _by_budget(data["methods"], 0)
    assert set(got) == set(expected)
    assert {b for _, b in got} == {40, 80} == set(data["budgets"])
    for key, entry in expected.items():
        for field in (
            "accuracy",
            "delta_vs_reference",
            "passes_per_problem",
            "flops_per_problem",
            "spend",
            "capped",
            "problems",
            "share_of_budget",
            "pool",
        ):
            assert got[key].get(field) == entry.get(field), (key, field)
    text = (reported[0] / "report.md").read_text()
    vanilla = expected[("Vanilla", 40)]["accuracy"]
    assert f"{100 * vanilla['value']:.1f} [{100 * vanilla['low']:.1f}" in text


def test_pooled_estimate_at_k_equals_n_equals_the_run_method_record_for_record(reported):
    _, data = reported
    agreement = {a["method"]: a for a in data["pooled"]["agreement"]}
    size = data["pooled"]["size"]
    assert any(a["selector"] == "argmax:orm" for a in agreement.values()), agreement
    assert any(a["selector"] == "majority" and a["k"] == size for a in agreement.values())
    for a in agreement.values():
        assert a["equal"] and a["pooled"] == a["run"], a
    curves = {c["selector"]: c for c in data["pooled"]["curves"]}
    assert {"oracle", "random", "majority", "argmax:orm", "argmax:prm"} <= set(curves)
    oracle = curves["oracle"]["points"]
    assert [p["k"] for p in oracle] == list(range(1, size + 1))
    # passes of a pooled point: what an independent run of k candidates costs (k·T, and k
    # scorer passes for a selector that reads a scorer); T = 8 here
    assert [p["passes"] for p in oracle] == [8 * k for k in range(1, size + 1)]
    assert [p["passes"] for p in curves["argmax:orm"]["points"]][:3] == [9, 18, 27]


def test_every_diagnostic_appears_in_report_json(reported):
    _, data = reported
    missing = set(DIAGNOSTIC_KEYS) - _keys(data["diagnostics"])
    assert not missing, missing
    diag = data["diagnostics"]
    assert {(d["scorer"], d["states"]) for d in diag["discrimination"]} >= {
        ("prm", "guided"),
        ("orm", "final"),
    }
    assert {p["kind"] for p in diag["pools"]} == {"plain", "guided", "other"}
    assert diag["removal_risk"] and diag["particles"]
    assert all(len(d["roc_auc_by_mask"]) == 10 for d in diag["discrimination"])


def test_report_defaults_to_run_dir_report_and_json_lists_files(two_budgets, tmp_path, cli):
    run = tmp_path / "run"
    shutil.copytree(two_budgets, run)
    result = cli("report", run, "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["out"] == str(run / "report")
    assert {"report.md", "report.json", "pareto.png"} <= set(data["files"])
    assert all((run / "report" / f).is_file() for f in data["files"])


def test_runs_of_one_protocol_combine_and_a_mismatch_is_refused(two_budgets, tmp_path, cli):
    other = _run(
        tmp_path / "b120",
        "--budget",
        "120",
        "--methods",
        "vanilla,majority,orm_rerank,prm_rerank",
        cli=cli,
    )
    out = tmp_path / "combined"
    result = cli("report", two_budgets, other, "--out", out)
    assert result.code == 0, result.err
    data = json.loads((out / "report.json").read_text())
    assert data["budgets"] == [40, 80, 120]
    assert [r["path"] for r in data["runs"]] == [str(two_budgets), str(other)]
    ids = [(m["id"], m["budget"], m["run"]) for m in data["methods"]]
    assert ("Majority@15", 120, 1) in ids
    assert [(b, r) for i, b, r in ids if i == "Vanilla"] == [(40, 0), (80, 0), (120, 1)]
    assert data["pooled"]["size"] == 15 and data["pooled"]["run"] == 1

    twice = cli("report", two_budgets, two_budgets, "--out", tmp_path / "twice")
    assert twice.code == 2 and "is given twice" in twice.err, twice.err
    assert not (tmp_path / "twice").exists()

    seed = _run(
        tmp_path / "seed1",
        "--budget",
        "40",
        "--methods",
        "orm_rerank,prm_rerank",
        "--seed",
        "1",
        cli=cli,
    )
    before = snapshot(tmp_path)
    result = cli("report", two_budgets, seed, "--out", tmp_path / "refused")
    assert_user_error(result, "cannot combine", "sampling.seed: 0 → 1")
    assert snapshot(tmp_path) == before


def test_runs_of_other_plugins_name_the_plugin_not_its_first_option():
    from dllmbench.analysis.report import protocol_mismatch

    a = {"backbone": {"name": "tiny", "config": {"alg": "maskgit_plus", "seed": 0}}}
    b = {"backbone": {"name": "toy", "config": {"seed": 0}}}
    assert protocol_mismatch(a, b) == "backbone.name: 'tiny' → 'toy'"
    c = {"backbone": {"name": "tiny", "config": {"alg": "entropy", "seed": 0}}}
    assert protocol_mismatch(a, c) == "backbone.config.alg: 'maskgit_plus' → 'entropy'"


def test_runs_with_budgets_in_different_units_are_not_combined(two_budgets, tmp_path, cli):
    flops = tmp_path / "flops"
    shutil.copytree(two_budgets, flops)
    manifest = json.loads((flops / "manifest.json").read_text())
    manifest["budget_unit"] = "flops"
    (flops / "manifest.json").write_text(json.dumps(manifest))
    assert cli("merge", flops).code == 0  # results.json as its records give it in FLOPs
    assert json.loads((flops / "results.json").read_text())["budget_unit"] == "flops"
    before = snapshot(tmp_path)
    result = cli("report", two_budgets, flops, "--out", tmp_path / "refused")
    assert_user_error(result, "cannot combine", "budgets in passes → in flops")
    assert snapshot(tmp_path) == before


def test_unfinished_or_foreign_directories_are_one_line(two_budgets, tmp_path, cli):
    assert_user_error(cli("report", tmp_path / "nowhere"), "is not a directory")
    (tmp_path / "afile").write_text("x")  # the run is judged before its report folder
    result = cli("report", tmp_path / "afile")
    assert_user_error(result, "afile is not a directory", "give a run directory")
    assert "--out" not in result.err
    (tmp_path / "empty").mkdir()
    assert_user_error(cli("report", tmp_path / "empty"), "no manifest.json")
    partial = tmp_path / "partial"
    shutil.copytree(two_budgets, partial)
    (partial / "results.json").unlink()
    assert_user_error(cli("report", partial), "not a finished run", "no results.json")
    torn = tmp_path / "torn"
    shutil.copytree(two_budgets, torn)
    lines = (torn / "samples.jsonl").read_text().splitlines(keepends=True)
    (torn / "samples.jsonl").write_text("".join(lines[:-3]))
    assert_user_error(cli("report", torn), "not a finished run", f"{len(lines) - 3} of")
    # a record of a problem the run does not have, in place of one it lacks: report and
    # merge refuse it alike, naming its line (report counted records, not the run's problems)
    stray = tmp_path / "stray"
    shutil.copytree(two_budgets, stray)
    records = [json.loads(line) for line in lines]
    records[0]["problem"] = "test-77"
    (stray / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    refused = f"{stray / 'samples.jsonl'} line 1 is not a record of this run (its problem 'test-77'"
    assert_user_error(cli("report", stray), refused)
    assert_user_error(cli("merge", stray), refused)
    # that line deleted, both say that the record it stood in for is missing
    (stray / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[1:]))
    planned = len(records)
    assert_user_error(cli("report", stray), "not a finished run", f"{planned - 1} of {planned}")
    assert_user_error(cli("merge", stray), "is not complete: missing 1 of")


def test_a_results_json_that_is_not_what_its_records_give_is_refused(two_budgets, tmp_path, cli):
    """results.json rewritten to claim more (an accuracy, a spend): the report recomputes it
    from the records and refuses it in one line; merge writes it again, and the report reads."""
    edited = tmp_path / "edited"
    shutil.copytree(two_budgets, edited)
    shutil.rmtree(edited / "report", ignore_errors=True)
    results = json.loads((edited / "results.json").read_text())
    results["methods"][0]["accuracy"]["value"] = 0.99
    (edited / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    assert_user_error(
        cli("report", edited),
        f"{edited / 'results.json'} is not what its records give (methods differ)",
        f"dllmbench merge {edited}",
    )
    assert cli("merge", edited).code == 0
    assert cli("report", edited).code == 0


def test_pooled_selector_names_majority_by_its_treatment_of_invalid_answers():
    assert sections.pooled_selector({"name": "majority", "config": {}}) == "majority"
    drop = {"name": "majority", "config": {"invalid": "drop"}}
    vote = {"name": "majority", "config": {"invalid": "vote"}}
    assert sections.pooled_selector(drop) == "majority"
    assert sections.pooled_selector(vote) == "majority:invalid=vote"


def test_majority_invalid_vote_has_its_pooled_curve_and_agrees_at_k_equals_n(tmp_path):
    run = tmp_path / "run"
    argv = [*toy_argv(4, prm=False), "--budget", "40", "--resamples", "200"]
    argv += ["--methods", "majority,orm_rerank"]
    argv += ["--method", "independent:n=*+majority:invalid=vote"]
    assert main([*argv, "--out", str(run)]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    curves = {c["selector"]: c for c in data["pooled"]["curves"]}
    assert {"majority", "majority:invalid=vote"} <= set(curves)
    agreement = {a["selector"]: a for a in data["pooled"]["agreement"]}
    for selector in ("majority", "majority:invalid=vote"):
        assert agreement[selector]["equal"], agreement[selector]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Majority (invalid answers vote)@k" in text


def test_cost_model_is_the_manifest_cost_per_candidate():
    manifest = {
        "methods": [
            {
                "strategy": {"name": "independent", "config": {"n": 8}},
                "evidence": {"nested": "n", "plain": True},
                "cost": {"denoise": 384},
            },
            {
                "strategy": {"name": "independent", "config": {"n": 4}},
                "evidence": {"nested": "n", "plain": True},
                "cost": {"denoise": 192, "score:orm": 4},
            },
        ]
    }
    model = sections.cost_model(manifest, "independent")
    assert model.passes("oracle", 3) == 3 * 48
    assert model.passes("majority", 8) == 8 * 48
    assert model.passes("argmax:orm", 5) == 5 * 49
    assert model.passes("weighted_majority:orm", 2) == 2 * 49


SCHEMA_DOC = Path(__file__).parent.parent / "docs" / "results-schema.md"


def _conforms(value: dict, typed: type, where: str) -> None:
    """Every required key of the TypedDict, no other key, in the declared order."""
    declared = list(typed.__annotations__)
    assert typed.__required_keys__ <= set(value), (where, typed.__required_keys__ - set(value))
    assert list(value) == [k for k in declared if k in value], (where, list(value), declared)


def test_report_json_has_exactly_the_keys_of_the_schema_and_its_doc(reported):
    _, data = reported
    _conforms(data, schema.Report, "report")
    for m in data["methods"]:
        _conforms(m, schema.ReportMethod, m["id"])
    pooled = data["pooled"]
    _conforms(pooled, schema.PooledSection, "pooled")
    for curve in pooled["curves"]:
        _conforms(curve, schema.PooledCurve, curve["selector"])
        for point in curve["points"]:
            _conforms(point, schema.PooledPointEntry, "point")
    for entry in pooled["agreement"]:
        _conforms(entry, schema.PooledAgreement, "agreement")
    diag = data["diagnostics"]
    _conforms(diag, schema.DiagnosticsSection, "diagnostics")
    typed = {
        "discrimination": schema.DiscriminationEntry,
        "pools": schema.PoolDiversityEntry,
        "removal_risk": schema.RemovalRiskEntry,
        "particles": schema.SMCEntry,
    }
    for key, kind in typed.items():
        for entry in diag[key]:
            _conforms(entry, kind, key)
    for entry in diag["discrimination"]:
        for tau in entry["kendall_tau"]:
            _conforms(tau, schema.KendallEntry, "kendall_tau")
        for bucket in entry["roc_auc_by_mask"]:
            _conforms(bucket, schema.BucketEntry, "bucket")
    _conforms(diag["scorer_swap"], schema.ScorerSwapEntry, "scorer_swap")

    section = SCHEMA_DOC.read_text().split("\n## `report.json`\n", 1)[1].split("\n## ", 1)[0]
    tables = []
    for block in re.split(r"\n\s*\n", section):
        rows = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| ---")]
        if rows and rows[0].startswith("| key |"):
            cells = [row.split("|")[1] for row in rows[1:]]
            tables.append([k for cell in cells for k in re.findall(r"`([^`]+)`", cell)])
    documented = [
        schema.Report,
        schema.PooledSection,
        schema.PooledCurve,
        schema.PooledPointEntry,
        schema.PooledAgreement,
        schema.DiagnosticsSection,
        schema.DiscriminationEntry,
        schema.BucketEntry,
        schema.KendallEntry,
        schema.PoolDiversityEntry,
        schema.RemovalRiskEntry,
        schema.SMCEntry,
        schema.ScorerSwapEntry,
    ]
    assert tables == [list(t.__annotations__) for t in documented]


@pytest.mark.slow
def test_demo_at_two_budgets_reports_every_table_and_figure(tmp_path, cli, demo_run):
    """The shipped demo (`dllmbench run --limit 6`: budgets 208 and 832) and its report."""
    run = tmp_path / "demo"
    shutil.copytree(demo_run.path, run)
    result = cli("report", run)
    assert result.code == 0, result.err
    out = run / "report"
    data = json.loads((out / "report.json").read_text())
    results = json.loads((run / "results.json").read_text())
    assert data["budgets"] == results["budgets"] == [208, 832]
    expected = _by_budget(results["methods"], results["budget"])
    got = _by_budget(data["methods"], 0)
    assert set(got) == set(expected)
    for key, entry in expected.items():
        assert got[key]["accuracy"] == entry["accuracy"], key
        assert got[key].get("delta_vs_reference") == entry.get("delta_vs_reference"), key
    for name in ("pareto", "roc_auc_by_mask", "pool_diversity"):
        assert (out / data["figures"][name]).read_bytes().startswith(PNG)
        assert imread(out / data["figures"][name]).std() > 0.01
    assert not set(DIAGNOSTIC_KEYS) - _keys(data["diagnostics"])
    agreement = {a["method"]: a for a in data["pooled"]["agreement"]}
    orm = [a for a in agreement.values() if a["selector"] == "argmax:orm"]
    assert orm and all(a["equal"] for a in agreement.values())


# -- the scorer controls of a collection (dllmbench diagnose) ------------------------------------


def _controls(tmp: Path, *sampling: str) -> Path:
    """A toy collection sampled as GUIDED_RUN (or with `sampling` instead) and its controls."""
    collection = tmp / "collection"
    argv = ["collect", "--task", "toy_sum:size=4", "--split", "test", "--backbone", "toy"]
    argv += [*(sampling or ("--steps", "8", "--gen-length", "5")), "--n", "4"]
    assert main([*argv, "--snapshots", "4", "--out", str(collection)]) == 0
    out = tmp / "controls"
    scorers = ["--scorer", "prm=toy", "--scorer", "orm=toy:partial=false"]
    assert main(["diagnose", str(collection), *scorers, "--width", "4", "--out", str(out)]) == 0
    return out


def test_report_adds_the_scorer_controls_of_a_collection(two_budgets, tmp_path):
    controls = _controls(tmp_path)
    out = tmp_path / "report"
    assert main(["report", str(two_budgets), "--controls", str(controls), "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    saved = json.loads((controls / "controls.json").read_text())
    assert data["controls"] == saved
    risks = {(r["state"], r["keep"]) for r in data["controls"]["removal_risk"]}
    assert risks == {(s, m) for s in ("initial", "middle", "final") for m in (1, 2)}
    text = (out / "report.md").read_text()
    assert "## Scorer controls over stored trajectories" in text
    assert "### Removal risk at the first cut in the run" in text
    assert "### Removal risk: the offline counterfactual" in text
    assert "### ROC-AUC by mask ratio, every stored state" in text
    plain = tmp_path / "plain"
    assert main(["report", str(two_budgets), "--out", str(plain)]) == 0
    assert json.loads((plain / "report.json").read_text())["controls"] is None
    assert "Scorer controls" not in (plain / "report.md").read_text()


def test_report_refuses_controls_sampled_otherwise(two_budgets, tmp_path, cli, capsys):
    controls = _controls(tmp_path, "--steps", "8", "--gen-length", "6")
    capsys.readouterr()  # what collecting and diagnosing printed
    out = tmp_path / "report"
    result = cli("report", str(two_budgets), "--controls", str(controls), "--out", str(out))
    assert_user_error(result, "the collection's and the run's gen_length differ (6 against")
    result = cli("report", str(two_budgets), "--controls", str(tmp_path), "--out", str(out))
    assert_user_error(result, "holds no controls.json")
