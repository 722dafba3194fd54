"""Dream: Qwen2 with bidirectional attention and shifted logits, and its sampler.

The sampler follows Dream's `diffusion_generate`: logits shifted one position right;
temperature, top-p and top-k; a token drawn for every masked position; a confidence per
position by `alg` (origin, maskgit_plus, topk_margin, entropy); and a per-step quota
int(n_masked · (1 − s/t)) with (t, s) consecutive values of linspace(1, eps, T+1) in float32,
the last step taking the rest. With `alg_temp` > 0 the positions are drawn without
replacement with probability softmax(confidence / alg_temp) (as Gumbel-top-k), else the
top-k most confident. The mask token can be committed, as in the reference; set
suppress_mask=true to forbid it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllmbench.hookspecs import hookimpl
from dllmbench.interfaces import StepBatch
from dllmbench.plugins.backbones.base import DiffusionBackbone
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
    seed: int = 0  # initialisation of model="random"

    def __post_init__(self) -> None:
        if self.alg not in ALGS:
            raise ValueError(f"alg must be one of {', '.join(ALGS)}, got {self.alg!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 < self.eps < 1:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and 0 < eps < 1")


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


def quota(n_masked: torch.Tensor, steps: torch.Tensor, total: int, eps: float) -> torch.Tensor:
    """Tokens to commit per row: int(n · (1 − s/t)) in float32; the last step takes all."""
    grid = torch.linspace(1, eps, total + 1)
    t, s = grid[steps], grid[steps + 1]
    k = (n_masked.float() * (1 - s / t)).long()
    return torch.where(steps == total - 1, n_masked, k)


class Dream(DiffusionBackbone):
    Config = DreamConfig
    arch = "dream"
    shift = True
    mask_names = ("<|mask|>",)
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {"model": "random", "alg": "entropy", "alg_temp": 0.0, "temperature": 0.0},
        {"model": "random", "alg": "origin", "top_p": 0.9},
    ]

    def commit(self, ids, attn, offsets, batch: StepBatch) -> torch.Tensor:
        c = self.config
        hidden = self.hidden(ids, attn)
        device = hidden.device
        masked = (ids == self.mask_id).to(device)
        u = self.noise(batch, offsets, ids.shape[1], 3).to(device)
        steps = torch.tensor(list(batch.steps))

        picked = self.head(hidden[masked])  # [M, V]: every masked position of the batch
        if c.suppress_mask:
            picked[:, self.mask_id] = -torch.inf
        if c.temperature > 0:
            picked = picked / c.temperature
        picked = filter_logits(picked, c.top_p, c.top_k)
        probs = torch.softmax(picked, dim=-1)
        if c.temperature > 0:  # inverse-CDF draw with the position's own uniform
            cdf = probs.cumsum(-1)
            draw = u[:, 0][masked].to(cdf.dtype) * cdf[:, -1]
            x0 = torch.searchsorted(cdf, draw[:, None]).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
            confidence = probs.gather(-1, x0[:, None]).squeeze(-1)
        else:
            confidence, x0 = probs.max(-1)
        if c.alg == "topk_margin":
            top2 = torch.topk(probs, 2, dim=-1).values
            confidence = top2[:, 0] - top2[:, 1]
        elif c.alg == "entropy":
            confidence = (probs * torch.log(probs + 1e-10)).sum(-1)

        proposal = ids.to(device).clone()
        proposal[masked] = x0
        if c.alg == "origin":
            grid = torch.linspace(1, c.eps, batch.total_steps + 1)
            p = 1 - grid[steps + 1] / grid[steps]
            p = torch.where(steps == batch.total_steps - 1, torch.ones_like(p), p)
            chosen = masked & (u[:, 1] < p.to(u.device)[:, None])
        else:
            full = torch.full(ids.shape, -torch.inf, dtype=torch.float64, device=device)
            full[masked] = confidence.to(torch.float64)
            if c.alg_temp:
                gumbel = -torch.log(-torch.log(u[:, 2].clamp(1e-300, 1 - 1e-16)))
                full = full / c.alg_temp + gumbel
            k = quota(masked.sum(-1).cpu(), steps, batch.total_steps, c.eps).to(device)
            rank = torch.argsort(torch.argsort(full, dim=-1, descending=True, stable=True), dim=-1)
            chosen = masked & (rank < k[:, None])
        return torch.where(chosen, proposal, ids.to(device))


@hookimpl
def dllmbench_register_backbones(register):
    register("dream", Dream)
