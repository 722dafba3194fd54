"""The block-diffusion backbone: token for token SDAR's reference sampler, an exact KV cache
charged at what it computes, and branches that reuse their parent's blocks."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import Qwen3Model

from dllmbench.api.interfaces import StepBatch
from dllmbench.core.errors import UserError
from dllmbench.core.flops import flops, shape_of
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.block import BlockDiffusion, choose

# -- SDAR's `block_diffusion_generate` (JetAstra/SDAR, generate.py at c2041a8), written out ------
# The model call keeps SDAR's cache discipline: a denoising pass leaves the cache as it was
# (store_kv=False), a store pass appends the block. torch.multinomial is replaced by an
# inverse-CDF draw from the backbone's keyed uniforms of the same step, so both draw alike.


CACHE_ARG = (
    "cache" if "cache" in inspect.signature(Qwen3Model.forward).parameters else "past_key_values"
)


def _call(model, x, mask, positions, cache, store):
    before = cache.get_seq_length()
    allowed = mask.bool()[:, None]
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    out = model(x, attention_mask=additive, position_ids=positions, **{CACHE_ARG: cache})
    added = cache.get_seq_length() - before
    if not store and added:
        cache.crop(-added)
    return out.logits


def reference_generate(
    model,
    prompt,
    mask_id,
    gen_length,
    block_length,
    denoising_steps,
    temperature,
    top_k,
    top_p,
    remasking,
    threshold,
    uniforms,
    stops,
    entropy_bound=None,
):
    from transformers import DynamicCache

    prompt_length = prompt.shape[1]
    cache = DynamicCache()
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    bd_mask = block_mask.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)[None]
    position_ids = torch.arange(total_length)[None]
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = prompt
    prefill_blocks = prompt_length // block_length
    prefill_length = prefill_blocks * block_length
    if prefill_length > 0:
        _call(
            model,
            x[:, :prefill_length],
            bd_mask[:, :prefill_length, :prefill_length],
            position_ids[:, :prefill_length],
            cache,
            True,
        )
    base, rem = divmod(block_length, denoising_steps)
    num_transfer = torch.full((denoising_steps,), base)
    num_transfer[:rem] += 1
    global_step = 0
    for nb in range(prefill_blocks, num_blocks):
        lo, hi = nb * block_length, (nb + 1) * block_length
        cur_x = x[:, lo:hi].clone()
        cur_mask = bd_mask[:, lo:hi, :hi]
        cur_pos = position_ids[:, lo:hi]
        for step in range(denoising_steps + 1):
            mask_index = cur_x == mask_id
            if mask_index.sum() == 0:
                _call(model, cur_x, cur_mask, cur_pos, cache, True)
                break
            logits = _call(model, cur_x, cur_mask, cur_pos, cache, False)
            # sample_with_temperature_topk_topp, the draw by the backbone's uniforms
            flat = logits.reshape(-1, logits.shape[-1]).clone()
            # the one change: the mask token is never drawn (a random model puts mass on it,
            # SDAR's checkpoints do not; drawn, it leaves the position masked and the
            # reference overruns its schedule with an IndexError)
            flat[:, mask_id] = float("-inf")
            # EB-Sampler's cost: the model's entropy, before temperature and filters
            entropy = torch.special.entr(torch.softmax(flat.double(), -1)).sum(-1)
            if temperature != 1.0:
                flat = flat / temperature
            if top_k:
                kth = torch.topk(flat, top_k)[0][..., -1, None]
                flat = torch.where(flat < kth, torch.full_like(flat, float("-inf")), flat)
            if top_p < 1.0:
                ordered, order = torch.sort(flat, descending=True)
                cum = torch.cumsum(torch.softmax(ordered, -1), -1)
                drop = cum > top_p
                drop[..., 1:] = drop[..., :-1].clone()
                drop[..., 0] = False
                drop = torch.zeros_like(drop).scatter(-1, order, drop)
                flat = flat.masked_fill(drop, float("-inf"))
            probs = torch.softmax(flat, dim=-1)
            u = uniforms(global_step)[lo:hi]
            cdf = probs.double().cumsum(-1)
            token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
            token = torch.minimum(token, torch.searchsorted(cdf, cdf[:, -1:].contiguous()))
            x0, x0_p = token.view(1, -1), probs.gather(-1, token).view(1, -1)
            k = int(num_transfer[step])
            confidence = torch.where(mask_index, x0_p, -torch.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            if remasking == "sequential":
                first = int(mask_index[0].nonzero()[0, 0])
                transfer[0, first : first + k] = True
            elif remasking == "low_confidence_static":
                transfer[0, torch.topk(confidence[0], k).indices] = True
            else:
                high = confidence[0] > threshold
                if high.sum() >= k:
                    transfer[0] = high
                else:
                    transfer[0, torch.topk(confidence[0], k).indices] = True
            if entropy_bound is not None:  # EB-Sampler's run, beyond SDAR's own commits
                # a block EB filled early can hold fewer masks than k: SDAR's top-k would
                # overwrite committed tokens (see below); the backbone commits masks only
                transfer &= mask_index
                ranked = [j for j in confidence[0].argsort(descending=True).tolist()]
                ranked = [j for j in ranked if mask_index[0, j]]
                for m in range(1, len(ranked) + 1):
                    spent = entropy[ranked[:m]]
                    if float(spent.sum() - spent.max()) <= entropy_bound:
                        transfer[0, ranked[m - 1]] = True
            cur_x[transfer] = x0[transfer]
            global_step += 1
        x[:, lo:hi] = cur_x
        if any(s in x[0, prompt_length:] for s in stops):
            break
    return x[0]


def run_rows(bb, prompt_ids, gen_length, total, keys, settings=None):
    """Rows of one prompt stepped until none is masked, in one batch per step."""
    canvas = bb.canvas(prompt_ids, gen_length)
    rows = [canvas.clone() for _ in keys]
    plen = len(prompt_ids)
    bb.hold(prompt_ids)
    bb.steps_taken = 0
    for step in range(total):
        live = [i for i, r in enumerate(rows) if (r[plen:] == bb.mask_id).any()]
        if not live:
            break
        bb.steps_taken += 1
        batch = StepBatch(
            [rows[i] for i in live],
            [plen] * len(live),
            [step] * len(live),
            [keys[i] for i in live],
            total,
            settings=[settings or {} for _ in live],
        )
        for i, new in zip(live, bb.denoise_step(batch), strict=True):
            rows[i] = new
    bb.release(prompt_ids)
    return rows


def stepped(bb, prompts, which, steps, settings=None, gen_length=16):
    """Rows of `prompts[i]` for i in `which` (keys 7 + i), stepped `steps` times in one batch
    per step."""
    rows = [bb.canvas(prompts[i], gen_length) for i in which]
    for i in which:
        bb.hold(prompts[i])
    for t in range(steps):
        batch = StepBatch(
            rows,
            [len(prompts[i]) for i in which],
            [t] * len(which),
            [7 + i for i in which],
            gen_length,
            settings=[settings or {} for _ in which],
        )
        rows = bb.denoise_step(batch)
    for i in which:
        bb.release(prompts[i])
    return rows


SHARPER = 40  # a random model's head scaled: its positions' entropies differ

CASES = [
    # family, block, steps per block, remasking, threshold, temperature, prompt text, and
    # EB-Sampler's entropy_bound (its run committed beyond SDAR's own positions) or None; the
    # last two low_confidence_static prompts fill whole blocks, then leave 2 masks in block 3
    ("qwen3", 4, 4, "low_confidence_dynamic", 0.5, 0.03, "Question: 12+7?", None),
    ("qwen3", 8, 8, "low_confidence_dynamic", 0.9, 0.03, "What is 9-2?", None),
    ("qwen2", 4, 4, "low_confidence_dynamic", 0.5, 0.03, "Question: 12+7?", None),
    ("qwen2", 8, 8, "low_confidence_dynamic", 0.5, 0.03, "Question: 3*4+5=?", None),
    ("qwen3", 8, 4, "low_confidence_static", 0.9, 0.1, "Q: 1+1=?........", None),
    ("qwen2", 4, 2, "low_confidence_static", 0.9, 0.1, "Q: 2+2=?......", None),
    ("qwen3", 4, 4, "sequential", 0.9, 0.1, "Question: 12+7?", None),
    ("qwen3", 4, 4, "low_confidence_static", 0.85, 0.5, "Question: 12+7?", 3.0),
    ("qwen2", 8, 8, "low_confidence_static", 0.85, 0.5, "Question: 12+7?", 2.0),
    ("qwen3", 8, 4, "low_confidence_dynamic", 0.85, 0.3, "Question: 12+7?", 2.0),
    ("qwen3", 4, 4, "sequential", 0.85, 0.5, "Question: 12+7?", 3.0),
    # SDAR-MoE's architecture (sdar_moe.py): the same sampler over routed experts
    ("qwen3_moe", 4, 4, "low_confidence_dynamic", 0.5, 0.03, "Question: 12+7?", None),
    ("qwen3_moe", 8, 4, "low_confidence_static", 0.85, 0.5, "What is 9-2?", 2.0),
]


@pytest.mark.parametrize(
    ("family", "block", "per", "remasking", "threshold", "temperature", "text", "bound"), CASES
)
def test_the_sampler_is_sdar_token_for_token(
    family, block, per, remasking, threshold, temperature, text, bound
):
    steps, gen, written = same_as_sdar(
        family, block, per, remasking, threshold, temperature, text, bound
    )
    if remasking == "low_confidence_dynamic":  # the threshold committed several at a step
        assert steps < gen  # k = 1: fewer steps than tokens
    if bound is not None:  # so did EB-Sampler's run
        assert steps < written


@pytest.mark.parametrize(
    ("remasking", "temperature", "top_k", "top_p"),
    [
        ("low_confidence_dynamic", 1.0, 5, 1.0),
        ("low_confidence_static", 0.7, None, 0.9),
        ("low_confidence_dynamic", 0.5, 8, 0.95),
        ("sequential", 1.0, 3, 0.8),
    ],
)
def test_the_sampler_filters_as_sdar_does(remasking, temperature, top_k, top_p):
    """SDAR's filters in its order: temperature, then top-k, then top-p over what is left,
    the confidence the drawn token's probability after both."""
    args = ("qwen3", 4, 4, remasking, 0.5, temperature, "Question: 12+7?", None)
    same_as_sdar(*args, top_k=top_k, top_p=top_p)


