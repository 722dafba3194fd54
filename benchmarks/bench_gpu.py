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

`--models block` measures instead the block-diffusion backbone (`block`: SDAR, TraDo) at
Qwen3-8B's shape with its exact KV cache, on `--rows` rows of a 128-token prompt and 512
generated tokens, for each of `--block-lengths` (4, SDAR's, and 32), at the middle of the
generated region, one token per row per step (T = 512, as Dream's step beside it):

- `steady`: a step inside a block, the cache holding the prompt and every earlier block: the
  forward runs the block's own tokens against it;
- `block_start`: a block's first step, which also runs (and stores) the block finished before;
- `per_block`: a block's steps averaged (one start, then steady steps), what a committed
  token costs;
- `uncached`: the steady step with `cache=false`, everything before the block recomputed;
- `dream_step`: Dream-7B's full-canvas `denoise_step` on the same rows (prompt + 512, half of
  the generated region written), and per block length its seconds over the block model's
  (`dream_over_block`: per step against `steady`, per committed token against `per_block`).

Each reports seconds, FLOPs (`step_work` through `flops`), TFLOP/s, MFU and generated
tokens per second, `forward_seconds` the forward alone; the KV cache's bytes (`store.nbytes`
at the steady state, `peak_bytes`) and the CUDA allocator's peak are reported per model.

