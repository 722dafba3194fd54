"""The edges a newcomer hits: damaged run-directory files, devices this torch cannot use, huge
budgets and canvases, numbers that are not ASCII digits, repeated options, folders that belong
to something else. Each is one line, exit status 2, no traceback, and leaves folders as they
were."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import TOY_RUN, assert_user_error, snapshot

from dllmbench.plugins.backbones.base import DiffusionBackbone

TINY = ["run", "--task", "arith:test_size=4", "--steps", "4", "--gen-length", "8", "--limit", "2"]


@pytest.fixture
def no_backbone(monkeypatch):
    """Building a model backbone is a test failure: the mistake had to be found before."""

    def built(self, *args, **kwargs):
        raise AssertionError("the backbone was built before the mistake was found")

    monkeypatch.setattr(DiffusionBackbone, "__init__", built)


def edit_json(file: Path, edit) -> None:
    data = json.loads(file.read_text())
    file.write_text(json.dumps(edit(data)))


def without(key: str, where: tuple = ()):
    def edit(data):
        target = data
        for step in where:
            target = target[step]
        del target[key]
        return data

    return edit


# -- 1. damaged manifest.json and results.json: report and merge ---------------------------------

MANIFEST_DAMAGE = [
    ("empty object", lambda m: {}, "lacks 'created'"),
    ("no methods", without("methods"), "lacks 'methods'"),
    ("a method without its id", without("id", ("methods", 1)), "methods[1] lacks 'id'"),
    ("no task problems", without("problems", ("task",)), "task lacks 'problems'"),
    ("seed not an int", lambda m: {**m, "sampling": {**m["sampling"], "seed": "x"}}, "seed"),
    ("methods not a list", lambda m: {**m, "methods": {}}, "methods is not a list"),
]


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("how,edit,needle", MANIFEST_DAMAGE, ids=[d[0] for d in MANIFEST_DAMAGE])
def test_a_damaged_manifest_is_one_line_naming_it(cli, finished_run, command, how, edit, needle):
    manifest = finished_run / "manifest.json"
    edit_json(manifest, edit)
    before = snapshot(finished_run)
    result = cli(command, finished_run)
    assert_user_error(result, f"{manifest} is damaged", needle, "restore it from a copy")
    assert snapshot(finished_run) == before


RESULTS_DAMAGE = [
    ("empty object", lambda r: {}, "lacks 'schema_version'"),
    ("no resamples", without("resamples"), "lacks 'resamples'"),
    ("a method without accuracy", without("accuracy", ("methods", 0)), "methods[0] lacks"),
    ("an interval without low", without("low", ("methods", 0, "accuracy")), "lacks 'low'"),
    ("budgets not a list", lambda r: {**r, "budgets": 3}, "budgets is not a list"),
]


@pytest.mark.parametrize("how,edit,needle", RESULTS_DAMAGE, ids=[d[0] for d in RESULTS_DAMAGE])
def test_a_damaged_results_file_is_one_line_saying_merge_rewrites_it(
    cli, finished_run, how, edit, needle
):
    results = finished_run / "results.json"
    edit_json(results, edit)
    before = snapshot(finished_run)
    result = cli("report", finished_run)
    assert_user_error(result, f"{results} is damaged", needle, f"dllmbench merge {finished_run}")
    assert snapshot(finished_run) == before
    # and what it says works: merge writes it again from the records, then report reads it
    assert cli("merge", finished_run).code == 0
    assert cli("report", finished_run).code == 0


# -- 1. devices this torch build does not have, before anything loads ----------------------------


@pytest.mark.parametrize(
    "device,needle",
    [
        ("banana", "device 'banana' is not a torch device"),
        ("cuda:x", "is not a torch device"),
        ("quantum", "is not a torch device"),
    ],
)
def test_a_device_that_is_not_a_device(cli, tmp_path, no_backbone, device, needle):
    result = cli(*TINY, "--backbone", f"tiny:device={device}", "--out", tmp_path / "r")
    assert_user_error(result, f"backbone 'tiny' with device={device}", needle)
    assert not (tmp_path / "r").exists()


def test_a_device_this_build_lacks(cli, tmp_path, no_backbone, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    result = cli(*TINY, "--backbone", "tiny:device=cuda", "--out", tmp_path / "r")
    assert_user_error(result, "device 'cuda': this torch", "built without CUDA", "device=cpu")
    assert not (tmp_path / "r").exists()
    plan = cli("plan", "--task", "arith", "--backbone", "llada:device=cuda:0", "--budget", "64")
    assert_user_error(plan, "backbone 'llada' with device=cuda:0", "built without CUDA")


def test_a_cuda_device_beyond_those_visible(cli, tmp_path, no_backbone, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = cli(*TINY, "--backbone", "tiny:device=cuda:2", "--out", tmp_path / "r")
    assert_user_error(result, "there are 2 CUDA devices (cuda:0 to cuda:1)")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    result = cli(*TINY, "--backbone", "tiny:device=cuda", "--out", tmp_path / "r")
    assert_user_error(result, "no CUDA device is visible")
    assert not (tmp_path / "r").exists()
