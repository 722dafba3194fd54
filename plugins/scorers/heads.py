"""Readout of a scorer: pooling over the generated region, mask-ratio embedding, heads."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalEmbedding(nn.Module):
    """256-d embedding of the mask ratio: x·128 against 128 frequencies, [sin, cos]."""

    def __init__(self, dim: int = 256, scale: float = 128.0):
        super().__init__()
        half = dim // 2
        freqs = torch.exp(-math.log(1e4) * torch.arange(half) / (half - 1))
        self.register_buffer("freqs", freqs, persistent=False)
        self.scale = scale

    def forward(self, ratio: torch.Tensor) -> torch.Tensor:
        angles = ratio.float()[:, None] * self.scale * self.freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


def region(
    ids: torch.Tensor, starts: torch.Tensor, mask_id: int, stop_ids: set[int], mask_aware: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions a scorer pools over, and each row's mask ratio.

    The generated region runs from the row's start (after its prompt) up to, not including,
    its first end token; with `mask_aware` its MASK tokens are left out. The mask ratio is
    the share of the generated positions still masked.
    """
    width = ids.shape[1]
    cols = torch.arange(width, device=ids.device)
    generated = cols[None] >= starts[:, None]
    stop = torch.tensor(sorted(stop_ids), dtype=ids.dtype, device=ids.device)
    stops = torch.isin(ids, stop) & generated
    first_stop = torch.where(stops.any(-1), stops.int().argmax(-1), width)
    inside = generated & (cols[None] < first_stop[:, None])
    masked = (ids == mask_id) & generated
    if mask_aware:
        inside &= ids != mask_id
    ratio = masked.sum(-1).float() / generated.sum(-1).clamp(min=1).float()
    return inside, ratio


def pool(
    hidden: torch.Tensor, region: torch.Tensor, fallback: torch.Tensor, how: str
) -> torch.Tensor:
    """Pool hidden [B, L, H] over `region` [B, L] (bool): its mean, or its last position.

    A row with an empty region (a fully masked canvas) reads its `fallback` position (the
    last prompt token) instead.
    """
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    empty = ~region.any(-1)
    if how == "mean":
        weights = region.to(hidden.dtype)
        pooled = (hidden * weights[..., None]).sum(1) / weights.sum(1).clamp(min=1)[:, None]
        return torch.where(empty[:, None], hidden[rows, fallback], pooled)
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    last = torch.where(region, positions, -1).max(-1).values
    return hidden[rows, torch.where(empty, fallback, last)]


class PRMHead(nn.Module):
    """[pooled ‖ GELU(Linear(step embedding))] → Linear → GELU → Linear → logit."""

    def __init__(self, hidden_size: int, width: int = 1024, step_embedding: bool = True):
        super().__init__()
        self.step_embedding = step_embedding
        extra = 256 if step_embedding else 0
        if step_embedding:
            self.embed = SinusoidalEmbedding(256)
            self.step_proj = nn.Sequential(nn.Linear(256, 256), nn.GELU())
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size + extra, width), nn.GELU(), nn.Linear(width, 1)
        )

    def forward(self, pooled: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
        features = pooled
        if self.step_embedding:
            features = torch.cat([pooled, self.step_proj(self.embed(ratio))], dim=-1)
        return self.mlp(features).squeeze(-1)


class ORMHead(nn.Module):
    """A linear readout of the pooled state."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)

    def forward(self, pooled: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
        return self.linear(pooled).squeeze(-1)
