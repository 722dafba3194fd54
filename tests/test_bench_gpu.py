"""benchmarks/bench_gpu.py runs on a CPU at a tiny shape and reports sane numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dllmbench.core.flops import ModelShape, Work, flops

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


# -- `--models block`: the block model's cached step beside Dream's full-canvas step ------------

# the run the GPU check makes, where `datasets` and `math_verify` are not installed: importing
# either fails, so the path must not import them
WITHOUT_DATASETS = (
    "import runpy, sys; sys.modules.update(datasets=None, math_verify=None); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
BLOCK_ARGS = ("--tiny", "--models", "block,block-engines", "--json")
BLOCK_STEPS = ("steady", "block_start", "per_block", "uncached")


@pytest.fixture(scope="module")
def block_models():
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_DATASETS, str(SCRIPT), *BLOCK_ARGS],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report["models"]) == {"block", "block-engines"}
    return report["models"]


@pytest.fixture(scope="module")
def block_report(block_models):
    return block_models["block"]


def test_block_models_through_the_engine_write_every_row_to_its_end(block_models):
    engines = block_models["block-engines"]
    assert set(engines) == {"block", "llada2", "sdar-moe", "fast-dllm-v2"}
    for r in engines.values():
        for key in ("seconds", "tflops", "tokens_per_s", "row_passes_per_s"):
            assert positive(r[key]), (key, r)
        assert 0 < r["row_passes"] <= r["problems"] * r["copies"] * r["steps"]
        tokens = r["problems"] * r["copies"] * r["gen_length"]
        assert r["tokens_per_s"] == pytest.approx(tokens / r["seconds"], rel=1e-3)
    assert engines["block"]["block_length"] == 4 and engines["fast-dllm-v2"]["block_length"] == 32
    assert engines["llada2"]["block_length"] == 32 and engines["sdar-moe"]["block_length"] == 4


def test_block_steps_are_positive_and_finite(block_report):
    m = block_report
    assert m["shape"]["layers"] == 2 and m["shape"]["head_dim"] == 16
    assert set(m["blocks"]) == {"4", "8"}
    for r in [*(b[key] for b in m["blocks"].values() for key in BLOCK_STEPS), m["dream_step"]]:
        for key in ("seconds", "tflops", "flops", "tokens_per_s", "rows_per_s"):
            assert positive(r[key]), (key, r)
        assert r["mfu"] is None  # no known peak on a CPU
    for b in m["blocks"].values():
        for key in ("steady", "block_start", "uncached"):
            assert positive(b[key]["forward_seconds"])
        # a block's mean step lies between its steady step and its first
        lo, hi = sorted([b["steady"]["seconds"], b["block_start"]["seconds"]])
        assert lo * 0.999 <= b["per_block"]["seconds"] <= hi * 1.001
        ratio = b["dream_over_block"]
        assert ratio["per_step"] == pytest.approx(
            m["dream_step"]["seconds"] / b["steady"]["seconds"], rel=1e-3
        )
        assert ratio["per_token"] == pytest.approx(
            m["dream_step"]["seconds"] / b["per_block"]["seconds"], rel=1e-3
        )
    assert positive(m["peak_memory_gib"]) and positive(m["dream_step"]["peak_memory_gib"])
    assert m["dream_step"]["length"] == m["prompt_length"] + m["gen_length"]


def test_the_cached_step_is_charged_its_block_against_the_cache(block_report):
    """The cached step's FLOPs are the formula's for its block against the cached prefix, below
    the block start's (which also runs the finished block) and far below the uncached step's."""
    m = block_report
    rows, k = m["rows"], m["tokens_per_step"]
    shape = ModelShape(
        params=m["matmul_params"] - m["head_params"],
        head=m["head_params"],
        layers=m["shape"]["layers"],
        width=m["shape"]["heads"] * m["shape"]["head_dim"],
    )
    for name, b in m["blocks"].items():
        block, context = int(name), b["context"]
        assert b["steps_per_block"] == block // k and b["total_steps"] == m["gen_length"] // k
        # halfway through its block: the block's tokens against context + block keys, the LM
        # head at the half still masked
        masked = block - b["steps_per_block"] // 2 * k
        work = Work(block, block * (context + block), masked)
        assert b["steady"]["flops"] == pytest.approx(rows * flops(shape, work), rel=1e-3)
        assert b["steady"]["flops"] < b["block_start"]["flops"] < b["uncached"]["flops"]
        # uncached: every token up to the block's end again, block-causal
        end = context + block
        attended = sum(block * hi for hi in range(block, end + 1, block))
        work = Work(end, attended, masked)
        assert b["uncached"]["flops"] == pytest.approx(rows * flops(shape, work), rel=1e-3)
        assert b["steady"]["flops"] < b["per_block"]["flops"] < b["block_start"]["flops"]


def test_the_block_model_reports_its_kv_cache(block_report):
    m = block_report
    s = m["shape"]
    for b in m["blocks"].values():
        cache = b["cache"]
        # float32 on a CPU: layers × keys and values × kv heads × head dim × 4 bytes
        assert cache["bytes_per_token"] == s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * 4
        assert cache["tokens"] == m["rows"] * b["context"]
        assert cache["bytes"] == cache["tokens"] * cache["bytes_per_token"]
        # the block starts stored one finished block per row and call beyond it
        assert cache["peak_bytes"] > cache["bytes"]


def test_the_gpu_check_is_one_table_of_both_models_in_both_modes_and_the_demo():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--check", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    models = report["check"]["models"]
    assert set(models) == {f"{m}/{a}" for m in ("dream", "llada") for a in ("sdpa", "packed")}
    for m in models.values():
        for key in MEASURES:
            assert positive(m[key]["seconds"]) and positive(m[key]["tflops"]), (key, m[key])
    demo = report["check"]["demo"]
    assert demo["problems"] == 1 and demo["rows"] > 0 and positive(demo["rows_per_s"])
    assert report["transformers"] and report["torch"]
    table = load_script().check_text(report).splitlines()
    assert len(table) == 2 + 16 + 2 and table[-2].startswith("demo")
    wall = report["check"]["wall_seconds"]
    assert set(wall) == {*models, "demo"} and all(positive(v) for v in wall.values())
    assert table[-1].startswith("wall seconds: dream/sdpa ")
