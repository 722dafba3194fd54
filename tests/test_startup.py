"""The command line answers without torch: `--help`, `--version`, a command's `--help`, an
argument error, `status` and `merge` import neither torch nor transformers (a command imports
what it runs on inside `execute`), and the parsers' defaults come from the configuration
dataclasses' source without importing their modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import toy_argv

from dllmbench.cli import COMMANDS
from dllmbench.cli.defaults import declared_default

# One child process (a fresh sys.modules) runs every path in a row through `main`, as the
# command does, and says after each which of torch and transformers it has imported.
CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from dllmbench.cli import main

    seen = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
        seen.append({
            "argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(),
            "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
            "scipy": sorted(m for m in ("scipy.stats", "scipy.special") if m in sys.modules),
        })
    print(json.dumps(seen))
    """
)

NAMES = [c.__name__.rsplit(".", 1)[-1].replace("_", "-") for c in COMMANDS]  # train-scorer
HELP = [["--help"], ["--version"], *[[name, "--help"] for name in NAMES]]
BAD = [
    ["--no-such-flag"],
    ["run", "--no-such-flag"],
    ["run", "--budget", "many"],
    ["plan", "--steps", "0"],
    ["frobnicate"],
    ["status"],
]


@pytest.fixture(scope="module")
def seen(tmp_path_factory, finished_run_once) -> list[dict]:
    """What each path did in the child, in order: help, errors, status and merge of a copy
    of the session's finished toy run, then a run on the doubles."""
    home = tmp_path_factory.mktemp("startup")
    run_dir = home / "run"
    shutil.copytree(finished_run_once, run_dir)
    reads = [["status", str(run_dir)], ["status", str(run_dir), "--json"], ["merge", str(run_dir)]]
    toy = [*toy_argv(2, prm=False), "--methods", "vanilla,orm_rerank", "--out", str(home / "toy")]
    argv = [*HELP, *BAD, *reads, toy]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def test_no_path_of_the_quick_answers_imports_torch_or_transformers(seen):
    assert [s["argv"][0] for s in seen[-4:-1]] == ["status", "status", "merge"]
    for step in seen[:-1]:
        assert not step["torch"], f"{step['argv']} imported torch"
        assert not step["transformers"], f"{step['argv']} imported transformers"
        # scipy.stats is half a second of import, scipy.special a third of `merge`'s start,
        # for binomial laws that the standard library's log-gamma and integers give
        assert not step["scipy"], f"{step['argv']} imported {step['scipy']}"


def test_help_and_version_answer_as_before(seen):
    by = {tuple(s["argv"]): s for s in seen}
    assert by[("--version",)]["code"] == 0 and by[("--version",)]["out"].startswith("dllmbench ")
    assert by[("--help",)]["code"] == 0 and "run" in by[("--help",)]["out"]
    for name in NAMES:
        step = by[(name, "--help")]
        assert step["code"] == 0 and step["out"].startswith("usage: dllmbench "), name
    run_help = by[("run", "--help")]["out"]
    assert "--gen-length" in run_help and "--max-problems" in run_help


def test_argument_errors_stay_one_line_with_status_2(seen):
    errors = [s for s in seen if s["argv"] in BAD]
    assert len(errors) == len(BAD)
    for step in errors:
        lines = step["err"].strip().splitlines()
        assert step["code"] == 2, step
        assert len(lines) == 1 and lines[0].startswith("dllmbench: error: "), step["err"]


def test_a_run_whose_plugins_need_no_transformers_imports_none(seen):
    """A run on the doubles (no Hugging Face model) loads torch but not transformers: its
    manifest reads transformers' version from the package metadata."""
    run = seen[-1]
    assert run["argv"][0] == "run" and run["code"] == 0, run["err"]
    assert run["torch"] and not run["transformers"]
    manifest = json.loads((Path(run["argv"][-1]) / "manifest.json").read_text())
    assert manifest["versions"]["transformers"] == version("transformers")


def test_status_and_merge_read_the_run_as_before(seen):
    status, as_json, merged = seen[-4:-1]
    assert status["code"] == 0 and "16/16 records (100%)" in status["out"], status
    assert as_json["code"] == 0 and json.loads(as_json["out"])["done"] == 16
    assert merged["code"] == 0 and "merged: " in merged["out"], merged


def test_a_declared_default_follows_a_constant_through_its_import():
    from dllmbench.analysis.stats import RESAMPLES  # RunConfig's default, imported there
    from dllmbench.cli.common import field_default
    from dllmbench.running.runner import RunConfig

    assert declared_default("dllmbench.running.runner.RunConfig", "resamples") == RESAMPLES
    assert field_default(RunConfig, "resamples") == RESAMPLES


def test_a_default_that_is_no_literal_or_constant_is_refused(tmp_path, monkeypatch):
    (tmp_path / "computed_defaults.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass, field
            import os

            WIDTH = 8

            @dataclass
            class Config:
                width: int = WIDTH
                rate: float = field(default=2e-5)
                cores: int = os.cpu_count()
                names: list = field(default_factory=list)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert declared_default("computed_defaults.Config", "width") == 8
    assert declared_default("computed_defaults.Config", "rate") == 2e-5
    with pytest.raises(TypeError, match="no literal"):
        declared_default("computed_defaults.Config", "cores")
    with pytest.raises(TypeError, match="default_factory"):
        declared_default("computed_defaults.Config", "names")
    with pytest.raises(KeyError):
        declared_default("computed_defaults.Config", "missing")


def test_torch_threads_spin_for_a_third_of_a_millisecond_unless_the_user_says(monkeypatch):
    """Before torch loads, `dllmbench` has its OpenMP threads spin about 0.3 ms before they
    sleep (GOMP_SPINCOUNT=30000): not OpenMP's 3 ms, which burns busy cores, nor so short that
    a thread sleeps in the sampler's pauses inside a forward (benchmarks/bench_busy.py). A
    user's GOMP_SPINCOUNT or OMP_WAIT_POLICY wins; once torch is loaded nothing is set."""
    from dllmbench.cli import SPIN_COUNT, spin_briefly

    monkeypatch.delitem(sys.modules, "torch")  # as in a fresh `dllmbench` process
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    spin_briefly()
    assert os.environ["GOMP_SPINCOUNT"] == SPIN_COUNT == "30000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    spin_briefly()
    assert os.environ["GOMP_SPINCOUNT"] == "0"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    spin_briefly()
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setitem(sys.modules, "torch", object())  # loaded: too late to set anything
    spin_briefly()
    assert "GOMP_SPINCOUNT" not in os.environ