`--models block-engines` runs the block models end to end instead: `block` (SDAR's sampler,
blocks of 4, Qwen3-8B's shape), `llada2` (the same sampler, blocks of 32, LLaDA2.0-mini's
mixture of experts: 8 of 256 experts routed per token, charged as such), `sdar-moe` (the
same sampler, blocks of 4, SDAR-30B-A3B's mixture of experts: 8 of 128 experts, run as its own
code runs them, one expert at a time) and `fast-dllm-v2` (its own sampler, blocks of 32 and
sub-blocks of 8, Qwen2.5-7B's shape) through the engine, Majority@8 on 8 GSM8K problems with
256 generated tokens at T = 256, every row written to its end (`stop=false`). Each reports
seconds, the ledger's FLOPs as TFLOP/s and MFU, row-passes and generated tokens per second.

    python benchmarks/bench_gpu.py [--models dream,llada] [--json]
    python benchmarks/bench_gpu.py --models block [--block-lengths 4,32] [--json]
    python benchmarks/bench_gpu.py --models block-engines [--json]
    python benchmarks/bench_gpu.py --tiny --json     # a tiny shape on a CPU, in seconds
    python benchmarks/bench_gpu.py --check           # the one GPU check, one table

`--check` runs, in one table: forward, padded forward, `denoise_step` and a shorter engine run
(8 problems × 8 copies, T=8) of Dream's and LLaDA's shapes with SDPA and with packed
attention, then the shipped demo (every family, both budgets) on its first 20 problems in the
dtype on the device (denoising rows per second). With `--tiny`, the same on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

from dllmbench.api.interfaces import StepBatch, model_shape
from dllmbench.core.flops import ModelShape, Work, flops
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.block import BlockDiffusion
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.loading import (
    block_config,
    char_tokenizer,
    llama_config,
    qwen2_config,
)

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
    # Qwen3-8B's config.json: SDAR-8B's and TraDo-8B's backbone
    "block": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
    # LLaDA2.0-mini's config.json (LLaDA2's names): 16B parameters, 8 of 256 experts routed
    "llada2": {
        "model_type": "llada2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 20,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 157184,
        "rope_theta": 600000.0,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 16384,
        "use_qk_norm": True,
        "num_experts": 256,
        "num_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "moe_intermediate_size": 512,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "tie_word_embeddings": False,
    },
    # SDAR-30B-A3B's config.json (Qwen3-30B-A3B's shape): 8 of 128 experts in every layer
    "sdar_moe": {
        "model_type": "sdar_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "tie_word_embeddings": False,
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
    "block": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
    },
}
# LLaDA2's: block's, and 8 experts in 4 groups, 2 routed from 2 groups
TINY["llada2"] = {
    **TINY["block"],
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 32,
}
# SDAR-MoE's: block's, and 8 experts, 2 routed
TINY["sdar_moe"] = {
    **TINY["block"],
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
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
# `--check`: the real shapes with a shorter engine run (8 problems × 8 copies, T=8)
CHECK = Setup(rows=64, length=576, gen_length=512, repeats=2, engine_problems=8,
              engine_copies=8, engine_steps=8)  # fmt: skip
CHECK_DEMO_PROBLEMS = 20  # the demo's first problems, both budgets, every family


@dataclass(frozen=True)
class BlockSetup:
    rows: int
    prompt_length: int
    gen_length: int
    block_lengths: tuple[int, ...]
    tokens_per_step: int  # each row commits this many per step, block model and Dream alike
    repeats: int


BLOCK_FULL = BlockSetup(rows=64, prompt_length=128, gen_length=512, block_lengths=(4, 32),
                        tokens_per_step=1, repeats=3)  # fmt: skip
BLOCK_SMALL = BlockSetup(rows=4, prompt_length=16, gen_length=32, block_lengths=(4, 8),
                         tokens_per_step=1, repeats=2)  # fmt: skip


def random_net(cls, config, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A random-weight transformers model of this config, initialised in the run dtype
    directly on the device (no float32 copy, no host-to-device transfer)."""
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            return cls(config)
    finally:
        torch.set_default_dtype(previous)


def build(arch: str, raw: dict[str, Any], device: torch.device, dtype: torch.dtype, attention: str):
    """A backbone of the project around a random-weight model of the given config.json, its
    denoising forward padded (`sdpa`) or packed (`packed`)."""
    config = qwen2_config(raw) if arch == "dream" else llama_config(raw)
    cls = Qwen2ForCausalLM if arch == "dream" else LlamaForCausalLM
    net = random_net(cls, config, device, dtype)
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


def engine_run(bb, s: Setup, peak: float | None, capped: bool = False) -> dict[str, Any]:
    """Majority@copies on the first problems of GSM8K's test split, end to end: its FLOPs are
    what the engine's ledger charged. `capped`: rows may end before their T (block models)."""
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
    cap = len(problems) * s.engine_copies * s.engine_steps
    assert row_passes <= cap if capped else row_passes == cap, (row_passes, cap)
    out = rate(physical["flops"], seconds, row_passes, peak)
    out["row_passes_per_s"] = out.pop("rows_per_s")
    if capped:  # every row written to its end: gen_length tokens each
        written = len(problems) * s.engine_copies * s.gen_length
        out["tokens_per_s"] = sig(written / seconds)
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


# -- the block-diffusion model's cached step beside Dream's full-canvas step -----------------------


def text_ids(bb, n: int, gen: torch.Generator) -> torch.Tensor:
    """n random ids of the tokenizer's own tokens, never the mask, padding or an end token (a
    written block holding an end token would end its row)."""
    vocab = len(bb.tokenizer)
    banned = sorted({bb.mask_id, bb.pad_id, *bb.stop_ids})
    ids = torch.randint(0, vocab, (n,), generator=gen)
    ids[torch.isin(ids, torch.tensor(banned))] = next(i for i in range(vocab) if i not in banned)
    return ids


def block_backbone(
    net, tokenizer, device, dtype, cls: type = BlockDiffusion, **options: Any
) -> BlockDiffusion:
    """The project's `block` backbone (or `cls`, a subclass) around an in-memory model (the
    weights are shared), with these options."""
    return cls(
        transformer=net,
        tokenizer=tokenizer,
        mask_id=tokenizer.mask_token_id,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        **options,
    )


def step_rate(
    work: float, seconds: float, rows: int, k: int, peak: float | None, **extra: float
) -> dict[str, Any]:
    """`rate` of one step of `rows` rows that each commit k tokens, with its FLOPs and the
    generated tokens per second."""
    return {
        **rate(work, seconds, rows, peak),
        "flops": sig(work),
        "tokens_per_s": sig(rows * k / seconds),
        **{key: sig(value) for key, value in extra.items()},
    }


def block_steps(
    net, tokenizer, prompts: list[torch.Tensor], s: BlockSetup, block: int, device, dtype, peak
) -> dict[str, Any]:
    """The cached step of one block length at the middle of the generated region: inside a
    block, at a block's start, averaged over a block, and recomputed without the cache."""
    cached = block_backbone(net, tokenizer, device, dtype, block_length=block, cache=True)
    plain = block_backbone(net, tokenizer, device, dtype, block_length=block, cache=False)
    shape = model_shape(cached)
    assert shape is not None
    k, n = s.tokens_per_step, len(prompts)
    total = s.gen_length // k
    # SDAR's schedule: T spread evenly over the blocks, k tokens at every step of a block
    per, blocks = block // k, s.gen_length // block  # steps per block, blocks to write
    if s.prompt_length % block or s.gen_length % block or block % k or per < 2 or blocks < 2:
        raise ValueError(
            f"block_length {block} must divide the prompt ({s.prompt_length}) and gen_length "
            f"({s.gen_length}) into two blocks or more, of two steps or more of {k} tokens"
        )
    gen = torch.Generator().manual_seed(block)
    first = s.prompt_length // block  # the first block holding a generated position
    current = first + blocks // 2
    lo = current * block
    plens = [len(p) for p in prompts]

    def batch(rows: list[torch.Tensor], step: int) -> StepBatch:
        return StepBatch(rows, plens, [step] * n, list(range(n)), total)

    # every generated position before the current block written; steady: half the block too
    base = []
    for p in prompts:
        row = cached.canvas(p.tolist(), s.gen_length)
        row[len(p) : lo] = text_ids(cached, lo - len(p), gen)
        base.append(row)
    steady_rows = [r.clone() for r in base]
    for r in steady_rows:
        r[lo : lo + per // 2 * k] = text_ids(cached, per // 2 * k, gen)
    steady = batch(steady_rows, (current - first) * per + per // 2)
    # block starts: the block before the current one written anew for each call, so that
    # each call finds the cache up to it and stores it
    starts = []
    for _ in range(s.repeats + 1):
        rows = [r.clone() for r in base]
        for r, plen in zip(rows, plens, strict=True):
            at = max(lo - block, plen)
            r[at:lo] = text_ids(cached, lo - at, gen)
        starts.append(batch(rows, (current - first) * per))

    for p in prompts:
        cached.hold(p.tolist())
    cached.denoise_step(steady)  # fills the cache: the prompt and every block before this one
    cache_bytes = cached.store.nbytes
    plans = [cached.plan(r, plen, block) for r, plen in zip(steady_rows, plens, strict=True)]
    assert all(pl is not None and pl.start == lo for pl in plans), "the cache holds [0, lo)"
    t_steady_fwd = timed(lambda: cached.run(steady_rows, plans), device, s.repeats)
    before, ran = cached.computed_queries, []
    t_steady = timed(lambda: ran.append(cached.denoise_step(steady)), device, s.repeats)
    assert cached.computed_queries - before == len(ran) * n * block  # the block alone
    w_steady = sum(flops(shape, w) for w in cached.step_work(steady))

    rows0 = list(starts[0].tokens)
    plans0 = [cached.plan(r, plen, block) for r, plen in zip(rows0, plens, strict=True)]
    assert all(pl is not None and pl.start == lo - block for pl in plans0)
    t_start_fwd = timed(lambda: cached.run(rows0, plans0), device, s.repeats)
    w_start = sum(flops(shape, w) for w in cached.step_work(starts[0]))
    calls = iter(starts)  # `timed` makes repeats + 1 calls
    before, ran = cached.computed_queries, []
    t_start = timed(lambda: ran.append(cached.denoise_step(next(calls))), device, s.repeats)
    # each call ran the finished block and the current one: the cache held the rest
    assert cached.computed_queries - before == len(ran) * n * 2 * block
    cache_peak = cached.store.peak_bytes
    for p in prompts:
        cached.release(p.tolist())
    assert cached.store.nbytes == 0

    plain_plans = [plain.plan(r, plen, block) for r, plen in zip(steady_rows, plens, strict=True)]
    t_plain_fwd = timed(lambda: plain.run(steady_rows, plain_plans), device, s.repeats)
    t_plain = timed(lambda: plain.denoise_step(steady), device, s.repeats)
    w_plain = sum(flops(shape, w) for w in plain.step_work(steady))

    # a block's steps: one start, then steady ones
    t_block = (t_start + (per - 1) * t_steady) / per
    w_block = (w_start + (per - 1) * w_steady) / per
    c = net.config  # a token's keys and values in every layer
    kv_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * cached.dtype.itemsize
    return {
        "block_length": block,
        "steps_per_block": per,
        "total_steps": total,
        "context": lo,  # positions before the current block: the cached prefix of a row
        "steady": step_rate(w_steady, t_steady, n, k, peak, forward_seconds=t_steady_fwd),
        "block_start": step_rate(w_start, t_start, n, k, peak, forward_seconds=t_start_fwd),
        "per_block": step_rate(w_block, t_block, n, k, peak),
        "uncached": step_rate(w_plain, t_plain, n, k, peak, forward_seconds=t_plain_fwd),
        "cache": {
            "bytes": cache_bytes,  # store.nbytes at the steady step: every row's [0, context)
            "tokens": n * lo,
            "bytes_per_token": kv_token,
            "peak_bytes": cache_peak,  # store.peak_bytes, the block starts' blocks included
        },
    }


def dream_step(
    raw: dict[str, Any], prompts: list[torch.Tensor], s: BlockSetup, device, dtype, peak, attention
) -> dict[str, Any]:
    """Dream's full-canvas `denoise_step` on the same prompts and generated length, halfway:
    half of each row's generated positions written, at step T/2."""
    bb = build("dream", raw, device, dtype, attention)
    shape = model_shape(bb)
    assert shape is not None
    k, n = s.tokens_per_step, len(prompts)
    total = s.gen_length // k
    gen = torch.Generator().manual_seed(1)
    rows = []
    for p in prompts:
        row = bb.canvas(p.tolist(), s.gen_length)
        half = s.gen_length // 2
        written = torch.randperm(s.gen_length, generator=gen)[:half] + len(p)
        row[written] = text_ids(bb, half, gen)
        rows.append(row)
    batch = StepBatch(rows, [len(p) for p in prompts], [total // 2] * n, list(range(n)), total)
    ids, attn, _ = bb.pad(rows)
    t_fwd = timed(lambda: bb.hidden(ids, attn), device, s.repeats)
    t_step = timed(lambda: bb.denoise_step(batch), device, s.repeats)
    work = sum(flops(shape, w) for w in bb.step_work(batch))
    out = {
        "length": max(len(r) for r in rows),
        "matmul_params": shape.params + shape.head,
        **step_rate(work, t_step, n, k, peak, forward_seconds=t_fwd),
        "peak_memory_gib": sig(peak_memory_gib(device)),
    }
    return out


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def block_bench(
    raw: dict[str, Any], dream_raw: dict[str, Any], s: BlockSetup, device, dtype, peak,
    attention: str = "sdpa",
) -> dict[str, Any]:  # fmt: skip
    """The block model's cached steps per block length, then Dream's step beside them."""
    free(device)
    tokenizer = char_tokenizer()
    net = random_net(Qwen3ForCausalLM, block_config(raw, qwen3=True), device, dtype)
    probe = block_backbone(net, tokenizer, device, dtype, block_length=s.block_lengths[0])
    shape = model_shape(probe)
    assert shape is not None
    gen = torch.Generator().manual_seed(0)
    prompts = [text_ids(probe, s.prompt_length, gen) for _ in range(s.rows)]  # one per problem
    c = net.config
    out: dict[str, Any] = {
        "shape": {
            "layers": c.num_hidden_layers,
            "hidden": c.hidden_size,
            "intermediate": c.intermediate_size,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab_size,
        },
        "matmul_params": shape.params + shape.head,
        "head_params": shape.head,
        "rows": s.rows,
        "prompt_length": s.prompt_length,
        "gen_length": s.gen_length,
        "tokens_per_step": s.tokens_per_step,
        "blocks": {
            str(b): block_steps(net, tokenizer, prompts, s, b, device, dtype, peak)
            for b in s.block_lengths
        },
        "peak_memory_gib": sig(peak_memory_gib(device)),
    }
    del net, probe
    free(device)
    dream = dream_step(dream_raw, prompts, s, device, dtype, peak, attention)
    out["dream_step"] = dream
    for m in out["blocks"].values():
        # Dream's seconds over the block model's: per step (steady), per committed token (a
        # block's steps averaged; both commit tokens_per_step per row per step)
        m["dream_over_block"] = {
            "per_step": sig(dream["seconds"] / m["steady"]["seconds"]),
            "per_token": sig(m["per_block"]["tokens_per_s"] / dream["tokens_per_s"]),
        }
    free(device)
    return out


# `--models block-engines`: SDAR's sampler (blocks of 4) at Qwen3-8B's shape and Fast-dLLM v2's
# (blocks of 32, sub-blocks of 8) at Qwen2.5-7B's, each through the engine at T = gen_length
ENGINES = Setup(rows=64, length=0, gen_length=256, repeats=1, engine_problems=8,
                engine_copies=8, engine_steps=256)  # fmt: skip
ENGINES_SMALL = Setup(rows=4, length=0, gen_length=32, repeats=1, engine_problems=2,
                      engine_copies=2, engine_steps=32)  # fmt: skip


def block_engines(device, dtype, peak, tiny: bool) -> dict[str, Any]:
    """`block`, `llada2` and `fast-dllm-v2` end to end: the engine's Majority@copies on GSM8K
    problems, rows written to the end (`stop=false`: a random model's end tokens do not end
    them), each charged the steps it took."""
    from transformers import Glm4MoeForCausalLM, Qwen3MoeForCausalLM

    from dllmbench.plugins.backbones.fast_dllm_v2 import FastDLLMv2
    from dllmbench.plugins.backbones.llada2 import LLaDA2
    from dllmbench.plugins.backbones.llada2_moe import llada2_config

    s = ENGINES_SMALL if tiny else ENGINES
    out: dict[str, Any] = {}
    for name, cls, shape in (
        ("block", BlockDiffusion, "block"),
        ("llada2", LLaDA2, "llada2"),
        ("sdar-moe", BlockDiffusion, "sdar_moe"),
        ("fast-dllm-v2", FastDLLMv2, "dream"),
    ):
        free(device)
        raw = {**SHAPES[shape], **(TINY[shape] if tiny else {})}
        if cls is LLaDA2:
            net = random_net(Glm4MoeForCausalLM, llada2_config(raw), device, dtype)
        elif shape == "sdar_moe":
            config = block_config(raw, qwen3=True, experts=True)
            net = random_net(Qwen3MoeForCausalLM, config, device, dtype)
        else:
            qwen3 = cls is BlockDiffusion
            net_cls = Qwen3ForCausalLM if qwen3 else Qwen2ForCausalLM
            net = random_net(net_cls, block_config(raw, qwen3=qwen3), device, dtype)
        bb = block_backbone(net, char_tokenizer(), device, dtype, cls, stop=False)
        shape_of = model_shape(bb)
        assert shape_of is not None
        out[name] = {
            "matmul_params": shape_of.params + shape_of.head,
            "block_length": bb.config.block_length,
            **engine_run(bb, s, peak, capped=True),
            "peak_memory_gib": sig(peak_memory_gib(device)),
        }
        del bb, net
    free(device)
    return out


def engines_text(m: dict[str, Any]) -> list[str]:
    lines = []
    for name, r in m.items():
        lines.append(
            f"{name}: {r['matmul_params'] / 1e6:,.1f} M matmul parameters, blocks of "
            f"{r['block_length']}, {r['problems']} problems × {r['copies']} copies, "
            f"gen_length {r['gen_length']}, T={r['steps']}, peak memory "
            f"{r['peak_memory_gib']:.2f} GiB"
        )
        lines.append(
            f"  engine {r['seconds']:9.4g} s  {r['tflops']:9.4g} TFLOP/s  MFU {mfu_cell(r):>6}  "
            f"{r['row_passes']} row-passes ({r['row_passes_per_s']:.4g}/s)  "
            f"{r['tokens_per_s']:.4g} tokens/s"
        )
    return lines


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
        if name == "block":
            lines += block_text(m)
            continue
        if name == "block-engines":
            lines += engines_text(m)
            continue
        lines.append(
            f"{name}: {m['matmul_params'] / 1e6:,.1f} M matmul parameters, {m['rows']} rows × "
            f"{m['length']} tokens, peak memory {m['peak_memory_gib']:.2f} GiB"
        )
        for key in MEASURES:
            r = m[key]
            lines.append(
                f"  {key:<15} {r['seconds']:9.4g} s  {r['tflops']:9.4g} TFLOP/s  "
                f"MFU {mfu_cell(r):>6}  {per_second(r):9.4g} "
                f"{'row-passes' if key == 'engine' else 'rows'}/s"
            )
    return "\n".join(lines)


MEASURES = ("forward", "forward_padded", "denoise_step", "engine")  # a model's, in order


def mfu_cell(r: dict[str, Any]) -> str:
    return f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "–"


def per_second(r: dict[str, Any]) -> float:
    """Rows per second of a forward or step; row-passes per second of the engine."""
    return r.get("rows_per_s", r.get("row_passes_per_s"))


def block_text(m: dict[str, Any]) -> list[str]:
    def row(label: str, r: dict[str, Any]) -> str:
        fwd = r.get("forward_seconds")
        return (
            f"  {label:<18} {r['seconds']:9.4g} s {r['flops'] / 1e12:9.4g} TFLOP "
            f"{r['tflops']:8.4g} TFLOP/s  MFU {mfu_cell(r):>6} {r['tokens_per_s']:9.4g} tok/s"
            + (f"  forward {fwd:.4g} s" if fwd is not None else "")
        )

    d = m["dream_step"]
    lines = [
        f"block ({m['shape']['layers']} layers, hidden {m['shape']['hidden']}): "
        f"{m['matmul_params'] / 1e6:,.1f} M matmul parameters, "
        f"{m['rows']} rows × ({m['prompt_length']} prompt + {m['gen_length']} generated), "
        f"{m['tokens_per_step']} token/row/step, peak memory {m['peak_memory_gib']:.2f} GiB"
    ]
    for b, r in m["blocks"].items():
        cache, ratio = r["cache"], r["dream_over_block"]
        lines += [
            f" block_length {b}: {r['steps_per_block']} steps per block, T={r['total_steps']}, "
            f"at position {r['context']}; KV cache {cache['bytes'] / 2**30:.3f} GiB "
            f"({cache['tokens']:,} tokens × {cache['bytes_per_token'] / 2**10:.4g} KiB), "
            f"peak {cache['peak_bytes'] / 2**30:.3f} GiB",
            row("steady (cached)", r["steady"]),
            row("block start", r["block_start"]),
            row("per block (mean)", r["per_block"]),
            row("uncached", r["uncached"]),
            f"  Dream step / block step: {ratio['per_step']:.4g}× per step (steady), "
            f"{ratio['per_token']:.4g}× per committed token (per block)",
        ]
    lines += [
        f" dream (full canvas, {d['matmul_params'] / 1e6:,.1f} M matmul parameters, "
        f"{m['rows']} rows × {d['length']} tokens, peak memory {d['peak_memory_gib']:.2f} GiB)",
        row("denoise_step", d),
    ]
    return lines


def demo_rows_per_s(
    device: torch.device, dtype: torch.dtype, limit: int, *argv: str
) -> dict[str, Any]:
    """The shipped demo (every family, both budgets; `argv` adds to `run`'s) on its first
    `limit` problems with the tiny model on `device` in `dtype`: its seconds, and denoising
    rows per second of forward (compute.json's own seconds) and of the whole run."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from dllmbench.cli import build_parser
    from dllmbench.cli.run import run_config
    from dllmbench.running.runner import run

    cfg = run_config(build_parser().parse_args(["run", "--limit", str(limit), *argv]))
    options = {"device": str(device), "dtype": str(dtype).removeprefix("torch.")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        cfg = dataclasses.replace(
            cfg, backbone_config={**cfg.backbone_config, **options}, out=str(out)
        )
        start = time.perf_counter()
        run(cfg)
        seconds = time.perf_counter() - start
        denoise = json.loads((out / "compute.json").read_text())["total"]["physical"]["denoise"]
    return {
        "problems": limit,
        "seconds": sig(seconds),
        "rows": denoise["rows"],
        "rows_per_s_forward": sig(denoise["rows"] / denoise["seconds"]),
        "rows_per_s": sig(denoise["rows"] / seconds),
    }


def check(device: torch.device, dtype: torch.dtype, peak: float | None, tiny: bool) -> dict:
    """The one GPU check: forward, step and engine of Dream's and LLaDA's shapes in both
    attention modes, and the demo in `dtype`."""
    setup = SMALL if tiny else CHECK
    out: dict[str, Any] = {"models": {}}
    # wall seconds of each part, building the model and compiling included: where the
    # check's minutes go
    out["wall_seconds"] = {}
    for attention in ("sdpa", "packed"):
        for arch in ("dream", "llada"):
            raw = {**SHAPES[arch], **(TINY[arch] if tiny else {})}
            start = time.perf_counter()
            out["models"][f"{arch}/{attention}"] = bench(
                arch, raw, setup, device, dtype, peak, attention
            )
            out["wall_seconds"][f"{arch}/{attention}"] = sig(time.perf_counter() - start)
    # --tiny: one problem at the first budget, in seconds
    demo = (1, "--budget", "208") if tiny else (CHECK_DEMO_PROBLEMS,)
    start = time.perf_counter()
    out["demo"] = demo_rows_per_s(device, dtype, demo[0], *demo[1:])
    out["wall_seconds"]["demo"] = sig(time.perf_counter() - start)
    return out


def check_text(report: dict[str, Any]) -> str:
    """The check as one table: a row per model, attention mode and measure, then the demo."""
    lines = [
        f"{report['device']} · {report['dtype']} · torch {report['torch']} · transformers "
        f"{report['transformers']} · peak {report['peak_tflops'] or '–'} TFLOP/s",
        f"{'model':<8} {'attention':<9} {'measure':<15} {'seconds':>9} {'TFLOP/s':>9} "
        f"{'MFU':>6} {'per second':>12}",
    ]
    for name, m in report["check"]["models"].items():
        arch, attention = name.split("/")
        for key in MEASURES:
            r = m[key]
            lines.append(
                f"{arch:<8} {attention:<9} {key:<15} {r['seconds']:9.4g} {r['tflops']:9.4g} "
                f"{mfu_cell(r):>6} {per_second(r):12.4g}"
            )
    d = report["check"]["demo"]
    lines.append(
        f"demo     {report['dtype']:<9} {d['problems']} problems  {d['seconds']:9.4g} s, "
        f"{d['rows_per_s']:.4g} rows/s ({d['rows_per_s_forward']:.4g} in the forward)"
    )
    wall = report["check"]["wall_seconds"]
    parts = ", ".join(f"{name} {seconds:.3g}" for name, seconds in wall.items())
    lines.append(f"wall seconds: {parts}; {sum(wall.values()):.4g} in all")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default="dream,llada",
        help="comma-separated: dream, llada, block (the block model's cached step beside "
        "Dream's), block-engines (block, llada2 and fast-dllm-v2 through the engine)",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny shape, on a CPU in seconds")
    parser.add_argument("--device", help="default: cuda when available (not with --tiny)")
    parser.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--peak-tflops", type=float, help="for MFU; default by device name")
    parser.add_argument("--rows", type=int, help="rows per forward")
    parser.add_argument(
        "--attention",
        choices=["sdpa", "packed"],
        default="sdpa",
        help="the backbones' denoising forward: left-padded SDPA or packed FlexAttention",
    )
    parser.add_argument(
        "--block-lengths",
        help="block: comma-separated block lengths (default 4,32; --tiny: 4,8)",
    )
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        help="block: tokens each row commits per step, block model and Dream alike (default 1)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="the one GPU check: dream and llada in both attention modes (a shorter engine "
        "run), and the demo in the dtype, as one table",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-file", help="also write the JSON report to this file")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny  # --tiny: a CPU's check unless told
    device = torch.device(args.device or ("cuda" if gpu else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    setup = SMALL if args.tiny else FULL
    block_setup = BLOCK_SMALL if args.tiny else BLOCK_FULL
    if args.rows:
        setup = Setup(**{**setup.__dict__, "rows": args.rows})
        block_setup = BlockSetup(**{**block_setup.__dict__, "rows": args.rows})
    if args.block_lengths:
        lengths = tuple(int(b) for b in args.block_lengths.split(","))
        block_setup = BlockSetup(**{**block_setup.__dict__, "block_lengths": lengths})
    if args.tokens_per_step:
        block_setup = BlockSetup(
            **{**block_setup.__dict__, "tokens_per_step": args.tokens_per_step}
        )
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
    if args.check:
        import transformers

        report.pop("attention")
        report["transformers"] = transformers.__version__
        report["check"] = check(device, dtype, peak, args.tiny)
        models = []
    for arch in models:
        if arch == "block-engines":
            report["models"][arch] = block_engines(device, dtype, peak, args.tiny)
            continue
        raw = {**SHAPES[arch], **(TINY[arch] if args.tiny else {})}
        if arch == "block":
            dream = {**SHAPES["dream"], **(TINY["dream"] if args.tiny else {})}
            report["models"][arch] = block_bench(
                raw, dream, block_setup, device, dtype, peak, args.attention
            )
            continue
        report["models"][arch] = bench(arch, raw, setup, device, dtype, peak, args.attention)
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(report, f, indent=2)
    text = check_text(report) if args.check else report_text(report)
    print(json.dumps(report, indent=2) if args.json else text)


if __name__ == "__main__":
    main()