def same_as_sdar(
    family, block, per, remasking, threshold, temperature, text, bound, top_k=None, top_p=1.0
) -> tuple[int, int, int]:
    """The backbone's row and SDAR's `block_diffusion_generate` (transcribed above) on the
    same noise: the same tokens. Returns the steps the row took, its gen_length and the
    tokens the reference wrote."""
    bb = BlockDiffusion(
        model="random",
        family=family,
        block_length=block,
        temperature=temperature,
        remasking=remasking,
        threshold=threshold,
        top_k=top_k,
        top_p=top_p,
        seed=3,
    )
    if bound is not None:  # a sharper head: entropies from 0 to 2 nats, not 4.6 everywhere
        bb.transformer.lm_head.weight.data.mul_(SHARPER)
    prompt = bb.encode(Prompt(text=text))
    gen = 4 * block
    total = (gen // block) * per
    key = 1234
    settings = {} if bound is None else {"entropy_bound": bound}
    ours = run_rows(bb, prompt, gen, total, [key], settings)[0]
    width = len(ours)
    ref = reference_generate(
        bb.transformer,
        torch.tensor([prompt]),
        bb.mask_id,
        gen,
        block,
        per,
        temperature,
        top_k or 0,
        top_p,
        remasking,
        threshold,
        lambda step: torch.cat([bb.noise_at(key, step, "token", width), torch.rand(block)]),
        sorted(bb.stop_ids),
        entropy_bound=bound,
    )
    # SDAR's canvas runs on to a block boundary; the backbone's is prompt + gen_length, its last
    # block as much shorter: every block before that one is the same computation
    same = width if width % block == 0 else width // block * block
    assert len(ref) == -(-width // block) * block
    ours, ref = ours[:same], ref[:same]
    written = ref != bb.mask_id
    assert torch.equal(ours[written], ref[written])
    # after the reference stopped at an end token, the row's rest holds that token
    assert bool((ours[~written] == bb.eos_id).all())
    assert int(written.sum()) > len(prompt) + block  # it wrote more than one block
    return bb.steps_taken, gen, int(written.sum()) - len(prompt)


def test_entropy_bound_adds_the_run_of_the_most_confident_to_remasking():
    """`choose` on four masked positions whose most confident are unsure: ranked by
    confidence (2, 3, 1, 0) the run within γ = 1.5 is {2, 3} (1.42 nats; adding 1 spends 2.09),
    beside the one `low_confidence_static` commits; counted in position order it would be
    three."""
    conf = torch.tensor([0.55, 0.6, 0.8, 0.75], dtype=torch.float64)
    entropy = torch.tensor([0.688, 0.673, 1.42, 1.71], dtype=torch.float64)
    ties = torch.rand(4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    config = BlockDiffusion.Config(model="random", remasking="low_confidence_static")
    assert choose(conf, 1, config, ties).tolist() == [False, False, True, False]
    bounded = BlockDiffusion.Config(
        model="random", remasking="low_confidence_static", entropy_bound=1.5
    )
    assert choose(conf, 1, bounded, ties, entropy).tolist() == [False, False, True, True]
    sequential = BlockDiffusion.Config(model="random", remasking="sequential", entropy_bound=1.5)
    assert choose(conf, 1, sequential, ties, entropy).tolist() == [True, False, True, True]


def test_entropy_bound_rows_in_one_batch_are_the_rows_alone():
    """Rows of two prompts under one γ share a draw group: each row's run is ranked and
    bounded by its own confidences and entropies, as it is alone (a sharper head, so that
    entropies differ between positions and rows)."""
    bb = BlockDiffusion(model="random", seed=3, remasking="low_confidence_static", temperature=0.5)
    bb.transformer.lm_head.weight.data.mul_(SHARPER)
    prompts = [bb.encode(Prompt(text=t)) for t in ("Question: 12+7?", "What is 9-2?")]
    together = stepped(bb, prompts, [0, 1], 6, {"entropy_bound": 1.0})
    assert torch.equal(together[0], stepped(bb, prompts, [0], 6, {"entropy_bound": 1.0})[0])
    assert torch.equal(together[1], stepped(bb, prompts, [1], 6, {"entropy_bound": 1.0})[0])
    # the schedule commits one a step (10 of 16 left after 6 steps); EB committed more
    assert all(int((row == bb.mask_id).sum()) < 10 for row in together)


@pytest.mark.parametrize("entropy_bound", [None, 2.0])
def test_the_draw_in_chunks_is_the_draw_in_one_piece(monkeypatch, entropy_bound):
    """The float64 sampler over [positions, vocabulary] goes a chunk of positions at a time
    (as Dream's): every token, probability and entropy is the one-piece draw's."""
    from dllmbench.plugins.backbones import block as block_module

    c = BlockDiffusion.Config(model="random", top_p=0.9, entropy_bound=entropy_bound)
    gen = torch.Generator().manual_seed(2)
    logits, u = (
        torch.randn(37, 50, generator=gen),
        torch.rand(37, generator=gen, dtype=torch.float64),
    )
    whole = block_module.draw(logits, u, c, 3)
    monkeypatch.setattr(block_module, "CHUNK_ELEMENTS", 50 * 8)  # chunks of 8 positions
    chunked = block_module.draw_in_chunks(block_module.draw, logits, u, c, 3)
    for a, b in zip(whole, chunked, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert (chunked[2] is None) == (entropy_bound is None)


def test_a_block_filled_by_fewer_tokens_than_k_commits_what_is_masked():
    """SDAR's top-k takes k positions even when fewer are masked (the prompt's tail shares the
    first block), overwriting committed tokens by the order torch.topk gives equal -inf; the
    backbone commits the masked ones only, and the prompt stays as it was."""
    bb = BlockDiffusion(model="random", block_length=4, remasking="low_confidence_static")
    prompt = bb.encode(Prompt(text="Question: 12+7?"))  # 15 tokens: one mask in block 3
    row = run_rows(bb, prompt, 16, 8, [5])[0]  # 2 steps per block, k = 2
    assert row[: len(prompt)].tolist() == prompt
    assert not bool((row == bb.mask_id).any())


def test_the_cache_gives_the_tokens_of_recomputing_and_a_third_of_the_flops():
    """256 generated tokens in blocks of 32: a row's tokens with the cache equal the row
    recomputed from scratch at every step, for a fraction of the FLOPs."""
    text = "Question: what is 12 plus 7, times 3?"
    gen, block, per = 256, 32, 8
    total = gen // block * per
    common = dict(model="random", block_length=block, temperature=0.5, stop=False, seed=1)
    cached, plain = BlockDiffusion(**common), BlockDiffusion(**common, cache=False)
    prompt = cached.encode(Prompt(text=text))
    shape = shape_of(cached.transformer)
    spent = {}
    rows = {}
    for name, bb in (("cached", cached), ("plain", plain)):
        canvas = bb.canvas(prompt, gen)
        row, charged = canvas.clone(), 0
        bb.hold(prompt)
        for step in range(total):
            if not (row[len(prompt) :] == bb.mask_id).any():
                break
            batch = StepBatch([row], [len(prompt)], [step], [77], total)
            charged += flops(shape, bb.step_work(batch)[0])
            row = bb.denoise_step(batch)[0]
        bb.release(prompt)
        spent[name], rows[name] = charged, row
    assert torch.equal(rows["cached"], rows["plain"])
    ratio = spent["cached"] / spent["plain"]
    assert ratio <= 1 / 3, ratio
    assert cached.store.nbytes == 0  # released with the problem


class TokenSum:
    """A process scorer that reads any tokens: a fixed pseudo-random value of the canvas."""

    reads_partial = True

    def score(self, batch):
        import numpy as np

        return np.array([float((t * torch.arange(len(t))).sum() % 97) / 97 for t in batch.tokens])


def _engine_run(backbone, spec, size=3, total=16, gen=16):
    from dllmbench.execution.engine import Capacity, Engine, Sampling
    from dllmbench.execution.method import Method, MethodSpec
    from dllmbench.loading.registry import registry
    from dllmbench.testing.doubles import ToySum

    task = ToySum(size=size)
    method = Method.build(registry(), MethodSpec.parse(spec), None)
    engine = Engine(
        backbone=backbone,
        scorers={"prm": TokenSum()},
        task=task,
        methods=[method],
        sampling=Sampling(total, gen, "fewshot", 0),
        capacity=Capacity(batch_rows=64, problems=2),
    )
    records = engine.run(task.problems("test"))
    return records, engine


@pytest.mark.parametrize("spec", ["prm_guided:k=4,every=4", "smc:k=4,every=4"])
def test_a_branch_does_not_recompute_its_parents_blocks(spec):
    """PRM Guided and SMC on the block backbone: every forward computes exactly what it is
    charged, a row's first forward after branching computes its current block (and the block
    it finished just before) but never the prefix its parent wrote, and the run's candidates
    are those of recomputing everything at every step."""
    common = dict(model="random", block_length=4, temperature=0.5, stop=False)
    bb = BlockDiffusion(**common)
    steps: list[int] = []
    queries: list[int] = []
    charged: list[int] = []
    real_run, real_work = bb.run, bb.step_work

    def run(rows, plans):
        queries.extend(p.end - p.start for p in plans)
        return real_run(rows, plans)

    def step_work(batch):
        works = real_work(batch)
        steps.extend(s for s, w in zip(batch.steps, works, strict=True) if w.queries)
        charged.extend(w.queries for w in works if w.queries)
        return works

    bb.run, bb.step_work = run, step_work
    records, _engine = _engine_run(bb, spec)
    assert queries == charged  # computed what it was charged, row by row
    block = 4
    after_start = [q for s, q in zip(steps, queries, strict=True) if s > 0]
    assert after_start and max(after_start) <= 2 * block
    assert bb.store.nbytes == 0  # freed when the problems ended
    plain = BlockDiffusion(**common, cache=False)
    again, _ = _engine_run(plain, spec)
    texts = [[c["text"] for c in r["candidates"]] for r in records]
    assert texts == [[c["text"] for c in r["candidates"]] for r in again]
    assert plain.computed_queries > 2 * bb.computed_queries


@pytest.mark.parametrize("cache", [True, False])
def test_a_rows_price_is_what_a_row_committing_k_per_step_is_charged(cache):
    """`row_works` (the planner's price) is, step by step, the charge of a row that commits
    exactly k tokens per step (static, no stop); a row under a threshold ends sooner and is
    charged no more."""
    common = dict(model="random", block_length=4, stop=False, cache=cache)
    static = BlockDiffusion(**common, remasking="low_confidence_static")
    prompt = static.encode(Prompt(text="Question: 12+7?"))
    gen, total = 32, 16  # 8 blocks, 2 steps each, k = 2
    canvas = static.canvas(prompt, gen)
    priced = static.row_works(canvas, len(prompt), total)
    shape = shape_of(static.transformer)
    for bb in (static, BlockDiffusion(**common, temperature=0.03, threshold=0.1)):
        row, works = canvas.clone(), []
        for step in range(total):
            if not (row[len(prompt) :] == bb.mask_id).any():
                break
            batch = StepBatch([row], [len(prompt)], [step], [9], total)
            works.append(bb.step_work(batch)[0])
            row = bb.denoise_step(batch)[0]
        if bb is static:
            assert works == priced
        else:
            assert len(works) < len(priced)
            assert sum(flops(shape, w) for w in works) <= sum(flops(shape, w) for w in priced)


def test_cache_memory_is_set_aside_before_a_forward_is_sized(monkeypatch):
    """On a (pretended) GPU: the KV cache gets its share of the free memory first; problems in
    flight are as many as fit there; the store is bounded by that share; a forward is sized
    from what is left; and a problem that cannot fit at all is one line."""
    from dllmbench.execution.engine import CACHE_SHARE, MEMORY_SHARE, Capacity, sized_to_memory

    free = 10**7
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, free))
    bb = BlockDiffusion(model="random")
    bb.device = "cuda"
    per_token = bb.cache_bytes(1)
    assert per_token == 2 * (2 * 2 * 2 * 16 * 4)  # twice: layers, k and v, kv heads, head dim, fp32
    tokens = 8 * 100  # 8 rows of 100 tokens
    sized = sized_to_memory(Capacity(problems=32), bb, tokens)
    share = int(free * CACHE_SHARE)
    assert sized.problems == share // (tokens * per_token) < 32
    assert bb.store.budget == share
    config = bb.transformer.config
    activations = 2 * (6 * config.hidden_size + 3 * config.intermediate_size) * 4
    assert sized.batch_tokens == int((free - share) * MEMORY_SHARE) // activations
    with pytest.raises(UserError, match="one problem's KV cache"):
        sized_to_memory(Capacity(), bb, 10**5)


class _Sized(Exception):
    pass


@pytest.mark.parametrize("rollouts", [0, 2])
def test_a_collection_is_sized_to_the_gpu_as_a_run_is(monkeypatch, tmp_path, rollouts):
    """`collect` and `demo retrain`'s collection on a (pretended) GPU: the KV cache gets its
    share of the free memory and the problems in flight are as many as fit there, each holding
    its rows (n, and R rollouts of each at every snapshot before the end) × the longest
    prompt's canvas, as `run` sizes them; a problem that cannot fit is one line."""
    import dllmbench.scoring.collect as collect
    from dllmbench.execution.engine import CACHE_SHARE, Capacity, Sampling
    from dllmbench.loading.registry import registry
    from dllmbench.tasks.arith import Arith

    bb = BlockDiffusion(model="random")
    bb.device = "cuda"
    task = Arith(test_size=6)
    problems = task.problems("test")
    sampling = Sampling(total_steps=8, gen_length=16, prompt_style="fewshot")
    prompt = max(len(bb.encode(task.prompt(p, "fewshot"))) for p in problems)
    tokens = 2 * (1 + rollouts * 2) * (prompt + 16)
    free = int(4.5 * bb.cache_bytes(tokens) / CACHE_SHARE)  # room for 4 problems' caches
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, free))
    seen: list[Capacity] = []

    def engine(**kwargs):
        seen.append(kwargs["capacity"])
        raise _Sized

    monkeypatch.setattr(collect, "Engine", engine)
    cfg = collect.CollectConfig(
        task, bb, {}, problems, 2, [2, 4, 8], sampling, Capacity(problems=32), rollouts=rollouts
    )
    with pytest.raises(_Sized):
        collect.run_collection(cfg, registry(), tmp_path / "out")
    share = int(free * CACHE_SHARE)
    assert seen[0].problems == share // bb.cache_bytes(tokens) == 4
    assert bb.store.budget == share
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10**5, 10**5))
    with pytest.raises(UserError, match="one problem's KV cache"):
        collect.run_collection(cfg, registry(), tmp_path / "again")


