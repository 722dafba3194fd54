"""Packed forwards: a batch's rows laid end to end in one sequence, with no padding.

A left-padded batch computes rows × its widest row tokens; a packed one computes the rows' own
tokens, rounded up to a whole FlexAttention block. FlexAttention's document mask keeps every
row to itself (bidirectional within the row, nothing across rows), and positions restart at 0
with each row, so each row sees exactly what it sees in a padded batch or alone. The tail that
fills the last block is a document of its own that no row attends to.

Rounding to whole blocks also bounds how many sequence lengths a compiled FlexAttention meets
(one per block count), so a GPU compiles a few shapes, not one per batch. On a GPU the attention
is `torch.compile`d FlexAttention (a fused kernel); on a CPU it runs eagerly, which is exact but
materialises the scores: packing there is for checking, not for speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache

import torch

BLOCK = 128  # FlexAttention's block size: packed sequences are a whole number of blocks
IMPLEMENTATION = "dllmbench_packed"  # the name the attention function is registered under


def packed_length(widths: Sequence[int]) -> int:
    """Tokens a packed forward over rows of these widths computes."""
    return -(-sum(widths) // BLOCK) * BLOCK


def flex_available() -> bool:
    """Whether this PyTorch has FlexAttention (torch >= 2.5)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _flex(device_type: str) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def packed_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers' attention-function interface over FlexAttention with the packed batch's
    document mask (`attention_mask`, a BlockMask): [1, heads, N, d] in, [1, N, heads, d] out."""
    flex = _flex(query.device.type)
    grouped = query.shape[1] != key.shape[1]
    out = flex(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=grouped)
    return out.transpose(1, 2).contiguous(), None


@cache
def _registered() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, packed_attention)
    return IMPLEMENTATION


@contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run `model`'s attention layers with implementation `name` for the duration (the layers
    read it from the config they share with the model); restored after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def packed_hidden(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, pad: int):
    """Last hidden states [B, L, H] of the left-padded batch (`ids`, `attn` [B, L]) computed
    packed: the real tokens of every row end to end in one sequence under a document mask.
    Padding positions of the result hold zeros."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = ids.device
    real = attn.bool()
    lengths = real.sum(-1)
    used = int(lengths.sum())
    total = packed_length(lengths.tolist())
    rows = len(lengths)
    doc = torch.full((total,), rows, dtype=torch.long, device=device)  # the tail: its own
    doc[:used] = torch.repeat_interleave(torch.arange(rows, device=device), lengths)
    flat = torch.full((1, total), pad, dtype=ids.dtype, device=device)
    flat[0, :used] = ids[real]
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.zeros((1, total), dtype=torch.long, device=device)
    positions[0, :used] = torch.arange(used, device=device) - torch.repeat_interleave(
        starts, lengths
    )

    def same_row(b, h, q, kv):
        return doc[q] == doc[kv]

    mask = create_block_mask(same_row, None, None, total, total, device=device)
    with attention_implementation(model, _registered()):
        out = model.model(input_ids=flat, attention_mask=mask, position_ids=positions)
    hidden = out.last_hidden_state
    full = hidden.new_zeros(rows, ids.shape[1], hidden.shape[-1])
    full[real] = hidden[0, :used]
    return full
