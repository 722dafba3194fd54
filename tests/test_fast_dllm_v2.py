"""Fast-dLLM v2: token for token the model's own batch sampler (token shift, a block's first
token read from the block before, sub-blocks, threshold commits), a row that ends within a T
below its gen_length, and charges that are what the forwards compute."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_block import _call, run_rows

from dllmbench.api.interfaces import StepBatch
from dllmbench.core.errors import Notice, UserError
from dllmbench.core.flops import flops, shape_of
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.block import BlockDiffusion
from dllmbench.plugins.backbones.fast_dllm_v2 import FastDLLMv2, rate, units

# -- Fast-dLLM v2's `batch_sample` (Efficient-Large-Model/Fast_dLLM_v2_7B), for one row ---------
# The model call keeps the reference's cache discipline: a denoising pass leaves the cache as
# it was (update_past_key_values=False), a store pass appends the block. torch.multinomial is
# replaced by an inverse-CDF draw from the backbone's keyed uniforms of the same step, and the
# mask token is never drawn (a random model puts mass on it; the released checkpoint does not).


def _block_causal(lo: int, hi: int, block: int) -> torch.Tensor:
    """[1, hi - lo, hi] queries lo..hi−1 against keys 0..hi−1: a key's block ≤ the query's."""
    q = torch.arange(lo, hi)[:, None] // block
    k = torch.arange(hi)[None, :] // block
    return (k <= q)[None].float()


def _forward(model, x, lo, hi, block, cache, store):
    positions = torch.arange(lo, hi)[None]
    return _call(model, x[:, lo:hi], _block_causal(lo, hi, block), positions, cache, store)


def _sample_with_top_p(logits, top_p, temperature, u, mask_id):
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    if temperature == 0:
        p = torch.softmax(logits, dim=-1)
        return p.argmax(dim=-1), p
    probs = torch.softmax(logits / temperature, dim=-1)
    ordered, order = torch.sort(probs, descending=True)
    remove = torch.cumsum(ordered, dim=-1) > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    probs[torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, remove)] = 0
    p = probs / probs.sum(-1, keepdim=True)
    cdf = p.double().cumsum(-1)
    token = torch.searchsorted(cdf, (u * cdf[..., -1])[..., None], right=True)[..., 0]
    token = torch.minimum(token, torch.searchsorted(cdf, cdf[..., -1:].contiguous())[..., 0])
    return token, p


def reference_batch_sample(
    model, prompt, mask_id, gen_length, block, small, threshold, temperature, top_p, uniforms, stops
):
    from transformers import DynamicCache

    cache = DynamicCache()
    length = prompt.shape[1]
    x = prompt.clone()
    step = 0  # the backbone's step: one per forward of the row, as it runs them

    def next_token(logits):
        logits = logits[:, -1].clone()
        logits[:, mask_id] = float("-inf")
        return logits.argmax(dim=-1, keepdim=True)

    if length > block:  # the reference's `min_len > block_size`
        whole = length // block * block
        logits = _forward(model, x, 0, whole, block, cache, True)
        if length % block == 0:
            x = torch.cat([x, next_token(logits)], dim=1)
            step += 1  # the backbone's opening step; off a boundary, its first step runs both
    finished = False
    for b in range(length // block, gen_length // block + length // block):
        lo, hi = b * block, (b + 1) * block
        x = torch.cat([x, torch.full((1, hi - x.shape[1]), mask_id)], dim=1)
        while True:
            if not (x[:, lo:hi] == mask_id).any():
                if finished:
                    break
                logits = _forward(model, x, lo, hi, block, cache, True)
                step += 1
                x = torch.cat([x, next_token(logits)], dim=1)
                break
            for s in range(block // small):
                a, e = s * small, (s + 1) * small
                while True:
                    masked = x[:, lo:hi] == mask_id
                    if not masked[:, a:e].any():
                        break
                    logits = _forward(model, x, lo, hi, block, cache, False)
                    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[:, a:e]
                    u = uniforms(step)[lo + a : lo + e]
                    x1, p = _sample_with_top_p(logits, top_p, temperature, u, mask_id)
                    x1_p = torch.gather(p, -1, x1[..., None])[..., 0]
                    x1_p = torch.where(masked[:, a:e], x1_p, -torch.inf)
                    unmask = x1_p > threshold
                    unmask[0, x1_p.argmax(dim=-1)] = True
                    unmask &= masked[:, a:e]
                    x[:, lo + a : lo + e][unmask] = x1[unmask]
                    finished |= any(int(t) in stops for t in x1[unmask])
                    step += 1
        if finished:
            break
    return x[0]


CASES = [
    # block, sub-block, threshold, temperature, top_p, prompt text
    (8, 4, 0.5, 0.05, 0.95, "Question: 12+7?"),  # off a boundary: the tail shares a block
    (8, 4, 0.9, 0.01, 0.95, "Q: 1+1=?........"),  # whole blocks: the first token is read
    (4, 2, 0.5, 0.0, 0.95, "Q: 2+2=?......"),  # greedy
    (8, 8, 0.9, 1.0, 0.95, "What is 9-2?"),  # one sub-block, top-p at temperature 1
    (8, 2, 0.3, 0.02, 1.0, "Question: 3*4+5=?!!!!!!!"),  # a prompt of three whole blocks
    (16, 4, 0.5, 0.05, 0.95, "Q: 1+1=?"),  # a prompt shorter than a block: no prefix forward
]


def test_a_sub_block_that_does_not_divide_the_block_ends_shorter():
    """A row's own block length (HEX's) need not be a multiple of sub_block: sub-blocks count
    from the block's start and the last is shorter; one at least the block is the block."""
    bb = FastDLLMv2(model="random", block_length=8, sub_block=3, threshold=1.0, stop=False)
    prompt = bb.encode(Prompt(text="Q: 1+1=?........"))  # 16: two whole blocks
    heads = []
    canvas = bb.canvas(prompt, 16)
    rows = [canvas.clone()]
    for step in range(16):
        batch = StepBatch(rows, [16], [step], [2], 16)
        heads.append(bb.step_work(batch)[0].head)
        rows = bb.denoise_step(batch)
    assert not bool((rows[0] == bb.mask_id).any())
    # each block: its opening token, then sub-blocks [1, 3) [3, 6) [6, 8) drawn one a step
    assert heads == [1, 2, 1, 3, 2, 1, 2, 1] * 2
    whole = FastDLLMv2(model="random", block_length=4, sub_block=16, threshold=1.0, stop=False)
    assert len(whole.row_works(whole.canvas(prompt, 8), 16, 8)) == 8


