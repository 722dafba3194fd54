"""Training a small block-diffusion LM (SDAR-style, on transformers' Qwen3) from scratch.

Used to build the shipped block demo (`tiny_block/`, the `tiny-block` backbone): the word
tokenizer, the arith examples and the learning-rate schedule of pretrain.py, a Qwen3 stack
trained under the block-causal mask the `block` backbone samples with. Blocks of
`block_length` are counted from absolute position 0, so a prompt's tail shares its block with
the first answer tokens, as in `BlockDiffusion.canvas`.

Each example is a prompt followed by its answer padded with EOS to `gen_length` and cut at
the last block boundary within prompt + gen_length (the sampler's canvas). Every block of the
answer is trained at once: each draws its own noise level t ~ U(eps, 1) and masks each of
its answer positions with probability t; the model reads the clean blocks before it and the
noisy block itself, and learns the masked tokens (cross-entropy weighted 1/t, the ELBO of
masked diffusion; no logit shift). One forward carries both: the clean sequence followed by
the noisy answer blocks, with the same positions, under an additive mask where a clean token
sees the clean blocks up to its own and a noisy token its own noisy block and the clean blocks
before it (the doubled sequence of BD3-LM and SDAR's training).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dllmbench.demo.pretrain import PretrainConfig, answer_tokens, fit, save_checkpoint


@dataclass(frozen=True)
class BlockPretrainConfig(PretrainConfig):
    """PretrainConfig's schedule and shape, at the block demo's defaults, with the KV heads and
    the block length."""

    steps: int = 2000
    batch: int = 64
    lr: float = 2e-3
    intermediate: int = 256
    gen_length: int = 32
    kv_heads: int = 4
    block_length: int = 4


def build_model(vocab: int, cfg: BlockPretrainConfig, tokenizer: PreTrainedTokenizerFast):
    config = Qwen3Config(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        vocab_size=vocab,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(cfg.seed)
    return Qwen3ForCausalLM(config)


def canvas_tokens(
    tokenizer: PreTrainedTokenizerFast, prompt: str, answer: str, gen_length: int, block: int
) -> tuple[list[int], int]:
    """(prompt + answer ids up to the canvas's end, prompt length): the answer padded with EOS
    to `gen_length`, cut at the last block boundary within prompt + gen_length."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    end = (len(prompt_ids) + gen_length) // block * block
    answer_ids = answer_tokens(tokenizer, answer, gen_length)[: end - len(prompt_ids)]
    return prompt_ids + answer_ids, len(prompt_ids)


def block_batch(
    rows: list[tuple[list[int], int]],
    block: int,
    mask_id: int,
    pad: int,
    eps: float,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    """The doubled sequences of a batch: each row's clean tokens [0, end) then its noisy answer
    blocks [first block, end), each half right-padded; the additive block-causal mask
    [B, 1, W, W], positions, the noisy targets and their 1/t weights."""
    clean_w = max(len(ids) for ids, _ in rows)
    starts = [plen // block * block for _, plen in rows]
    noisy_w = max(len(ids) - s for (ids, _), s in zip(rows, starts, strict=True))
    width = clean_w + noisy_w
    n = len(rows)
    ids = torch.full((n, width), pad, dtype=torch.long)
    targets = torch.full((n, width), -100, dtype=torch.long)
    weights = torch.zeros((n, width))
    positions = torch.zeros((n, width), dtype=torch.long)
    blocks = torch.full((n, width), -1, dtype=torch.long)  # -1: padding
    noisy = torch.zeros((n, width), dtype=torch.bool)
    noisy[:, clean_w:] = True
    answer_positions = 0
    for i, ((row, plen), start) in enumerate(zip(rows, starts, strict=True)):
        clean = torch.tensor(row)
        length = len(row)
        ids[i, :length] = clean
        positions[i, :length] = torch.arange(length)
        blocks[i, :length] = torch.arange(length) // block
        part = clean[start:]
        where = torch.arange(start, length)
        t = eps + (1 - eps) * torch.rand((length - start + block - 1) // block, generator=gen)
        level = t[(where - start) // block]
        masked = (torch.rand(len(part), generator=gen) < level) & (where >= plen)
        lo = clean_w
        ids[i, lo : lo + len(part)] = torch.where(masked, mask_id, part)
        positions[i, lo : lo + len(part)] = where
        blocks[i, lo : lo + len(part)] = where // block
        targets[i, lo : lo + len(part)] = torch.where(masked, part, -100)
        weights[i, lo : lo + len(part)] = torch.where(masked, 1 / level, 0.0)
        answer_positions += length - plen
    # who sees whom: clean → clean blocks up to its own; noisy → its own noisy block and the
    # clean blocks before it; padding → itself (a row never attends to padding)
    bq, bk = blocks[:, :, None], blocks[:, None, :]
    nq, nk = noisy[:, :, None], noisy[:, None, :]
    real = (bq >= 0) & (bk >= 0)
    allowed = real & ((~nq & ~nk & (bk <= bq)) | (nq & ~nk & (bk < bq)) | (nq & nk & (bk == bq)))
    allowed |= torch.eye(width, dtype=torch.bool)[None]
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return {
        "ids": ids,
        "mask": mask[:, None],
        "positions": positions,
        "targets": targets,
        "weights": weights,
        "answer_positions": torch.tensor(answer_positions),
    }


def block_loss(net, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the masked answer tokens weighted 1/t, per answer position."""
    logits = net(
        input_ids=batch["ids"], attention_mask=batch["mask"], position_ids=batch["positions"]
    ).logits
    chosen = batch["targets"] >= 0
    ce = torch.nn.functional.cross_entropy(
        logits[chosen], batch["targets"][chosen], reduction="none"
    )
    return (ce * batch["weights"][chosen]).sum() / batch["answer_positions"].clamp(min=1)


def pretrain_block(
    examples: Callable[[int], tuple[str, str]],
    tokenizer: PreTrainedTokenizerFast,
    cfg: BlockPretrainConfig,
    out: Path,
    log: Callable[[str], None] = print,
    data: dict | None = None,
) -> Path:
    """Train and save a block-diffusion checkpoint (config.json with Qwen3's fields,
    `block_length` and `mask_token_id`; model.safetensors in HF Qwen3 names; tokenizer).

    `examples(i)` gives the i-th (prompt, answer) text pair of the training stream; `data`,
    what describes that stream (the task's options), is recorded in config.json beside `cfg`.
    """
    net = build_model(len(tokenizer), cfg, tokenizer)
    eos, mask_id = tokenizer.eos_token_id, tokenizer.mask_token_id

    def loss(texts: list[tuple[str, str]], gen: torch.Generator) -> torch.Tensor:
        block = cfg.block_length
        rows = [canvas_tokens(tokenizer, p, a, cfg.gen_length, block) for p, a in texts]
        return block_loss(net, block_batch(rows, block, mask_id, eos, cfg.eps, gen))

    fit(net, cfg, examples, loss, log)
    extra = {"pretrain": asdict(cfg), "data": data or {}}
    save_block(net.eval(), tokenizer, cfg.block_length, out, extra)
    return out


def save_block(net, tokenizer, block_length: int, out: Path, extra: dict) -> None:
    """A Qwen3-format directory that the `block` and `tiny-block` backbones load."""
    fields = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": net.config.head_dim,
        "block_length": block_length,
    }
    save_checkpoint(net, tokenizer, out, {**fields, **extra})