def test_a_store_over_its_budget_frees_other_problems_then_refuses():
    from dllmbench.plugins.backbones.kvstore import Entry, PrefixStore

    store = PrefixStore(budget_bytes=3 * 64)
    kv = lambda: torch.zeros(16)  # noqa: E731  64 bytes
    store.hold([1])
    store.put((b"a", 4), b"x", Entry(None, 0, 4, kv()))
    store.put((b"b", 4), b"y", Entry(None, 0, 4, kv()))
    store.put((b"b", 4), b"z", Entry(b"y", 4, 8, kv()))
    assert store.nbytes == 3 * 64
    store.put((b"b", 4), b"w", Entry(b"z", 8, 12, kv()))  # frees problem a's entries
    assert ((b"a", 4), b"x") not in store and store.nbytes == 3 * 64
    with pytest.raises(UserError, match="KV cache of one problem"):
        store.put((b"b", 4), b"v", Entry(b"w", 12, 16, kv()))


def test_remdm_on_the_block_backbone_reopens_only_the_current_block():
    """ReMDM re-masks committed tokens of the block being written, never a committed block
    (its keys and values are cached and exact): a row's first masked block never moves back.
    Edited blocks still end within their share of T (the quota follows the edit), every
    candidate ends fully decoded, and the edits change the samples."""
    common = dict(model="random", block_length=4, temperature=1.0, stop=False)
    bb = BlockDiffusion(**common, remasking="low_confidence_static")
    first_masked: dict[int, list[int]] = {}
    edited: list[bool] = []
    real = bb.denoise_step_with_confidence

    def step(batch):
        for i, tokens in enumerate(batch.tokens):
            gen = tokens[batch.prompt_lens[i] :]
            masked = (gen == bb.mask_id).nonzero().flatten()
            at = (int(masked[0]) + batch.prompt_lens[i]) // 4
            first_masked.setdefault(batch.keys[i], []).append(at)
            edited.append(batch.was_edited(i))
        return real(batch)

    bb.denoise_step_with_confidence = step
    records, _ = _engine_run(bb, "remdm:n=4,eta=0.5")
    assert any(edited)  # ReMDM re-masked something
    mask = bb.tokenizer.decode([bb.mask_id])
    assert mask
    for blocks in first_masked.values():
        assert blocks == sorted(blocks), blocks
    plain, _ = _engine_run(
        BlockDiffusion(**common, remasking="low_confidence_static"), "independent:n=4"
    )
    texts = [[c["text"] for c in r["candidates"]] for r in records]
    assert texts != [[c["text"] for c in r["candidates"]] for r in plain]
    for r in records:
        assert r["ledger"]["passes"] == {"denoise": 4 * 16}  # each row took its T = 16 steps
        assert all(mask not in c["text"] for c in r["candidates"])


