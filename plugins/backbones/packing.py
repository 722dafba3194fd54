"""Packed forwards: a batch's rows laid end to end in one sequence, with no padding.

A left-padded batch computes rows × its widest row tokens; a packed one computes the rows' own
tokens, rounded up to a whole FlexAttention block. FlexAttention's document mask keeps every
row to itself (bidirectional within the row, nothing across rows), and positions restart at 0
with each row, so each row sees exactly what it sees in a padded batch or alone. The tail that
fills the last block is a document of its own that no row attends to.

The document mask is built from the blocks' row ranges (`document_block_mask`): for each
128-token query block, the kv blocks it shares a row with, split into full blocks (both blocks
wholly inside one row: every pair attends, the mask is never evaluated) and partial ones (the
kernel evaluates `doc[q] == doc[kv]`). That is O(blocks²) int32 indices, never a tokens × tokens
mask (`create_block_mask` uncompiled evaluates the mask at every token pair: 2.5 s and 2.6 GB
more peak memory at 16,384 tokens on a two-core CPU; benchmarks/bench_block_mask.py).

Rounding to whole blocks also bounds how many sequence lengths a compiled FlexAttention meets
(one per block count), so a GPU compiles a few shapes, not one per batch. On a GPU the attention
is `torch.compile`d FlexAttention (a fused kernel that skips the blocks no row shares); on a CPU
it runs eagerly, which is exact but materialises the scores and evaluates the mask at every
token pair: packing there is for checking, not for speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

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


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's layout of a boolean [Q blocks, KV blocks] grid: per query block, how many kv
    blocks are set, and their indices first (ascending), then the rest (int32)."""
    counts = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort((~blocks).to(torch.uint8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], order[None, None]


def document_block_mask(doc: torch.Tensor) -> BlockMask:
    """FlexAttention's BlockMask keeping every token to its document: token q attends to
    token kv exactly when `doc[q] == doc[kv]`. `doc` [N] holds each token's document, ids
    non-decreasing (every document one contiguous run), N a whole number of blocks.

    Built from each block's first and last document, never from N × N pairs: a query block
    and a kv block share a document exactly when their ranges of documents overlap (documents
    are contiguous, so any document between a block's first and last lies in it). The pair is
    full when both blocks lie wholly inside the same document, partial otherwise, where the
    kernel evaluates the mask. Memory: a few [blocks, blocks] tensors (`block_mask_bytes`)."""
    from torch.nn.attention.flex_attention import BlockMask

    n = doc.numel()
    if doc.dim() != 1 or n == 0 or n % BLOCK:
        raise ValueError(f"doc must be 1-D, a whole number of {BLOCK}-token blocks, got {n}")
    if bool((doc[1:] < doc[:-1]).any()):
        raise ValueError("doc must be non-decreasing: each document one contiguous run")
    per_block = doc.view(-1, BLOCK)
    first, last = per_block[:, 0], per_block[:, -1]
    shared = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])
    whole = first == last
    full = whole[:, None] & whole[None, :] & (first[:, None] == first[None, :])
    kv_num, kv_indices = _ordered(shared & ~full)
    full_num, full_indices = _ordered(full)

    def same_row(b, h, q, kv):
        return doc[q] == doc[kv]

    return BlockMask.from_kv_blocks(
        kv_num,
        kv_indices,
        full_num,
        full_indices,
        BLOCK_SIZE=BLOCK,
        mask_mod=same_row,
        seq_lengths=(n, n),
    )


def block_mask_bytes(tokens: int) -> int:
    """An upper bound on the memory one packed forward over `tokens` tokens adds for its
    document mask and packing (`packed_hidden`): the ids, positions and documents (int64 per
    token), and `document_block_mask`'s [blocks, blocks] grids — four int32 index tensors kept
    (kv and q, partial and full: 16 bytes per block pair) and, while building, boolean grids,
    argsort's int64 and the int32 grids the q side is transposed through: 41 to 53 bytes per
    block pair measured at 2,048 and 4,096 blocks (benchmarks/bench_block_mask.py), counted
    as 96."""
    blocks = -(-tokens // BLOCK)
    return 3 * 8 * blocks * BLOCK + 96 * blocks * (blocks + 1)


def packed_forward_bytes(tokens: int, heads: int) -> int:
    """An upper bound on the memory a packed forward over at most `tokens` real tokens adds
    beyond the activations of a padded one: `block_mask_bytes` of its block-rounded length,
    and FlexAttention's per-token statistics (log-sum-exp and row maximum, float32 per head).
    The fused GPU kernel materialises no scores; the eager CPU path does (not counted: batch
    sizing is for GPUs)."""
    computed = packed_length([tokens])
    return block_mask_bytes(computed) + 2 * 4 * heads * computed


def packed_hidden(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, pad: int):
    """Last hidden states [B, L, H] of the left-padded batch (`ids`, `attn` [B, L]) computed
    packed: the real tokens of every row end to end in one sequence under a document mask.
    Padding positions of the result hold zeros."""
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
    mask = document_block_mask(doc)
    with attention_implementation(model, _registered()):
        out = model.model(
            input_ids=flat, attention_mask=mask, position_ids=positions, use_cache=False
        )
    hidden = out.last_hidden_state
    full = hidden.new_zeros(rows, ids.shape[1], hidden.shape[-1])
    full[real] = hidden[0, :used]
    return full
