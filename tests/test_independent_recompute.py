"""An independent recomputation (tests/independent/recompute.py, which imports nothing of the
project's analysis) agrees with every number it covers in report.json and controls.json, on
fresh runs: the toy doubles (every family, at two budgets, with scorer controls) and the
shipped demo (a few problems, with its collection's controls)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import toy_argv

from dllmbench.cli import main

MODULE = Path(__file__).parent / "independent" / "recompute.py"
FORBIDDEN = ("dllmbench.analysis", "dllmbench.scoring", "dllmbench.execution")


def _recompute():
    spec = importlib.util.spec_from_file_location("independent_recompute", MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
            found += [f"{node.module}.{a.name}" for a in node.names]
    return found


def test_the_recomputation_imports_nothing_of_the_projects_analysis():
    names = _imports(MODULE)
    assert names, "no import found: the scan is broken"
    assert "numpy" in names  # the scan sees the module's imports
    bad = [n for n in names if n.startswith(FORBIDDEN) or n in ("dllmbench", "dllmbench.analysis")]
    assert not bad, f"recompute.py imports the project's analysis: {bad}"
    text = MODULE.read_text()
    assert "importlib" not in text and "__import__" not in text


def _check(run: Path, report: Path, controls: Path | None, least: int):
    before = set(sys.modules)
    checker = _recompute().recompute(run, report, controls)
    loaded = {m for m in set(sys.modules) - before if m.startswith(FORBIDDEN)}
    assert not loaded, f"the recomputation loaded {sorted(loaded)}"
    bad = checker.differences
    listing = "\n".join(f"{w}: recomputed {a!r}, report {b!r}" for w, a, b, _ in bad)
    print(f"{len(checker.compared)} numbers compared, {len(bad)} differ")
    assert not bad, f"{len(bad)} of {len(checker.compared)} numbers differ:\n{listing}"
    # nothing of report.json or controls.json is left out
    assert not checker.uncovered, checker.uncovered
    assert len(checker.compared) >= least, len(checker.compared)
    lows = [w for w, *_ in checker.compared if w.endswith(".low")]
    resampled = [w for w, a, *_ in checker.compared if w.endswith(".mc_error")]
    assert lows and resampled  # lower ends of exact and resampled intervals are compared
    if controls is not None:
        sliced = {w.split("]")[0] for w, *_ in checker.compared if w.startswith("controls[")}
        assert sliced == {"controls[paper", "controls[split"}
        assert any("rate_all_groups.low" in w for w, *_ in checker.compared)
    return checker


@pytest.mark.slow
def test_recomputation_agrees_with_a_toy_report_and_its_controls(tmp_path):
    run = tmp_path / "run"
    argv = [*toy_argv(4), "--resamples", "200", "--budget", "40,80", "--out", str(run)]
    assert main(argv) == 0
    collection = tmp_path / "collection"
    collect = ["collect", "--task", "toy_sum:size=4", "--split", "test", "--backbone", "toy"]
    collect += ["--steps", "8", "--gen-length", "5", "--n", "8", "--snapshots", "4"]
    assert main([*collect, "--out", str(collection)]) == 0
    controls = tmp_path / "controls"
    scorers = ["--scorer", "prm=toy", "--scorer", "orm=toy:partial=false"]
    diagnose = ["diagnose", str(collection), *scorers, "--width", "4"]
    assert main([*diagnose, "--out", str(controls)]) == 0
    out = tmp_path / "report"
    assert main(["report", str(run), "--controls", str(controls), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["controls"] is not None and report["diagnostics"]["particles"]
    _check(run, out / "report.json", controls, least=1000)
    # a report whose numbers moved is caught: one resampled lower end, one McNemar p
    swap = report["diagnostics"]["scorer_swap"]["differences"][0]
    swap["low"] = round(swap["low"] - 0.01, 6)
    delta = next(m for m in report["methods"] if "delta_vs_reference" in m)["delta_vs_reference"]
    delta["mcnemar_p"] = delta["mcnemar_p"] / 2
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(report))
    caught = _recompute().recompute(run, moved, None).differences
    assert sorted(w.rsplit(".", 1)[1] for w, *_ in caught) == ["low", "mcnemar_p"], caught


@pytest.mark.slow
def test_recomputation_agrees_with_a_fresh_demo_report(tmp_path, monkeypatch):
    monkeypatch.delenv("DLLMBENCH_PLUGIN_MODULES", raising=False)
    run = tmp_path / "demo"
    # independent pools, PRM-guided cuts (continuation labels, removal risk), SMC particles
    # and remasked canvases (ReMDM), at one budget, on three problems
    families = "vanilla,majority,orm_rerank,weighted_majority,prm_guided,top_m,smc_vote,remdm"
    argv = ["run", "--limit", "3", "--budget", "208", "--methods", families, "--out", str(run)]
    assert main(argv) == 0
    collection = tmp_path / "collection"
    collect = ["collect", "--task", "arith:min_steps=2,max_steps=3", "--split", "test"]
    collect += ["--backbone", "tiny", "--n", "4", "--snapshots", "4", "--steps", "24"]
    collect += ["--gen-length", "32", "--prompt", "fewshot", "--limit", "3"]
    assert main([*collect, "--out", str(collection)]) == 0
    controls = tmp_path / "controls"
    # the demo's shipped scorers: its PRM and ORM and the two causal PRMs
    assert main(["diagnose", str(collection), "--width", "4", "--out", str(controls)]) == 0
    out = tmp_path / "report"
    assert main(["report", str(run), "--controls", str(controls), "--out", str(out)]) == 0
    checker = _check(run, out / "report.json", controls, least=500)
    # the causal PRMs' readout pair and reversed input, with the bidirectional PRM as reference
    names = [w for w, *_ in checker.compared]
    assert any(w.startswith("controls.readout[") and w.endswith(".change.low") for w in names)
    assert any(w.startswith("controls.reversed_input[") and w.endswith("gap.low") for w in names)
