"""Training a small Dream-architecture dLLM from scratch with the masked-diffusion objective.

Used to build the shipped demo model: a word-level tokenizer with one token per digit made
from the task's own text, and a Qwen2 stack trained bidirectionally to fill masked answers.
Each example is a prompt followed by its answer padded with EOS to `gen_length`; a noise
level t ~ U(eps, 1) masks each answer position with probability t, and the loss is the
cross-entropy of the masked positions weighted by 1/t (the ELBO of masked diffusion),
read through Dream's logit shift.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from dllmbench.core.tensorfile import save_tensors
from dllmbench.scoring.training import warmup_cosine

PATTERN = r"####| ?[A-Za-z]+|\d| ?[^\w\s]|\n| "
EOS, MASK = "<|endoftext|>", "<|mask|>"


def word_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Whole words and punctuation (with their leading space), bare single digits, a space
    on its own before a digit, newline; lossless. A digit is one token wherever it stands,
    so the model learns one addition table, not one per spacing."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")
    pieces = sorted({p for text in texts for p, _ in pre.pre_tokenize_str(text)})
    vocab = {tok: i for i, tok in enumerate([EOS, MASK, *pieces])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    core.pre_tokenizer = pre
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, mask_token=MASK
    )


@dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0
    steps: int = 2500
    batch: int = 128
    lr: float = 1e-3
    warmup: int = 100
    hidden: int = 128
    intermediate: int = 512  # the MLP's width
    layers: int = 4
    heads: int = 4
    gen_length: int = 40
    eps: float = 1e-3


def build_model(vocab: int, cfg: PretrainConfig, tokenizer: PreTrainedTokenizerFast):
    config = Qwen2Config(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        vocab_size=vocab,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.is_causal = False
    config._attn_implementation = "sdpa"
    torch.manual_seed(cfg.seed)
    return Qwen2ForCausalLM(config)


def answer_tokens(tokenizer: PreTrainedTokenizerFast, answer: str, gen_length: int) -> list[int]:
    """The answer's tokens cut to `gen_length` and padded with EOS to it: the generated region
    as the model learns to fill it."""
    ids = tokenizer(answer)["input_ids"][:gen_length]
    return ids + [tokenizer.eos_token_id] * (gen_length - len(ids))


def batch_tensors(pairs: list[tuple[list[int], list[int]]], pad: int):
    """Left-padded ids, attention mask, positions and the answer-region mask."""
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    answer = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, a) in enumerate(pairs):
        row = p + a
        ids[i, width - len(row) :] = torch.tensor(row)
        attn[i, width - len(row) :] = 1
        answer[i, width - len(a) :] = True
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0), answer


def diffusion_loss(
    net, ids, attn, positions, answer, mask_id: int, eps: float, gen: torch.Generator
) -> torch.Tensor:
    """Masked-diffusion loss: mask answer tokens with prob t, CE on them weighted by 1/t."""
    t = eps + (1 - eps) * torch.rand(ids.shape[0], generator=gen)
    masked = answer & (torch.rand(ids.shape, generator=gen) < t[:, None])
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = net(input_ids=noisy, attention_mask=attn, position_ids=positions).logits
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # Dream's shift
    ce = torch.nn.functional.cross_entropy(logits[masked], ids[masked], reduction="none")
    weights = (1 / t)[:, None].expand_as(ids)[masked]
    return (ce * weights).sum() / answer.sum()


def pretrain(
    examples: Callable[[int], tuple[str, str]],
    tokenizer: PreTrainedTokenizerFast,
    cfg: PretrainConfig,
    out: Path,
    log: Callable[[str], None] = print,
    data: dict | None = None,
) -> Path:
    """Train and save a Dream-format checkpoint (config.json, model.safetensors, tokenizer).

    `examples(i)` gives the i-th (prompt, answer) text pair of the training stream; `data`,
    what describes that stream (the task's options), is recorded in config.json beside `cfg`.
    """
    net = build_model(len(tokenizer), cfg, tokenizer)
    eos, mask_id = tokenizer.eos_token_id, tokenizer.mask_token_id

    def loss(texts: list[tuple[str, str]], gen: torch.Generator) -> torch.Tensor:
        pairs = [
            (tokenizer(prompt)["input_ids"], answer_tokens(tokenizer, answer, cfg.gen_length))
            for prompt, answer in texts
        ]
        return diffusion_loss(net, *batch_tensors(pairs, eos), mask_id, cfg.eps, gen)

    fit(net, cfg, examples, loss, log)
    save_dream(net.eval(), tokenizer, out, {"pretrain": asdict(cfg), "data": data or {}})
    return out


class Schedule(Protocol):
    """What a pretraining loop reads of its configuration."""

    seed: int
    steps: int
    batch: int
    lr: float
    warmup: int


def fit(
    net: torch.nn.Module,
    cfg: Schedule,
    examples: Callable[[int], tuple[str, str]],
    loss: Callable[[list[tuple[str, str]], torch.Generator], torch.Tensor],
    log: Callable[[str], None],
) -> None:
    """AdamW under warmup-cosine over `steps` batches of `batch` consecutive examples of the
    stream, the gradient clipped to norm 1; `loss` maps a batch's texts (and the noise
    generator, seeded from `seed`) to the loss."""
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.steps, cfg.warmup))
    gen = torch.Generator().manual_seed(cfg.seed)
    net.train()
    start = time.time()
    for step in range(cfg.steps):
        value = loss([examples(step * cfg.batch + i) for i in range(cfg.batch)], gen)
        opt.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"step {step:5d}  loss {value.item():.4f}  {time.time() - start:.0f}s")


def save_dream(net, tokenizer, out: Path, extra: dict) -> None:
    """A Dream-format directory that the `dream` and `tiny` backbones load."""
    architecture = {"architectures": ["DreamModel"], "model_type": "Dream"}
    save_checkpoint(net, tokenizer, out, {**architecture, **extra})


def save_checkpoint(net, tokenizer, out: Path, fields: dict) -> None:
    """config.json (the model's shape and special tokens, then `fields`), model.safetensors in
    transformers' names, and the tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    c = net.config
    config = {
        **{k: v for k, v in fields.items() if k in ("architectures", "model_type")},
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_parameters["rope_theta"],
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": False,
        "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **fields,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    save_tensors(state, out / "model.safetensors")
    tokenizer.save_pretrained(str(out))