@pytest.mark.parametrize(("block", "sub", "threshold", "temperature", "top_p", "text"), CASES)
def test_the_sampler_is_fast_dllm_v2s_token_for_token(
    block, sub, threshold, temperature, top_p, text
):
    bb = FastDLLMv2(
        model="random",
        block_length=block,
        sub_block=sub,
        threshold=threshold,
        temperature=temperature,
        top_p=top_p,
        seed=3,
    )
    prompt = bb.encode(Prompt(text=text))
    gen = 4 * block
    key = 1234
    ours = run_rows(bb, prompt, gen, gen, [key])[0]
    width = len(ours)
    ref = reference_batch_sample(
        bb.transformer,
        torch.tensor([prompt]),
        bb.mask_id,
        gen,
        block,
        sub,
        threshold,
        temperature,
        top_p,
        lambda step: torch.cat(
            [bb.noise_at(key, step, "token", width), torch.full((2 * block,), 0.5)]
        ),
        bb.stop_ids,
    )
    # the backbone ends a row after the block in which it wrote an end token, opening token
    # included (the reference goes on past an opening end token; both answers end at it), and
    # fills the rest with the end token
    plen = len(prompt)
    stop = next((p for p in range(plen, width) if int(ours[p]) in bb.stop_ids), None)
    same = min(len(ref), width) // block * block
    if stop is not None:
        same = min(same, (stop // block + 1) * block)
        assert bool((ours[same:] == bb.eos_id).all())
    assert torch.equal(ours[:same], ref[:same])
    assert same > plen + block  # more than one block was compared
    if 0 < temperature <= 0.05:  # sharp enough that the threshold commits several at a step
        assert bb.steps_taken < width - plen


def test_the_reference_behaviour_needs_no_more_than_gen_length_steps_and_less_ends_in_time():
    """With T = gen_length every step may commit one token (the reference's least); with a T
    below it, each step commits what the row needs to end within T, and it does, down to one
    step per block opening and per sub-block (13 here); below that the rest stays masked."""
    bb = FastDLLMv2(model="random", block_length=8, sub_block=4, threshold=1.0, seed=1, stop=False)
    prompt = bb.encode(Prompt(text="Question: 12+7?"))
    gen = 32
    full = run_rows(bb, prompt, gen, gen, [7])[0]
    assert bb.steps_taken == gen  # nothing above the threshold: one token a step
    for total in (20, 13):
        row = run_rows(bb, prompt, gen, total, [7])[0]
        assert not bool((row == bb.mask_id).any())
        assert bb.steps_taken == total
    assert not bool((full == bb.mask_id).any())
    short = run_rows(bb, prompt, gen, 12, [7])[0]
    assert int((short == bb.mask_id).sum()) == 3  # the last sub-block's


def test_a_t_below_gen_length_is_said_once():
    bb = FastDLLMv2(model="random", block_length=8, sub_block=4, seed=1, stop=False)
    prompt = bb.encode(Prompt(text="Question: 12+7?"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run_rows(bb, prompt, 32, 32, [7])
        assert not said  # T = gen_length: the reference's decoding
        run_rows(bb, prompt, 32, 16, [7, 8])
        run_rows(bb, prompt, 32, 16, [9])
    assert len(said) == 1 and issubclass(said[0].category, Notice)
    assert "T=16 is below gen_length=32" in str(said[0].message)
    assert "give --steps 32" in str(said[0].message)


def test_the_rate_is_one_while_the_steps_left_cover_the_masks_left():
    masked = torch.zeros(40, dtype=torch.bool)
    masked[16:] = True  # a prompt of 16 (two whole blocks of 8): three blocks to write
    # 3 opening steps, then 3 × (3 + 4) masks in sub-blocks of 4
    assert rate(masked, 16, 8, 4, 24) == 1
    assert rate(masked, 16, 8, 4, 3 + 12) == 2
    assert rate(masked, 16, 8, 4, 3 + 6) == 4
    assert rate(masked, 16, 8, 4, 5) == 4  # not even a step per sub-block: a whole one


def test_the_rate_is_the_fewest_commits_that_end_in_time_on_random_rows():
    """`rate` against its definition, counted out: the smallest r >= 1 with which the openings
    (one step each) and every sub-block's masks at r a step fit the steps left, else a whole
    sub-block; around the masks left, where it stops counting and answers 1."""
    gen = torch.Generator().manual_seed(4)
    for trial in range(300):
        block, sub = (8, 4) if trial % 2 else (16, 8)
        prompt_len = 5 + trial % 11
        masked = torch.zeros(prompt_len + 48, dtype=torch.bool)
        first = prompt_len + int(torch.randint(0, 40, (1,), generator=gen))
        masked[first:] = torch.rand(len(masked) - first, generator=gen) < 0.8
        opening, sizes = units(masked, prompt_len, block, sub)
        left = int(masked.sum())
        for steps_left in range(max(1, left - 12), left + 3):
            fits = [
                r
                for r in range(1, max(sizes, default=1) + 1)
                if opening + sum(-(-n // r) for n in sizes) <= steps_left
            ]
            want = fits[0] if fits and steps_left - opening >= len(sizes) else max(sizes, default=1)
            assert rate(masked, prompt_len, block, sub, steps_left) == want


def test_a_steps_price_is_what_a_row_committing_its_rate_is_charged():
    """`row_works` (the planner's price) simulates a row committing exactly its rate: with a
    threshold nothing passes, the row's charged steps are the price, step for step."""
    for total in (32, 14):
        bb = FastDLLMv2(
            model="random", block_length=8, sub_block=4, threshold=1.0, seed=2, stop=False
        )
        prompt = bb.encode(Prompt(text="Question: 12+7?"))
        canvas = bb.canvas(prompt, 32)
        rows, works = [canvas.clone()], []
        bb.hold(prompt)
        for step in range(total):
            if not (rows[0] == bb.mask_id).any():
                break
            batch = StepBatch(rows, [len(prompt)], [step], [3], total)
            works += bb.step_work(batch)
            rows = bb.denoise_step(batch)
        bb.release(prompt)
        assert works == bb.row_works(canvas, len(prompt), total)


def test_the_charge_is_what_the_forward_computes_and_the_cache_changes_no_token():
    """A row's charged query tokens are the tokens its forwards ran; without the cache every
    step reruns the blocks before its own (the same tokens), at several times the FLOPs."""
    tokens, charged = {}, {}
    for cache in (True, False):
        bb = FastDLLMv2(model="random", block_length=8, sub_block=4, cache=cache, seed=5)
        shape = shape_of(bb.transformer)
        prompt = bb.encode(Prompt(text="Q: 1+1=?........"))
        rows = [bb.canvas(prompt, 32)]
        bb.hold(prompt)
        queries = total = 0
        for step in range(32):
            if not (rows[0] == bb.mask_id).any():
                break
            batch = StepBatch(rows, [len(prompt)], [step], [11], 32, settings=[{}])
            (work,) = bb.step_work(batch)
            queries += work.queries
            total += flops(shape, work)
            rows = bb.denoise_step(batch)
        bb.release(prompt)
        assert queries == bb.computed_queries
        tokens[cache], charged[cache] = rows[0], total
    assert torch.equal(tokens[True], tokens[False])
    assert charged[False] > 2 * charged[True]


def test_a_blocks_first_token_is_never_reopened():
    """Canvas edits re-mask only the current block, and never its first token, which the
    block before decides."""
    bb = FastDLLMv2(model="random", block_length=4, sub_block=2, seed=4)
    prompt = bb.encode(Prompt(text="Q: 1+1=?"))
    plen = len(prompt)
    assert plen % 4 == 0
    row = bb.canvas(prompt, 12)
    row[plen : plen + 3] = torch.tensor([7, 8, 9])  # the first block's opening token and two
    open_ = bb.reopenable(row, plen, {})
    assert open_.tolist() == [False, True, True] + [False] * 9


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"block_length": 32, "sub_block": 0}, "block_length and sub_block must be >= 1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"threshold": 1.5}, "threshold must be in [0, 1]"),
    ],
)
def test_settings_it_cannot_run_are_refused_in_one_line(config, needle):
    with pytest.raises(ValueError) as caught:
        FastDLLMv2(model="random", **config)
    assert needle in str(caught.value)
    bb = FastDLLMv2(model="random")
    with pytest.raises(UserError, match="fast-dllm-v2: a row's sampler settings"):
        bb.check_row_settings({"sub_block": 0}, 64, 64)


def test_a_tied_head_loads_as_one_tensor_and_samples_as_the_embedding(tmp_path):
    """A checkpoint whose head is its embedding (`tie_word_embeddings`, no lm_head.weight, as
    Qwen3-4B's) loads with one tensor for both, in the dtype asked for (converted key by key it
    was two: the embedding's memory twice on the device), and samples as a model whose head
    holds the embedding's weights."""
    src = BlockDiffusion(model="random", seed=6, block_length=4)
    net = src.transformer
    net.lm_head.weight.data.copy_(net.model.embed_tokens.weight.data)
    _save_block_checkpoint(src, tmp_path, "SDAR", {"head_dim": 16, "tie_word_embeddings": True})
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = BlockDiffusion(model=str(tmp_path), block_length=4, dtype="bfloat16")
    head, embedding = loaded.transformer.lm_head.weight, loaded.transformer.model.embed_tokens
    assert head is embedding.weight and head.dtype == torch.bfloat16
    again = BlockDiffusion(model=str(tmp_path), block_length=4)
    prompt = src.encode(Prompt(text="Question: 12+7?"))
    same = [run_rows(bb, prompt, 16, 16, [9])[0] for bb in (src, again)]
    assert torch.equal(same[0], same[1])


def _save_block_checkpoint(bb, path, model_type, extra):
    """A checkpoint directory as the Hub holds it: config.json in the model's own naming (its
    remote-code class, which is not run), safetensors, the tokenizer."""
    import json

    from safetensors.torch import save_file
    from test_backbones import qwen_config_json

    raw = qwen_config_json(
        bb,
        architectures=[f"{model_type}ForCausalLM"],
        model_type=model_type,
        auto_map={"AutoModelForCausalLM": f"modeling.{model_type}ForCausalLM"},
        **extra,
    )
    (path / "config.json").write_text(json.dumps(raw))
    state = {k: v.contiguous() for k, v in bb.transformer.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
    bb.tokenizer.save_pretrained(str(path))


@pytest.mark.parametrize(
    ("cls", "config", "model_type", "extra"),
    [
        (FastDLLMv2, {"block_length": 8, "sub_block": 4}, "Fast_dLLM_Qwen", {"bd_size": 8}),
        (BlockDiffusion, {"block_length": 4}, "SDAR", {"head_dim": 16}),
    ],
)
def test_a_local_checkpoint_loads_into_transformers_own_class_and_samples_alike(
    tmp_path, cls, config, model_type, extra
):
    """Fast-dLLM v2's checkpoint (Qwen2 with query, key and value biases) and SDAR's (Qwen3,
    per-head norms) load from a directory into transformers' own classes, their remote code
    unread, and sample as the model they were saved from."""
    src = cls(model="random", seed=6, **config)
    _save_block_checkpoint(src, tmp_path, model_type, extra)
    loaded = cls(model=str(tmp_path), **config)
    assert type(loaded.transformer) is type(src.transformer)
    assert loaded.mask_id == src.mask_id
    if cls is FastDLLMv2:
        assert loaded.transformer.model.layers[0].self_attn.q_proj.bias is not None
    prompt = src.encode(Prompt(text="Question: 12+7?"))
    assert loaded.encode(Prompt(text="Question: 12+7?")) == prompt
    same = [run_rows(bb, prompt, 16, 16, [9])[0] for bb in (src, loaded)]
    assert torch.equal(same[0], same[1])
