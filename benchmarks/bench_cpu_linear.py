"""Float32 linears on the CPU: oneDNN (after) against torch's own MKL (before).

Three measurements, each before and after within this one process, on one thread:

- each linear shape of the demo model at a range of rows (tokens): the time of torch's
  `F.linear` over that of oneDNN's, and whether they agree bit for bit;
- the shipped demo backbone's denoising forward (its transformer and LM head) over a batch of
  the demo's canvases (`--rows` rows), before and after `use_onednn`, and the largest logit
  difference;
- the demo itself, `dllmbench run --limit N` (every family at both budgets), run in this
  process once with oneDNN switched off and once on: CPU-seconds (this process's user +
  system time) of each, their ratio, and whether the two make the same decisions.

The ratio is what counts; the times depend on the machine (AMD processors, on which MKL runs
its AVX2 code, gain most).

    python benchmarks/bench_cpu_linear.py [--rows 64] [--limit 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from dllmbench.cli import main as dllmbench
from dllmbench.plugins.backbones import cpu_linear
from dllmbench.plugins.backbones.tiny import Tiny


def seconds(call: Callable[[], object], repeat: int) -> float:
    """The best of three means over `repeat` calls, after a warm-up call."""
    call()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def onednn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def shapes(backbone: Tiny) -> None:
    """torch's time over oneDNN's for each distinct (in, out) of the model's linears."""
    sizes = sorted(
        {
            (m.in_features, m.out_features)
            for m in backbone.transformer.modules()
            if isinstance(m, torch.nn.Linear)
        }
    )
    rows = (16, 64, 256, 1024, 4096)
    print("linear (in → out): torch's time / oneDNN's, by rows; '=' bit for bit the same")
    print(f"{'':>12} " + " ".join(f"{r:>9}" for r in rows))
    for k, n in sizes:
        cells = []
        for r in rows:
            x, w = torch.randn(r, k), torch.randn(n, k) / k**0.5
            ratio = seconds(partial(F.linear, x, w), 50) / seconds(partial(onednn, x, w), 50)
            same = "=" if torch.equal(F.linear(x, w), onednn(x, w)) else " "
            cells.append(f"{ratio:>8.2f}{same}")
        print(f"{k:>5} → {n:<4} " + " ".join(cells))


def forward(backbone: Tiny, rows: int) -> None:
    """The denoising forward over `rows` demo canvases, before and after."""
    width = 80  # the demo's prompt and 32 generated positions: 70 to 80 tokens
    ids = torch.randint(2, len(backbone.tokenizer), (rows, width))
    attn = torch.ones_like(ids)
    cpu_linear.use_onednn(backbone.transformer, on=False)
    before = backbone.logits(ids, attn)
    took_before = seconds(lambda: backbone.logits(ids, attn), 5)
    cpu_linear.use_onednn(backbone.transformer)
    after = backbone.logits(ids, attn)
    took_after = seconds(lambda: backbone.logits(ids, attn), 5)
    print(
        f"\ndenoising forward, {rows} rows × {width} tokens: {took_before * 1e3:.1f} ms before, "
        f"{took_after * 1e3:.1f} ms after, ratio {took_before / took_after:.2f}; largest logit "
        f"difference {(before - after).abs().max().item():.1e}"
    )


def demo(limit: int) -> None:
    """The demo's first `limit` problems with oneDNN off, then on."""
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        # a first problem, unmeasured, loads what the runs import (peft, the scorers)
        runs = (("warm-up", True, 1), ("before", False, limit), ("after", True, limit))
        for name, usable, problems in runs:
            out = Path(tmp) / name
            argv = ["run", "--limit", str(problems), "--out", str(out), "--json"]
            with (
                mock.patch.object(cpu_linear, "available", lambda u=usable: u),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                start = time.process_time()
                if dllmbench(argv) != 0:
                    raise SystemExit(f"the demo run ({name}) failed")
                took = time.process_time() - start
            records = [json.loads(line) for line in (out / "samples.jsonl").open()]
            decisions = sorted(
                (r["problem"], r["method"], r["selected"], r["answer"], r["correct"])
                for r in records
            )
            measured[name] = (took, decisions)
    (before, decided), (after, same) = measured["before"], measured["after"]
    print(
        f"\ndllmbench run --limit {limit}: {before:.1f} CPU-s before, {after:.1f} after, ratio "
        f"{before / after:.2f}; {len(decided)} records, same decisions: {decided == same}"
    )


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="canvases in the forward")
    parser.add_argument("--limit", type=int, default=4, help="the demo's first N problems")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not cpu_linear.available():
        raise SystemExit("this torch has no usable oneDNN linear: nothing to compare")
    backbone = Tiny()
    shapes(backbone)
    forward(backbone, args.rows)
    demo(args.limit)


if __name__ == "__main__":
    run()