def test_an_edited_block_ends_within_its_share_of_t():
    """SDAR's k = block / S per step cannot decode re-masked positions in time; an edited
    row's quota spreads what is masked over the steps its block has left."""
    # 16 tokens in blocks of 4, T = 16: S = 4 steps a block, k = 1
    assert BlockDiffusion.quota(4, 0, 16, 16, 1, 0, 3) == 1
    assert BlockDiffusion.quota(4, 0, 16, 16, 1, 0, 3, edited=True) == 1  # 3 left over 3 steps
    assert BlockDiffusion.quota(4, 0, 16, 16, 2, 0, 3, edited=True) == 2  # 3 left over 2 steps
    assert BlockDiffusion.quota(4, 0, 16, 16, 3, 0, 2, edited=True) == 2  # the block's last step


def test_steps_that_do_not_divide_the_block_follow_sdars_shares_only_when_each_commits_its_share():
    """docs/backbones.md: with S = 3 steps per block of 8 SDAR commits 3, 3, 2 at a block's steps
    whatever they committed before. The quota is the same on a prompt ending on a boundary
    when each step commits its share; after a threshold step that committed 6, or with a prompt
    off a boundary (T spread over one block more), it is not."""
    block, gen, total = 8, 32, 12  # 4 blocks, 3 steps each
    sdar = [3, 3, 2]
    plen = 16  # on a boundary: the first decoded block is block 2
    masked, shares = 8, []
    for step in range(3):
        k = BlockDiffusion.quota(block, plen, plen + gen, total, step, 2, masked)
        shares.append(k)
        masked -= k
    assert shares == sdar
    # a threshold step committed 6 of the 8: SDAR's next share is still 3, the quota is 1
    assert BlockDiffusion.quota(block, plen, plen + gen, total, 1, 2, 2) == 1 != sdar[1]
    # off a boundary (15 prompt tokens: block 1 holds one mask and takes step 0), block 2's
    # first step commits 2 where SDAR commits 3
    assert BlockDiffusion.quota(block, 15, 15 + gen, total, 1, 2, 8) == 2 != sdar[0]
