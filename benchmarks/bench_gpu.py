"""GPU benchmark: the forward of Dream-7B's and LLaDA-8B's shapes, and the engine around it.

Builds random-weight models of the real shapes (nothing is downloaded; a character tokenizer)
and times, for a batch of `--rows` rows:

- `forward`: the raw bidirectional forward (trunk and LM head) on same-length rows of real
  tokens, no attention mask;
- `forward_padded`: the same number of rows with mixed lengths as the backbones batch them
  (left-padded to the longest with the key-padding mask and re-based positions, or packed with
  `--attention packed`); its `padding` is compute.json's ratio, tokens computed / real tokens
  (1.0 is no padding);
- `denoise_step`: the project's step on those mixed-length canvases (prompt + masked region,
  step 0): forward, sampler and noise;
- `engine`: an end-to-end engine run on GSM8K (the packaged test split), Majority@copies.

Per measurement it reports seconds, TFLOP/s, MFU and rows per second, and per model the peak
memory. FLOPs are the ledger's own (`dllmbench.core.flops`, one formula): a forward over a row
of s real tokens (padding not counted) with the LM head applied at h positions is

    FLOPs = 2 · P · s  +  2 · P_head · h  +  4 · layers · width · s²

P is every matmul weight a token is multiplied by but the LM head's (P_head); the embedding is
a lookup; the last term is attention (QKᵀ and AV; width is heads × head dim). The raw and
padded forwards apply the head everywhere (h = s); `denoise_step` and the engine are counted by
the backbone's `step_work` (the head only at the masked positions the sampler reads), the
engine from its own ledger. MFU is TFLOP/s over `--peak-tflops` (default by device: H100 and
H200 989, bf16 dense); without a known peak (a CPU) it is null.

    python benchmarks/bench_gpu.py [--models dream,llada] [--json]
    python benchmarks/bench_gpu.py --tiny --json     # a tiny shape on a CPU, in seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

from dllmbench.api.interfaces import StepBatch, model_shape
from dllmbench.core.flops import ModelShape, Work, flops
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.loading import char_tokenizer, llama_config, qwen2_config

# config.json shapes of Dream-v0-Instruct-7B (Qwen2.5-7B) and LLaDA-8B (OLMo naming)
SHAPES: dict[str, dict[str, Any]] = {
    "dream": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    "llada": {
        "d_model": 4096,
        "mlp_hidden_size": 12288,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 32,
        "vocab_size": 126464,
        "rope_theta": 5e5,
        "rms_norm_eps": 1e-5,
        "max_sequence_length": 4096,
    },
}
# --tiny: the same architectures at a few layers and a small width
TINY = {
    "dream": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
    "llada": {
        "d_model": 64,
        "mlp_hidden_size": 128,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 4,
        "vocab_size": 512,
    },
}
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}  # bf16 dense


@dataclass(frozen=True)
class Setup:
    rows: int
    length: int  # the widest canvas: prompt + generated region
    gen_length: int
    repeats: int
    engine_problems: int
    engine_copies: int
    engine_steps: int


FULL = Setup(rows=64, length=576, gen_length=512, repeats=3, engine_problems=16,
             engine_copies=8, engine_steps=32)  # fmt: skip
SMALL = Setup(rows=4, length=48, gen_length=32, repeats=2, engine_problems=2,
              engine_copies=2, engine_steps=4)  # fmt: skip


def build(arch: str, raw: dict[str, Any], device: torch.device, dtype: torch.dtype, attention: str):
    """A backbone of the project around a random-weight model of the given config.json, its
    denoising forward padded (`sdpa`) or packed (`packed`)."""
    config = qwen2_config(raw) if arch == "dream" else llama_config(raw)
    config._attn_implementation = "sdpa"
    cls = Qwen2ForCausalLM if arch == "dream" else LlamaForCausalLM
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the run dtype, on the device
    try:
        with torch.device(device):
            torch.manual_seed(0)
            net = cls(config)
    finally:
        torch.set_default_dtype(previous)
    backbone_cls = Dream if arch == "dream" else LLaDA
    return backbone_cls(
        transformer=net,
        tokenizer=char_tokenizer(),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        attention=attention,
    )


def full_forwards(shape: ModelShape, lengths: list[int]) -> int:
    """FLOPs of full forwards over rows of these lengths, the LM head at every position."""
    return sum(flops(shape, Work.full(s)) for s in lengths)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """The median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sig(x: float) -> float:
    """Four significant digits (a tiny CPU run's TFLOP/s are far below 0.001)."""
    return float(f"{x:.4g}")


