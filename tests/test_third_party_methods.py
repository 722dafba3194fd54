"""A third-party package written from the docs alone (tests/packages/hexvote), installed with
pip through its entry point: a HEX that gives rows their own block lengths, and a search that
declares its pruning cuts, which the report then analyses with no change to dllmbench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import pip_install

PACKAGE = Path(__file__).parent / "packages" / "hexvote"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return pip_install(PACKAGE, tmp_path_factory.mktemp("site"))


def _cli(site: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["DLLMBENCH_PLUGIN_MODULES"] = "dllmbench.testing.doubles"
    env.pop("DLLMBENCH_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-m", "dllmbench.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=site,
    )


RUN = [
    "run",
    "--task",
    "toy_sum:size=6",
    "--backbone",
    "toy",
    "--scorer",
    "prm=toy",
    "--steps",
    "8",
    "--gen-length",
    "5",
]


@pytest.fixture(scope="module")
def finished(site, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "third"
    methods = [
        "hexvote:n=4,blocks=1/5+majority",
        "independent:n=4+majority",
        "cutsearch:k=4,every=4+first",
    ]
    argv = [*RUN, "--out", str(out)]
    for method in methods:
        argv += ["--method", method]
    ran = _cli(site, *argv)
    assert ran.returncode == 0, ran.stderr
    return out


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def test_an_installed_hex_draws_other_pools_than_independent_sampling_at_equal_cost(finished):
    records = _records(finished)
    by = {(r["problem"], r["method"].split(":")[0]): r for r in records}
    problems = sorted({r["problem"] for r in records})
    assert len(problems) == 6
    differ = 0
    for pid in problems:
        hexed, plain = by[pid, "hexvote"], by[pid, "independent"]
        assert hexed["ledger"]["passes"] == plain["ledger"]["passes"] == {"denoise": 32}
        differ += [c["text"] for c in hexed["candidates"]] != [
            c["text"] for c in plain["candidates"]
        ]
    assert differ > 0
    manifest = json.loads((finished / "manifest.json").read_text())
    [entry] = [m for m in manifest["methods"] if m["strategy"]["name"] == "hexvote"]
    assert entry["strategy"]["distribution"] == "dllmbench-hexvote"
    assert entry["evidence"]["nested"] == "n"


def test_a_third_party_strategy_declaring_cuts_gets_removal_risk_and_auc(site, finished):
    reported = _cli(site, "report", str(finished))
    assert reported.returncode == 0, reported.stderr
    report = json.loads((finished / "report" / "report.json").read_text())
    diag = report["diagnostics"]
    [risk] = [e for e in diag["removal_risk"] if e["pool"].startswith("cutsearch")]
    assert risk["events"] == 6 and risk["rate"] is not None
    guided = [e for e in diag["discrimination"] if (e["scorer"], e["states"]) == ("prm", "guided")]
    assert guided and guided[0]["count"] > 0 and guided[0]["roc_auc_by_mask"]
    kinds = {p["pool"].split(":")[0]: p["kind"] for p in diag["pools"]}
    assert kinds["cutsearch"] == "guided" and kinds["independent"] == "plain"
    assert kinds["hexvote"] == "other"
