"""Dream: Qwen2 with bidirectional attention and shifted logits, and its sampler.

The sampler follows Dream's `diffusion_generate`: logits shifted one position right;
temperature, top-p and top-k; a token drawn for every masked position; a confidence per
position by `alg` (origin, maskgit_plus, topk_margin, entropy); and a per-step quota
int(n_masked · (1 − s/t)) with (t, s) consecutive values of linspace(1, eps, T+1) in float32,
the last step taking the rest. The draw and the confidences are computed in float64 from the
logits whatever the model dtype, so a bf16 model samples from its own distribution. With
`alg_temp` > 0 the positions are drawn without replacement with probability
softmax(confidence / alg_temp) (as Gumbel-top-k), else the top-k most confident, equal
confidences ordered by a keyed uniform. The mask token can be committed, as in the reference;
set suppress_mask=true to forbid it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.plugins.backbones.base import ATTENTIONS, DiffusionBackbone, top_ranked
from dllmbench.plugins.backbones.loading import DType

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


@dataclass(frozen=True)
class DreamConfig:
    model: str = "Dream-org/Dream-v0-Instruct-7B"  # Hub id, local directory, or "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: DType | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (151666)
    temperature: float = 0.5
    top_p: float = 1.0
    top_k: int | None = None
    alg: str = "maskgit_plus"
    alg_temp: float | None = 0.5
    eps: float = 1e-3
    suppress_mask: bool = False  # never sample the mask token (the reference can)
    # "sdpa": rows left-padded to the widest; "packed": rows end to end, no padding
    # (FlexAttention document mask, packing.py)
    attention: str = "sdpa"
    seed: int = 0  # initialisation of model="random"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be sdpa or packed, got {self.attention!r}")
        if self.alg not in ALGS:
            raise ValueError(f"alg must be one of {', '.join(ALGS)}, got {self.alg!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 < self.eps < 1:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and 0 < eps < 1")

    @property
    def deterministic(self) -> bool:
        """True when different keys cannot give different samples (up to exact ties of float64
        confidences): argmax tokens (temperature 0), committed by confidence (not `origin`'s
        random order) without a position draw (alg_temp None or 0)."""
        return self.temperature == 0 and self.alg != "origin" and not self.alg_temp


def filter_logits(logits: torch.Tensor, top_p: float, top_k: int | None) -> torch.Tensor:
    """Dream's top-p (keeps the first token past the threshold) and top-k filters."""
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        drop = torch.zeros_like(remove).scatter(-1, order, remove)
        logits = logits.masked_fill(drop, torch.finfo(logits.dtype).min)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    return logits


def categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws [M, S] from the rows of `probs` [M, V] (float64), one per uniform of
    `u` [M, S]. A token of probability 0 is never drawn."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:].contiguous()
    drawn = torch.searchsorted(cdf, u * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last token the CDF still rises at
    return torch.minimum(drawn, last)


def sample_tokens(
    logits: torch.Tensor, u: torch.Tensor, c: DreamConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's `sample_tokens` in float64 whatever the model dtype: tokens [M, S] drawn from
    softmax(filter(logits / temperature)) with the uniforms `u` [M, S] (argmax at temperature
    0), and their float64 confidence by `alg`: the probability of the token (origin,
    maskgit_plus), top-1 minus top-2 (topk_margin), or the negative entropy (entropy)."""
    logits = logits.double()
    if c.temperature > 0:
        logits = logits / c.temperature
    probs = torch.softmax(filter_logits(logits, c.top_p, c.top_k), dim=-1)
    if c.temperature > 0:
        x0 = categorical(probs, u)
        confidence = probs.gather(-1, x0)
    else:
        confidence, x0 = (t[:, None].expand_as(u) for t in probs.max(-1))
    if c.alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = (top2[:, 0] - top2[:, 1])[:, None].expand_as(u)
    elif c.alg == "entropy":
        confidence = (probs * torch.log(probs + 1e-10)).sum(-1)[:, None].expand_as(u)
    return x0, confidence


# float64 elements of one chunk of [positions, vocabulary] (512 MB): bounds the sampler's memory
CHUNK_ELEMENTS = 1 << 26


def quota(n_masked: torch.Tensor, steps: torch.Tensor, total: int, eps: float) -> torch.Tensor:
    """Tokens to commit per row: int(n · (1 − s/t)) in float32; the last step takes all."""
    grid = torch.linspace(1, eps, total + 1)
    t, s = grid[steps], grid[steps + 1]
    k = (n_masked.float() * (1 - s / t)).long()
    return torch.where(steps == total - 1, n_masked, k)


class Dream(DiffusionBackbone):
    """Dream-7B (Dream-org/Dream-v0-Instruct-7B): its own sampler, maskgit_plus by default."""

    Config = DreamConfig
    arch = "dream"
    shift = True
    mask_names = ("<|mask|>",)
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {"model": "random", "alg": "entropy", "alg_temp": 0.0, "temperature": 0.0},
        {"model": "random", "alg": "origin", "top_p": 0.9},
    ]

    def propose(self, hidden: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A token [M] and its float64 confidence [M] for each masked position's hidden state
        [M, H], drawn with its uniform `u` [M]; the head runs in chunks of positions."""
        c = self.config
        vocab = self.transformer.lm_head.weight.shape[0]
        size = max(1, CHUNK_ELEMENTS // vocab)
        tokens, confidences = [], []
        for start in range(0, hidden.shape[0], size):
            logits = self.head(hidden[start : start + size])
            if c.suppress_mask:
                logits[:, self.mask_id] = -torch.inf
            x0, confidence = sample_tokens(logits, u[start : start + size, None], c)
            tokens.append(x0[:, 0])
            confidences.append(confidence[:, 0])
        if not tokens:
            return hidden.new_zeros(0, dtype=torch.long), hidden.new_zeros(0, dtype=torch.float64)
        return torch.cat(tokens), torch.cat(confidences)

    def commit(self, ids, attn, offsets, batch: StepBatch) -> torch.Tensor:
        c = self.config
        hidden = self.hidden(ids, attn)
        device = hidden.device
        width = ids.shape[1]
        masked = (ids == self.mask_id).to(device)
        steps = torch.tensor(list(batch.steps))

        def noise(purpose: str) -> torch.Tensor:
            return self.noise(batch, offsets, width, purpose).to(device)

        x0, confidence = self.propose(hidden[masked], noise("token")[masked])
        proposal = ids.to(device).clone()
        proposal[masked] = x0
        if c.alg == "origin":
            grid = torch.linspace(1, c.eps, batch.total_steps + 1)
            p = 1 - grid[steps + 1] / grid[steps]
            p = torch.where(steps == batch.total_steps - 1, torch.ones_like(p), p)
            chosen = masked & (noise("order") < p.to(device)[:, None])
        else:
            full = torch.full(ids.shape, -torch.inf, dtype=torch.float64, device=device)
            full[masked] = confidence
            if c.alg_temp:
                gumbel = -torch.log(-torch.log(noise("position").clamp(1e-300, 1 - 1e-16)))
                full = full / c.alg_temp + gumbel
            k = quota(masked.sum(-1).cpu(), steps, batch.total_steps, c.eps).to(device)
            chosen = masked & top_ranked(full, k, noise("tie"))
        return torch.where(chosen, proposal, ids.to(device))


@hookimpl
def dllmbench_register_backbones(register):
    register("dream", Dream)