def rate(work: float, seconds: float, rows: int, peak: float | None) -> dict[str, Any]:
    tflops = work / seconds / 1e12
    return {
        "seconds": sig(seconds),
        "tflops": sig(tflops),
        "mfu": sig(tflops / peak) if peak else None,
        "rows_per_s": sig(rows / seconds),
    }


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def forwards(bb, shape: ModelShape, s: Setup, peak: float | None) -> dict[str, Any]:
    """The raw forward, the padded forward and `denoise_step` on one batch of rows."""
    net, device = bb.transformer, bb.device
    gen = torch.Generator().manual_seed(0)
    vocab = len(bb.tokenizer)  # real tokens of the tokenizer, never the mask
    same = torch.randint(0, vocab, (s.rows, s.length), generator=gen)
    same[same == bb.mask_id] = 0

    @torch.no_grad()
    def raw() -> None:
        hidden = net.model(input_ids=same.to(device)).last_hidden_state
        net.lm_head(hidden)

    # mixed lengths: the prompt part runs from half the widest prompt to all of it
    widest = s.length - s.gen_length
    prompts = torch.linspace(max(1, widest // 2), widest, s.rows).round().long().tolist()
    canvases = [bb.canvas(same[i, :p].tolist(), s.gen_length) for i, p in enumerate(prompts)]
    lengths = [len(c) for c in canvases]
    ids, attn, _ = bb.pad(canvases)

    def padded() -> None:
        bb.head(bb.hidden(ids, attn))

    batch = StepBatch(
        tokens=canvases,
        prompt_lens=prompts,
        steps=[0] * s.rows,
        keys=list(range(s.rows)),
        total_steps=s.engine_steps,
    )
    t_raw = timed(raw, device, s.repeats)
    t_padded = timed(padded, device, s.repeats)
    t_step = timed(lambda: bb.denoise_step(batch), device, s.repeats)
    mixed = full_forwards(shape, lengths)
    stepped = sum(flops(shape, w) for w in bb.step_work(batch))
    return {
        "forward": rate(full_forwards(shape, [s.length] * s.rows), t_raw, s.rows, peak),
        "forward_padded": {
            **rate(mixed, t_padded, s.rows, peak),
            # compute.json's ratio: tokens computed / real tokens (1.0 is no padding)
            "padding": sig(bb.computed_tokens(lengths) / sum(lengths)),
        },
        "denoise_step": {
            **rate(stepped, t_step, s.rows, peak),
            "vs_padded_forward": sig(t_step / t_padded),
        },
    }


def engine_run(bb, s: Setup, peak: float | None) -> dict[str, Any]:
    """Majority@copies on the first problems of GSM8K's test split, end to end: its FLOPs are
    what the engine's ledger charged."""
    reg = registry()
    task = reg.task("gsm8k")
    problems = task.problems("test")[: s.engine_problems]
    method = Method.build(reg, MethodSpec.parse(f"independent:n={s.engine_copies}+majority"))
    engine = Engine(
        backbone=bb,
        scorers={},
        task=task,
        methods=[method],
        sampling=Sampling(s.engine_steps, s.gen_length, "chat", 0),
        capacity=Capacity(batch_rows=s.rows, problems=s.engine_problems),
    )
    sync(bb.device)
    start = time.perf_counter()
    records = engine.run(problems)
    sync(bb.device)
    seconds = time.perf_counter() - start
    physical = engine.ledger.physical()["denoise"]
    row_passes = physical["rows"]
    assert len(records) == len(problems)
    assert row_passes == len(problems) * s.engine_copies * s.engine_steps
    out = rate(physical["flops"], seconds, row_passes, peak)
    out["row_passes_per_s"] = out.pop("rows_per_s")
    return {
        "problems": len(problems),
        "copies": s.engine_copies,
        "steps": s.engine_steps,
        "gen_length": s.gen_length,
        "row_passes": row_passes,
        **out,
    }


def bench(
    arch: str, raw: dict[str, Any], s: Setup, device, dtype, peak, attention: str = "sdpa"
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bb = build(arch, raw, device, dtype, attention)
    shape = model_shape(bb)
    assert shape is not None
    c = bb.transformer.config
    out = {
        "shape": {
            "layers": c.num_hidden_layers,
            "hidden": c.hidden_size,
            "intermediate": c.intermediate_size,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "vocab": c.vocab_size,
        },
        "matmul_params": shape.params + shape.head,
        "head_params": shape.head,
        "rows": s.rows,
        "length": s.length,
        **forwards(bb, shape, s, peak),
        "engine": engine_run(bb, s, peak),
        "peak_memory_gib": sig(peak_memory_gib(device)),
    }
    del bb
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def default_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def report_text(report: dict[str, Any]) -> str:
    lines = [
        f"{report['device']} · {report['dtype']} · {report.get('attention', 'sdpa')} attention"
        f" · peak {report['peak_tflops'] or '–'} TFLOP/s"
    ]
    for name, m in report["models"].items():
        lines.append(
            f"{name}: {m['matmul_params'] / 1e6:,.1f} M matmul parameters, {m['rows']} rows × "
            f"{m['length']} tokens, peak memory {m['peak_memory_gib']:.2f} GiB"
        )
        for key in ("forward", "forward_padded", "denoise_step", "engine"):
            r = m[key]
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "–"
            per_s = r.get("rows_per_s", r.get("row_passes_per_s"))
            lines.append(
                f"  {key:<15} {r['seconds']:9.4g} s  {r['tflops']:9.4g} TFLOP/s  MFU {mfu:>6}  "
                f"{per_s:9.4g} {'row-passes' if key == 'engine' else 'rows'}/s"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="dream,llada", help="comma-separated: dream, llada")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape, on a CPU in seconds")
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    parser.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--peak-tflops", type=float, help="for MFU; default by device name")
    parser.add_argument("--rows", type=int, help="rows per forward")
    parser.add_argument(
        "--attention",
        choices=["sdpa", "packed"],
        default="sdpa",
        help="the backbones' denoising forward: left-padded SDPA or packed FlexAttention",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    setup = SMALL if args.tiny else FULL
    if args.rows:
        setup = Setup(**{**setup.__dict__, "rows": args.rows})
    peak = args.peak_tflops or default_peak(device)
    models = [m.strip() for m in args.models.split(",")]
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "peak_tflops": peak,
        # peak_memory_gib: the CUDA allocator's peak per model, or the process's peak RSS
        "memory": "cuda max allocated" if device.type == "cuda" else "process max RSS",
        "tiny": args.tiny,
        "attention": args.attention,
        "models": {},
    }
    with contextlib.suppress(AttributeError):
        torch.backends.cuda.matmul.allow_tf32 = True
    for arch in models:
        raw = {**SHAPES[arch], **(TINY[arch] if args.tiny else {})}
        report["models"][arch] = bench(arch, raw, setup, device, dtype, peak, args.attention)
    print(json.dumps(report, indent=2) if args.json else report_text(report))


if __name__ == "__main__":
    main()
