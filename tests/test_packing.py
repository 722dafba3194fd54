"""Packed forwards at real lengths: the document BlockMask built from the blocks' row ranges
against the dense mask and against `create_block_mask`, its memory, Dream and LLaDA rows of
hundreds of tokens packed against each row alone, and the batch sizing that counts the mask."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from dllmbench.execution.engine import MEMORY_SHARE, Capacity, sized_to_memory
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.packing import (
    BLOCK,
    block_mask_bytes,
    document_block_mask,
    packed_forward_bytes,
    packed_hidden,
    packed_length,
)


def documents(lengths: list[int]) -> torch.Tensor:
    """Each token's row, rows end to end, the tail to a whole block a document of its own (as
    `packed_hidden` lays them out)."""
    used = sum(lengths)
    doc = torch.full((packed_length(lengths),), len(lengths), dtype=torch.long)
    doc[:used] = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return doc


def grid(num: torch.Tensor, indices: torch.Tensor, blocks: int) -> torch.Tensor:
    """The boolean [blocks, blocks] grid a (num_blocks, indices) pair of a BlockMask lists."""
    out = torch.zeros(blocks, blocks, dtype=torch.bool)
    for i in range(blocks):
        out[i, indices[0, 0, i, : num[0, 0, i]].long()] = True
    return out


def token_mask(mask: BlockMask) -> torch.Tensor:
    """The tokens × tokens mask a block-sparse kernel applies: a full block attends at every
    pair, a partial block where its mask_mod says so, a block not listed nowhere."""
    n = mask.seq_lengths[0]
    blocks = n // BLOCK
    partial = grid(mask.kv_num_blocks, mask.kv_indices, blocks)
    full = grid(mask.full_kv_num_blocks, mask.full_kv_indices, blocks)
    assert not (partial & full).any()  # a block is one or the other
    expand = lambda g: g.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)  # noqa: E731
    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return expand(full) | (expand(partial) & mask.mask_mod(0, 0, q, kv))


# 8 rows of 300–640 tokens: [525, 484, 321, 318, 527, 317, 443, 596]
REAL = torch.randint(300, 641, (8,), generator=torch.Generator().manual_seed(22)).tolist()

LAYOUTS = {
    "multiples of 128": [128, 256, 128, 384],
    "shorter than a block": [5, 1, 17, 3, 100],
    "mixed": [128, 256, 5, 300, 3, 3, 128],
    "one row, no tail": [512],
    "one short row": [7],
    "real lengths": REAL,
    **{
        f"random {seed}": torch.randint(
            1, 400, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g
        ).tolist()
        for seed in range(4)
        for g in [torch.Generator().manual_seed(seed)]
    },
}


@pytest.mark.parametrize("lengths", LAYOUTS.values(), ids=list(LAYOUTS))
def test_block_mask_applies_exactly_the_document_mask(lengths):
    """Evaluated block by block as a kernel does, the mask is `doc[q] == doc[kv]` at every
    pair; its blocks are the ones `create_block_mask` finds from every token pair (no block
    listed that no row shares, full exactly where every pair attends), and its q-side lists
    are the transpose of its kv-side ones."""
    doc = documents(lengths)
    n = doc.numel()
    mask = document_block_mask(doc)
    assert mask.seq_lengths == (n, n) and mask.BLOCK_SIZE == (BLOCK, BLOCK)
    assert torch.equal(token_mask(mask), doc[:, None] == doc[None, :])

    reference = create_block_mask(lambda b, h, q, kv: doc[q] == doc[kv], None, None, n, n, "cpu")
    blocks = n // BLOCK
    for side in ("kv", "full_kv", "q", "full_q"):
        num, indices = getattr(mask, f"{side}_num_blocks"), getattr(mask, f"{side}_indices")
        assert num.dtype == indices.dtype == torch.int32
        ours = grid(num, indices, blocks)
        theirs = grid(
            getattr(reference, f"{side}_num_blocks"), getattr(reference, f"{side}_indices"), blocks
        )
        assert torch.equal(ours, theirs), side
    assert torch.equal(
        grid(mask.q_num_blocks, mask.q_indices, blocks),
        grid(mask.kv_num_blocks, mask.kv_indices, blocks).T,
    )


def test_real_lengths_have_full_and_shared_blocks():
    """Rows of 300–640 tokens span whole blocks (full, the mask skipped) and share the blocks
    at their ends with their neighbours (partial): both kinds are exercised."""
    mask = document_block_mask(documents(REAL))
    assert int(mask.full_kv_num_blocks.sum()) > 0 and int(mask.kv_num_blocks.sum()) > 0


@pytest.mark.parametrize(
    "doc,match",
    [
        (torch.zeros(100, dtype=torch.long), "whole number"),
        (torch.zeros(0, dtype=torch.long), "whole number"),
        (torch.cat([torch.ones(128), torch.zeros(128)]).long(), "non-decreasing"),
    ],
)
def test_a_layout_the_mask_cannot_describe_is_refused(doc, match):
    with pytest.raises(ValueError, match=match):
        document_block_mask(doc)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="compiled FlexAttention needs a compiler")
def test_compiled_flex_attention_follows_the_blocks():
    """A compiled FlexAttention (the GPU's path; here the CPU's inductor kernel) reads the
    block lists: under our mask it equals dense attention under `doc[q] == doc[kv]`; a mask
    that calls every shared block full leaks across rows, so the check can fail (the eager
    path evaluates the mask at every pair and would not notice)."""
    doc = documents([640, 300, 5, 128, 417])
    n = doc.numel()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=doc[:, None] == doc[None, :]
    )
    compiled = torch.compile(flex_attention)
    mask = document_block_mask(doc)
    torch.testing.assert_close(compiled(q, k, v, block_mask=mask), dense, atol=1e-5, rtol=1e-5)

    shared = mask.to_dense()[0, 0].bool()
    order = torch.sort((~shared).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    all_full = BlockMask.from_kv_blocks(
        torch.zeros_like(mask.kv_num_blocks),
        mask.kv_indices,
        shared.sum(-1, dtype=torch.int32)[None, None],
        order[None, None],
        BLOCK_SIZE=BLOCK,
        mask_mod=mask.mask_mod,
        seq_lengths=(n, n),
    )
    assert (compiled(q, k, v, block_mask=all_full) - dense).abs().max() > 1e-2


# -- memory ---------------------------------------------------------------------------------------
def test_the_mask_keeps_int32_blocks_squared_within_the_stated_bound():
    """What the mask keeps is six [blocks, blocks] int32 lists and four per-block counts,
    within `block_mask_bytes`; nothing grows with tokens × tokens."""
    lengths = [640, 300, 512, 417, 333, 601, 388, 459] * 4  # ~15,000 tokens
    doc = documents(lengths)
    mask = document_block_mask(doc)
    blocks = doc.numel() // BLOCK
    kept = sum(
        t.nbytes
        for t in (
            mask.kv_num_blocks,
            mask.kv_indices,
            mask.full_kv_num_blocks,
            mask.full_kv_indices,
            mask.q_num_blocks,
            mask.q_indices,
            mask.full_q_num_blocks,
            mask.full_q_indices,
        )
    )
    assert kept == 4 * 4 * blocks * blocks + 4 * 4 * blocks
    assert kept <= block_mask_bytes(doc.numel()) < doc.numel() ** 2 / 100


PEAK = textwrap.dedent(
    """
    import json, sys, torch
    from dllmbench.plugins.backbones.packing import document_block_mask, packed_length

    def peak():  # the process's peak resident memory (Linux), bytes
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024

    tokens, rows = int(sys.argv[1]), int(sys.argv[2])
    lengths = [tokens // rows] * rows
    doc = torch.full((packed_length(lengths),), rows, dtype=torch.long)
    doc[: sum(lengths)] = torch.repeat_interleave(torch.arange(rows), torch.tensor(lengths))
    before = peak()
    mask = document_block_mask(doc)
    print(json.dumps({"tokens": doc.numel(), "added": peak() - before}))
    """
)


def peak_added(tokens: int, rows: int) -> int:
    """Bytes a fresh process's peak resident memory grows by while it builds the mask of
    `rows` equal rows filling `tokens`."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK, str(tokens), str(rows)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    measured = json.loads(out.stdout)
    assert measured["tokens"] == tokens
    return measured["added"]


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


@pytest.mark.slow
@LINUX
def test_the_mask_at_16384_tokens_is_built_in_under_100_mb():
    """Measured in a fresh process: how much its peak resident memory grows while the mask of
    16,384 tokens (26 rows of 630) is built. A tokens × tokens mask adds over 2 GB."""
    assert 0 <= peak_added(16384, 26) < 100 * 2**20


@pytest.mark.slow
@LINUX
def test_the_sizing_bound_covers_the_measured_build():
    """At 131,072 tokens (1,024 blocks, where the [blocks, blocks] tensors dominate) the build
    adds no more than `block_mask_bytes` counts, beyond a first-call overhead of a few MB that
    does not grow with the tokens (16 MB allowed)."""
    added = peak_added(131072, 205)
    assert added <= block_mask_bytes(131072) + 16 * 2**20, (added, block_mask_bytes(131072))


# -- Dream and LLaDA rows of hundreds of tokens ----------------------------------------------------
def rows_of(bb, lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vocab = len(bb.tokenizer)
    rows = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    for row in rows:
        row[row == bb.pad_id] = bb.mask_id  # no row token is taken for padding
    return rows


@pytest.fixture(scope="module", params=[Dream, LLaDA], ids=["dream", "llada"])
def backbone(request):
    return request.param(model="random", seed=5)


def packed(bb, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    ids, attn, offsets = bb.pad(rows)
    with torch.no_grad():
        hidden = packed_hidden(bb.transformer, ids, attn, bb.pad_id)
    return [hidden[i, offset:] for i, offset in enumerate(offsets)]


@pytest.fixture(scope="module")
def real_rows(backbone) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The 8 rows of 300–640 tokens and their packed hidden states."""
    rows = rows_of(backbone, REAL, seed=1)
    return rows, packed(backbone, rows)


def test_real_lengths_pack_to_what_each_row_gives_alone(backbone, real_rows):
    """8 rows of 300–640 tokens packed (rows spanning whole blocks and sharing others) against
    each row's forward alone (SDPA, no mask): relative error at float32 rounding."""
    assert min(REAL) >= 300 and max(REAL) <= 640
    rows, out = real_rows
    worst = 0.0
    for row, got in zip(rows, out, strict=True):
        with torch.no_grad():
            alone = backbone.transformer.model(input_ids=row[None]).last_hidden_state[0]
        assert got.shape == alone.shape
        worst = max(worst, float((got - alone).abs().max() / alone.abs().max()))
    print(f"{type(backbone).__name__}: worst relative error {worst:.2e} over rows {REAL}")
    assert worst < 1e-5


def test_no_row_sees_another(backbone, real_rows):
    """Changing one row's tokens (lengths kept) leaves every other row's output bit for bit,
    and changes its own."""
    rows, before = real_rows
    changed = list(rows)
    changed[3] = rows_of(backbone, [REAL[3]], seed=2)[0]
    after = packed(backbone, changed)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if i == 3:
            assert not torch.equal(a, b)
        else:
            assert torch.equal(a, b), i


def test_positions_restart_with_every_row(backbone, monkeypatch):
    """The trunk receives positions 0..len-1 for each row (RoPE sees only differences within a
    row, so outputs alone could not tell an offset apart) and the tail's pad tokens after."""
    seen = {}
    trunk = backbone.transformer.model
    forward = trunk.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return forward(*args, **kwargs)

    monkeypatch.setattr(trunk, "forward", spy)
    rows = rows_of(backbone, REAL, seed=1)
    packed(backbone, rows)
    used = sum(REAL)
    expected = torch.cat([torch.arange(n) for n in REAL])
    assert seen["position_ids"].shape == (1, packed_length(REAL))
    assert torch.equal(seen["position_ids"][0, :used], expected)
    assert torch.equal(seen["input_ids"][0, :used], torch.cat(rows))
    assert (seen["input_ids"][0, used:] == backbone.pad_id).all()


# -- batch sizing ---------------------------------------------------------------------------------
def test_batch_sizing_counts_the_packed_forwards_mask(monkeypatch):
    """On a (pretended) GPU with 40 GB free, a packing backbone's `batch_tokens` is the most
    tokens whose activations plus block mask and FlexAttention statistics fit the share; a
    padded backbone's is the activations alone, so more."""
    free = 40 * 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, free))
    padded = Dream(model="random", seed=5)
    packing_bb = Dream(
        transformer=padded.transformer, tokenizer=padded.tokenizer, attention="packed"
    )
    for bb in (padded, packing_bb):
        bb.device = "cuda"
    budget = int(free * MEMORY_SHARE)
    config = padded.transformer.config
    per_token = 2 * (6 * config.hidden_size + 3 * config.intermediate_size) * 4
    as_padded = sized_to_memory(Capacity(), padded).batch_tokens
    as_packed = sized_to_memory(Capacity(), packing_bb).batch_tokens
    assert as_padded == budget // per_token
    assert padded.forward_extra_bytes(as_padded) == 0
    cost = lambda t: t * per_token + packing_bb.forward_extra_bytes(t)  # noqa: E731
    assert cost(as_packed) <= budget < cost(as_packed + 1)  # the most that fits
    assert as_packed < as_padded
    heads = config.num_attention_heads
    assert packing_bb.forward_extra_bytes(as_packed) == packed_forward_bytes(as_packed, heads)
    assert sized_to_memory(Capacity(batch_tokens=7), packing_bb).batch_tokens == 7


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_batch_sizing_counts_llada_s_logits_over_every_position(monkeypatch, cfg_scale):
    """LLaDA runs its head at once over a step's eligible positions (twice with guidance):
    on a (pretended) GPU its `batch_tokens` leaves room for [tokens, vocabulary] logits in
    the model's dtype beside the activations, the most tokens that fit."""
    from dllmbench.plugins.backbones.llada import LLaDA

    free = 40 * 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, free))
    bb = LLaDA(model="random", cfg_scale=cfg_scale, dtype="bfloat16")
    bb.device = "cuda"
    config = bb.transformer.config
    per_token = 2 * (6 * config.hidden_size + 3 * config.intermediate_size) * 2
    logits = config.vocab_size * 2 * (2 if cfg_scale else 1)
    assert bb.forward_extra_bytes(10) == 10 * logits
    sized = sized_to_memory(Capacity(), bb).batch_tokens
    budget = int(free * MEMORY_SHARE)
    assert sized * (per_token + logits) <= budget < (sized + 1) * (per_token + logits)


def test_forward_bytes_bound_what_packing_allocates():
    """`packed_forward_bytes` covers the block-rounded length: a forward capped at one token
    over a block still computes two blocks."""
    assert packed_length([BLOCK + 1]) == 2 * BLOCK
    assert packed_forward_bytes(BLOCK + 1, 4) == block_mask_bytes(2 * BLOCK) + 8 * 4 * 2 * BLOCK
