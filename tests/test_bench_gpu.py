"""benchmarks/bench_gpu.py runs on a CPU at a tiny shape and reports sane numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dllmbench.core.flops import ModelShape, flops

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
MEASURES = ("forward", "forward_padded", "denoise_step", "engine")


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_tiny_report_covers_both_shapes_on_the_cpu(report):
    assert report["device"] == "cpu" and report["tiny"] is True
    assert report["peak_tflops"] is None  # no known peak on a CPU: MFU is null
    assert set(report["models"]) == {"dream", "llada"}


@pytest.mark.parametrize("arch", ["dream", "llada"])
def test_every_measure_is_positive_and_finite(report, arch):
    m = report["models"][arch]
    assert positive(m["matmul_params"]) and positive(m["peak_memory_gib"])
    assert m["shape"]["layers"] == 2 and m["shape"]["hidden"] == 64
    for key in MEASURES:
        r = m[key]
        assert positive(r["seconds"]) and positive(r["tflops"]), (key, r)
        assert r["mfu"] is None, key
    for key in ("forward", "forward_padded", "denoise_step"):
        assert positive(m[key]["rows_per_s"])
    # compute.json's ratio, tokens computed / real tokens: mixed lengths padded compute more
    assert 1 < m["forward_padded"]["padding"] < m["rows"]
    assert positive(m["denoise_step"]["vs_padded_forward"])
    engine = m["engine"]
    assert positive(engine["row_passes_per_s"])
    assert engine["row_passes"] == engine["problems"] * engine["copies"] * engine["steps"]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_gpu", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_flops_follow_the_stated_formula_and_mfu_uses_the_peak():
    bench = load_script()

    # the ledger's own formula: 2·P·s + 2·P_head·s (the head everywhere) + 4·layers·width·s²
    shape = ModelShape(params=100, head=20, layers=3, width=10)
    expected = 2 * 100 * 10 + 2 * 20 * 10 + 4 * 3 * 10 * (16 + 36)
    assert bench.full_forwards(shape, [4, 6]) == expected
    assert bench.flops is flops  # one function owns the formula
    r = bench.rate(2e12, 2.0, rows=8, peak=4.0)
    assert r["tflops"] == 1.0 and r["mfu"] == 0.25 and r["rows_per_s"] == 4.0
    assert bench.rate(2e12, 2.0, rows=8, peak=None)["mfu"] is None
    assert bench.PEAK_TFLOPS == {"H100": 989.0, "H200": 989.0}
