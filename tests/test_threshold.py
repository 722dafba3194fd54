"""Parallel decoding as sampler settings of Dream and LLaDA, Fast-dLLM's (`threshold`, `factor`)
and EB-Sampler's (`entropy_bound`): today's sampler as the floor, the rules beyond it worked by
hand and against transcriptions, rows that end early through the engine, and what a denoising
forward computes (`step_work`)."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch
from test_backbones import reference_logits
from test_samplers import Positional

from dllmbench.api.interfaces import FinishesEarly, StepBatch, model_shape, passes_per_step
from dllmbench.core.errors import UserError
from dllmbench.core.flops import Work, flops
from dllmbench.core.types import Prompt
from dllmbench.execution.engine import Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import entropy_bound_count, factor_count
from dllmbench.plugins.backbones.block import BlockDiffusion
from dllmbench.plugins.backbones.block import draw as block_draw
from dllmbench.plugins.backbones.dream import Dream, quota
from dllmbench.plugins.backbones.dream import draw as dream_draw
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.loading import char_tokenizer
from dllmbench.plugins.backbones.tiny import Tiny
from dllmbench.tasks.arith import Arith


# -- settings -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,config,needle",
    [
        (Dream, {"threshold": 0.9, "factor": 1.0}, "set one of threshold, factor or entropy_bound"),
        (LLaDA, {"factor": 1.0, "entropy_bound": 0.1}, "got factor and entropy_bound"),
        (Dream, {"entropy_bound": 0.0}, "entropy_bound must be a finite number > 0"),
        (LLaDA, {"entropy_bound": math.inf}, "entropy_bound must be a finite number > 0"),
        (LLaDA, {"entropy_bound": math.nan}, "entropy_bound must be a finite number > 0"),
        (Dream, {"entropy_bound": 0.1, "alg": "origin"}, "alg=maskgit_plus or topk_margin or"),
        (LLaDA, {"entropy_bound": 0.1, "remasking": "random"}, "use remasking=low_confidence"),
        (LLaDA, {"threshold": 0.0}, r"threshold must be in \(0, 1\]"),
        (LLaDA, {"threshold": 1.5}, r"threshold must be in \(0, 1\]"),
        (Dream, {"factor": 0.0}, "factor must be > 0"),
        (Dream, {"threshold": 0.9, "alg": "origin"}, "alg=maskgit_plus"),
        (Dream, {"factor": 1.0, "alg": "entropy"}, "alg=maskgit_plus"),
        (LLaDA, {"threshold": 0.9, "remasking": "random"}, "remasking=low_confidence"),
    ],
)
def test_settings_that_make_no_sense_are_refused_in_one_line(cls, config, needle):
    with pytest.raises(ValueError, match=needle):
        cls.Config(model="random", **config)
    bb = cls(model="random")
    with pytest.raises(UserError, match=needle):
        bb.check_row_settings(config, 8, 4)


@pytest.mark.parametrize("cls", [Dream, LLaDA, Tiny])
def test_rows_with_a_parallel_decoding_rule_finish_early(cls):
    bb = cls(model="random")
    assert isinstance(bb, FinishesEarly)
    assert {"threshold", "factor", "entropy_bound"} <= bb.row_settings
    assert not bb.finishes_early({}) and not bb.finishes_early({"temperature": 0.0})
    assert bb.finishes_early({"threshold": 0.9}) and bb.finishes_early({"factor": 1.0})
    assert bb.finishes_early({"entropy_bound": 0.1})
    assert cls(model="random", threshold=0.8).finishes_early({})
    assert cls(model="random", entropy_bound=0.8).finishes_early({})


def test_entropy_bound_ranks_by_every_confidence_of_dream_but_origins_random_order():
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        assert Dream.Config(model="random", alg=alg, entropy_bound=0.1).ends_early


# -- (a) threshold 1.0 is today's sampler ----------------------------------------------------
@pytest.mark.parametrize("cls", [Dream, LLaDA])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_threshold_one_gives_todays_tokens_over_a_whole_t(cls, dtype):
    """Rows at threshold 1.0 beside rows without it, in one batch, one and several blocks:
    every state and every committed confidence is the same, step by step."""
    T, gen = 6, 12
    bb = cls(model="random", dtype=dtype)
    prompts = [bb.encode(Prompt(text=p)) for p in ("12+30=", "7*8=")]
    plain = [{}, {"block_length": 4}]
    settings = [s for s in plain for s in (s, {**s, "threshold": 1.0})]
    rows = [(p, s, key) for p in prompts for s in settings for key in (3, 11)]
    tokens = [bb.canvas(p, gen) for p, _, _ in rows]
    for t in range(T):
        batch = StepBatch(
            tokens,
            [len(p) for p, _, _ in rows],
            [t] * len(rows),
            [key for _, _, key in rows],
            T,
            settings=[s for _, s, _ in rows],
        )
        out = bb.denoise_step_with_confidence(batch)
        tokens = [new for new, _ in out]
        for i in range(0, len(rows), 4):  # (plain, threshold) pairs of one key
            for j in (i, i + 1):
                assert torch.equal(out[j][0], out[j + 2][0])
                torch.testing.assert_close(out[j][1], out[j + 2][1], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_extra_commits_are_the_proposals_already_drawn(cls):
    """At a threshold every confidence passes, the first step fills the canvas, with the
    tokens the plain step committed where it committed it."""
    bb = cls(model="random", temperature=1.0)
    prompt = bb.encode(Prompt(text="12+30="))
    canvas, plen = bb.canvas(prompt, 8), len(prompt)

    def step(settings):
        return bb.denoise_step(StepBatch([canvas], [plen], [0], [5], 4, settings=[settings]))[0]

    plain, everything = step({}), step({"threshold": 1e-12})
    committed = plain != bb.mask_id
    assert 0 < int(committed[plen:].sum()) < 8
    assert (everything[plen:] != bb.mask_id).all()
    assert torch.equal(everything[committed], plain[committed])


# -- (b) the rules worked by hand ---------------------------------------------------------------
@pytest.mark.parametrize(
    "confidence,factor,expected",
    [
        ([], 1.0, 0),
        ([0.01], 1.0, 1),  # a lone position always commits
        ([0.1, 0.05], 1.0, 2),  # two: the miss at the last rank is ignored
        ([0.9, 0.5, 0.4, 0.3], 1.0, 1),  # rank 1: 0.5 < 1 − 1/3
        ([0.5, 0.9, 0.7, 0.1], 1.0, 2),  # ranked 0.9, 0.7 ≥ 2/3, 0.5 < 3/4
        ([0.9, 0.8, 0.1], 1.0, 3),  # the miss is at the last rank: all three
        ([0.99, 0.95, 0.92, 0.7, 0.3, 0.1], 2.0, 4),  # 1 − 2/(i+2): 1/3, 1/2, 3/5, 2/3
        ([0.99, 0.95, 0.92, 0.7, 0.3, 0.1], 1.0, 3),  # 0.7 < 4/5
        ([0.75, 0.75, 0.75], 1.0, 3),
        ([0.8, 0.75, 0.75, 0.1], 1.0, 4),  # 0.75 at rank 2 is 1 − 1/4: passes; 0.1 is last
        ([0.8, 0.75, 0.75, 0.1, 0.05], 1.0, 3),  # ... and 0.1 at rank 3 of 5 misses
    ],
)
def test_factor_count_worked_by_hand(confidence, factor, expected):
    assert factor_count(torch.tensor(confidence, dtype=torch.float64), factor) == expected


def reference_factor_count(confidence: list[float], factor: float) -> int:
    """Fast-dLLM's get_transfer_index_dynamic count, written as the reference's loop."""
    n = len(confidence)
    thresholds = [1 - factor / (m + 1) for m in range(1, n + 1)]
    thresholds[0] = -1
    ranked = sorted(confidence, reverse=True)
    top = 0
    for top in range(n):
        if ranked[top] < thresholds[top]:
            break
    if top == 0 or top == n - 1:
        top += 1
    return top


def test_factor_count_is_the_references_loop():
    gen = torch.Generator().manual_seed(0)
    for trial in range(400):
        n = 1 + trial % 13
        confidence = (1 - torch.rand(n, generator=gen, dtype=torch.float64) ** 3).tolist()
        for factor in (0.25, 1.0, 2.0, 5.0):
            expected = reference_factor_count(confidence, factor)
            assert factor_count(torch.tensor(confidence, dtype=torch.float64), factor) == expected


@pytest.mark.parametrize(
    "entropy,bound,expected",
    [
        ([], 0.1, 0),
        ([3.0], 0.1, 1),  # a lone position: the sum less the largest is 0
        ([0.125, 0.25, 2.0], 0.3, 2),  # 0.125 + 0.25 − 0.25; then + 2 − 2 = 0.375
        ([0.125, 0.25, 2.0], 0.375, 3),  # ... at most the bound: the boundary commits
        ([0.5, 0.125, 0.125, 0.125], 0.25, 3),  # 0.5 stays the largest: 0.125 + 0.125
        ([0.5, 0.125, 0.125, 0.125], 0.375, 4),
        ([2.0, 0.0, 0.0, 5.0, 0.0], 1.5, 3),  # certain positions cost nothing; then 7 − 5
        ([2.0, 0.0, 0.0, 5.0, 0.0], 2.0, 5),
        ([2.0, 0.0, 0.0, 5.0, 0.25], 2.0, 4),
    ],
)
def test_entropy_bound_count_worked_by_hand(entropy, bound, expected):
    assert entropy_bound_count(torch.tensor(entropy, dtype=torch.float64), bound) == expected


def reference_entropy_bound_count(entropy: list[float], bound: float) -> int:
    """EB-Sampler's set, written as its definition: the largest k whose first k entropies sum,
    less their largest, to at most the bound."""
    k = 0
    for m in range(1, len(entropy) + 1):
        if math.fsum(entropy[:m]) - max(entropy[:m]) <= bound:
            k = m
    return k


def test_entropy_bound_count_is_its_definition():
    gen = torch.Generator().manual_seed(1)
    for trial in range(400):
        n = 1 + trial % 17
        entropy = (torch.rand(n, generator=gen, dtype=torch.float64) ** 2 * 3).tolist()
        for bound in (1e-3, 0.1, 0.5, 2.0):
            expected = reference_entropy_bound_count(entropy, bound)
            got = entropy_bound_count(torch.tensor(entropy, dtype=torch.float64), bound)
            # the cumulative sum and fsum may round apart at exactly the bound: not drawn here
            assert got == expected, (entropy, bound)


PROBABILITIES = (0.99, 0.95, 0.92, 0.7, 0.3, 0.1)  # of the answer positions' token 'a'


def confident_backbone(cls, **config):
    """A backbone whose answer position j draws 'a' with probability PROBABILITIES[j] (argmax,
    float64 softmax), whatever the canvas; the prompt is "1+1=" (4 tokens)."""
    tok = char_tokenizer()
    a, size = tok.get_vocab()["a"], len(tok)
    table = torch.zeros(12, size)
    first = 4 - 1 if cls is Dream else 4  # Dream reads position i's logits at i − 1
    for j, p in enumerate(PROBABILITIES):
        table[first + j, a] = math.log(p * (size - 1) / (1 - p))
    net = Positional(table)
    bb = cls(transformer=net, tokenizer=tok, **{"temperature": 0.0, **config})
    exact = torch.softmax(net.lm_head.weight.T.double(), dim=-1)[first : first + 6, a]
    return bb, exact


# answer positions ranked differently by confidence (2, 3, 1, 0, 4, 5), by entropy (1, 0, 2,
# 3, ...) and by position, where the sure-looking ones are unsure: (the probability of 'a', of
# 'b' or None for the rest spread evenly); confidences .55, .6, .8, .75, .3, .1 and entropies
# about .69, .67, 1.42, 1.71, 3.83 and 4.47 nats
SHAPED = ((0.55, 0.45), (0.6, 0.4), (0.8, None), (0.75, None), (0.3, None), (0.1, None))


def shaped_backbone(cls, **config):
    """A backbone of SHAPED's answer positions, whatever the canvas (temperature 0 unless
    given), and the model's entropy at each of them."""
    tok = char_tokenizer()
    vocab = tok.get_vocab()
    a, b, size = vocab["a"], vocab["b"], len(tok)
    first = 4 - 1 if cls is Dream else 4
    table = torch.zeros(12, size)
    for j, (pa, pb) in enumerate(SHAPED):
        probs = torch.full((size,), (1 - pa) / (size - 1), dtype=torch.float64)
        if pb is not None:
            probs[:] = 1e-30
            probs[b] = pb
        probs[a] = pa
        table[first + j] = probs.log().float()
    net = Positional(table)
    bb = cls(transformer=net, tokenizer=tok, **{"temperature": 0.0, **config})
    probs = torch.softmax(net.lm_head.weight.T.double(), dim=-1)[first : first + 6]
    return bb, torch.special.entr(probs).sum(-1)


def commits_by_step(bb, total, settings):
    """The answer positions (0-based) each step commits, stepping until nothing is masked."""
    canvas = bb.canvas(bb.tokenizer("1+1=")["input_ids"], 6)
    newly = []
    for t in range(total):
        batch = StepBatch([canvas], [4], [t], [9], total, settings=[settings])
        after = bb.denoise_step(batch)[0]
        newly.append(sorted(((after != canvas).nonzero().flatten() - 4).tolist()))
        canvas = after
        if not (canvas[4:] == bb.mask_id).any():
            break
    return newly


def test_llada_threshold_one_token_per_step_is_the_references_rule():
    """T = 6 over 6 positions: the quota is the most confident one, as the reference's
    "at least one"; beyond it every position at or above the threshold (the boundary
    included: the reference drops only those below)."""
    bb, exact = confident_backbone(LLaDA)
    tau = float(exact[2])  # exactly position 2's probability
    assert commits_by_step(bb, 6, {}) == [[0], [1], [2], [3], [4], [5]]
    assert commits_by_step(bb, 6, {"threshold": tau}) == [[0, 1, 2], [3], [4], [5]]
    assert commits_by_step(bb, 6, {"threshold": math.nextafter(tau, 1)}) == [
        [0, 1],
        [2],
        [3],
        [4],
        [5],
    ]


def test_llada_factor_rule_and_its_two_position_edge():
    """Factor 2: ranks 1..4 need 1/3, 1/2, 3/5, 2/3; 0.3 misses at rank 4 → the top four.
    Then two positions are left, and the reference commits both whatever they are. Factor 1:
    0.7 misses 4/5 at rank 3 → three; of 0.7, 0.3, 0.1, 0.3 misses 2/3 at rank 1 → one (the
    quota's); then the last two."""
    bb, _ = confident_backbone(LLaDA)
    assert commits_by_step(bb, 6, {"factor": 2.0}) == [[0, 1, 2, 3], [4, 5]]
    assert commits_by_step(bb, 6, {"factor": 1.0}) == [[0, 1, 2], [3], [4, 5]]


def test_dream_threshold_adds_to_a_quota_that_may_be_zero():
    """Dream's schedule at T = 6 over 6 positions commits none at step 0 (int(6 · 0.999)), so
    there a threshold row commits exactly the positions at or above it: no "at least one"."""
    assert quota(torch.tensor([6]), torch.tensor([0]), 6, 1e-3).item() == 0
    bb, exact = confident_backbone(Dream, alg="maskgit_plus", alg_temp=0.0)
    assert commits_by_step(bb, 6, {})[0] == []
    assert commits_by_step(bb, 6, {"threshold": float(exact[2])})[0] == [0, 1, 2]
    assert commits_by_step(bb, 6, {"threshold": 0.999})[0] == []
    assert commits_by_step(bb, 6, {"factor": 2.0})[0] == [0, 1, 2, 3]


# the entropies of the answer positions' distributions in `confident_backbone` (101 tokens):
# about 0.102, 0.429, 0.647, 1.992, 3.834 and 4.470 nats, rising as PROBABILITIES fall
def test_llada_entropy_bound_one_token_per_step_is_eb_samplers_rule():
    """T = 6 over 6 positions: the quota is the most confident one, EB-Sampler's first; beyond
    it the most confident while the entropies less the largest stay within the bound."""
    bb, _ = confident_backbone(LLaDA)
    h = [0.10205326443815778, 0.4287737457920917, 0.6471829460363352, 1.9924155043899612]
    assert commits_by_step(bb, 6, {"entropy_bound": 0.6}) == [[0, 1, 2], [3], [4], [5]]
    assert commits_by_step(bb, 6, {"entropy_bound": 2.0}) == [[0, 1, 2, 3], [4], [5]]
    assert commits_by_step(bb, 6, {"entropy_bound": 4.0}) == [[0, 1, 2, 3, 4], [5]]
    at = math.fsum(h[:3])  # exactly what four positions spend: they commit, five do not
    assert commits_by_step(bb, 6, {"entropy_bound": at * (1 + 1e-12)})[0] == [0, 1, 2, 3]
    assert commits_by_step(bb, 6, {"entropy_bound": at * (1 - 1e-9)})[0] == [0, 1, 2]


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_entropy_bound_commits_in_the_order_of_each_confidence(alg):
    """At step 0 Dream's quota is 0, so a row commits exactly EB-Sampler's set; each of the
    three confidences ranks the positions alike here."""
    bb, _ = confident_backbone(Dream, alg=alg, alg_temp=0.0)
    assert commits_by_step(bb, 6, {"entropy_bound": 0.6})[0] == [0, 1, 2]
    assert commits_by_step(bb, 6, {"entropy_bound": 2.0})[0] == [0, 1, 2, 3]


def eb_set(order: list[int], entropy: torch.Tensor, bound: float) -> list[int]:
    """EB-Sampler's set from positions in their commit order (its definition, by hand)."""
    k = reference_entropy_bound_count([float(entropy[j]) for j in order], bound)
    return sorted(order[:k])


def test_llada_entropy_bound_ranks_by_confidence_not_by_entropy_or_position():
    """Ranked by confidence the run at γ = 1.5 is two positions, {2, 3} (1.42 nats spent; a
    third would spend 2.09); by position it would be three, and by entropy {0, 1, 2}."""
    bb, entropy = shaped_backbone(LLaDA)
    assert eb_set([2, 3, 1, 0, 4, 5], entropy, 1.5) == [2, 3]
    assert eb_set(list(range(6)), entropy, 1.5) == [0, 1, 2]
    assert eb_set([1, 0, 2, 3, 4, 5], entropy, 1.5) == [0, 1, 2]
    assert commits_by_step(bb, 6, {"entropy_bound": 1.5})[0] == [2, 3]
    assert commits_by_step(bb, 6, {"entropy_bound": 1.0})[0] == [2]  # the quota's alone


@pytest.mark.parametrize("alg_temp", [0.0, 0.5])
@pytest.mark.parametrize("alg,run", [("maskgit_plus", [2, 3]), ("topk_margin", [2, 3]),
                                     ("entropy", [0, 1, 2])])  # fmt: skip
def test_dream_entropy_bound_ranks_by_its_algs_confidence(alg, run, alg_temp):
    """Step 0 (a quota of 0): the run alone, ranked by `alg`'s own confidence (the token's
    probability, the margin, the negative entropy), not by `alg_temp`'s drawn order."""
    bb, _ = shaped_backbone(Dream, alg=alg, alg_temp=alg_temp)
    assert commits_by_step(bb, 6, {"entropy_bound": 1.5})[0] == run


@pytest.mark.parametrize("config", [{"temperature": 0.5}, {"top_p": 0.9}, {"top_k": 3}], ids=str)
def test_the_entropy_is_the_models_before_temperature_and_filters(config):
    """What a position costs is the entropy of softmax(logits), whatever the sampler's
    temperature, top-p or top-k (with top_k=1 every filtered entropy would be 0)."""
    gen = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(9, 40, generator=gen)
    u = torch.rand(9, 1, generator=gen, dtype=torch.float64)
    expected = torch.special.entr(torch.softmax(logits.double(), -1)).sum(-1)
    c = Dream.Config(model="random", entropy_bound=1.0, **config)
    torch.testing.assert_close(dream_draw(logits, u, c)[2], expected, rtol=0, atol=1e-12)
    block = BlockDiffusion.Config(model="random", entropy_bound=1.0, **config)
    masked = logits.clone()
    masked[:, 7] = -torch.inf  # the block sampler never draws its mask token
    expected = torch.special.entr(torch.softmax(masked.double(), -1)).sum(-1)
    torch.testing.assert_close(
        block_draw(logits, u[:, 0], block, 7)[2], expected, rtol=0, atol=1e-12
    )


def test_llada_entropy_is_untempered():
    """At temperature 0.5 LLaDA draws from the tempered softmax, but a position costs the
    model's entropy: the run at γ = 0.6 is the one at temperature 0 (tempered entropies of
    about 0, 0, .001, .02, .44 would take five positions)."""
    bb, _ = confident_backbone(LLaDA, temperature=0.5)
    assert commits_by_step(bb, 6, {"entropy_bound": 0.6})[0] == [0, 1, 2]


def test_llada_end_tokens_cost_their_own_entropy_under_confidence_eos_eot_inf():
    """`confidence_eos_eot_inf` ranks EOS last (its confidence 0) but a position sure of EOS
    still costs its small entropy: the three EOS positions commit together, not one a step
    (EOS removed, the rest of each would cost about ln 100 nats)."""
    tok = char_tokenizer()
    size = len(tok)
    eos, a = tok.eos_token_id, tok.get_vocab()["a"]
    table = torch.zeros(12, size)
    for j, (token, p) in enumerate([(a, 0.99), (a, 0.95), (a, 0.92), *[(eos, 0.99)] * 3]):
        table[4 + j, token] = math.log(p * (size - 1) / (1 - p))
    bb = LLaDA(transformer=Positional(table), tokenizer=tok, temperature=0.0,
               confidence_eos_eot_inf=True)  # fmt: skip
    assert bb.end_ids[0] == eos
    assert commits_by_step(bb, 6, {"entropy_bound": 0.6}) == [[0, 1, 2], [3, 4, 5]]


def test_dream_entropy_bound_stays_in_the_current_block():
    """Blocks of 3 over T = 6: the run fills the first block at once and waits for its share
    of T; the second block fills at its first step."""
    bb, _ = confident_backbone(Dream, alg="maskgit_plus", alg_temp=0.0)
    settings = {"entropy_bound": 10.0, "block_length": 3}
    assert commits_by_step(bb, 6, settings) == [[0, 1, 2], [], [], [3, 4, 5]]


@torch.no_grad()
def reference_eb_generate(net, prompt, gen_length, block_length, bound, mask_id):
    """EB-Sampler (Ben-Hamu et al., arXiv 2505.24857, Algorithm 1) on LLaDA at temperature 0,
    block by block: each step runs the canvas, takes the argmax token at every masked position
    of the block, orders them by the probability of that token (the error proxy), and unmasks
    the largest prefix whose entropies sum, less their largest, to at most `bound`. Returns
    the canvas and the number of steps."""
    x = torch.cat([prompt, torch.full((gen_length,), mask_id)])
    start, steps = len(prompt), 0
    for lo in range(start, start + gen_length, block_length):
        hi = lo + block_length
        while (x[lo:hi] == mask_id).any():
            logits = reference_logits(net, x[None])[0].double()
            logits[:, mask_id] = -torch.inf  # suppress_mask
            probs = torch.softmax(logits, -1)
            x0 = logits.argmax(-1)
            masked = [j for j in range(lo, hi) if x[j] == mask_id]
            masked.sort(key=lambda j: -float(probs[j, x0[j]]))
            entropy = [float(torch.special.entr(probs[j]).sum()) for j in masked]
            k = reference_entropy_bound_count(entropy, bound)
            for j in masked[:k]:
                x[j] = x0[j]
            steps += 1
    return x, steps


@pytest.mark.parametrize("block_length", [16, 4])
@pytest.mark.parametrize("bound", [0.5, 1.0, 1.5, 3.0])
def test_llada_entropy_bound_is_eb_sampler_token_for_token(block_length, bound):
    """A random LLaDA in float32, its head sharpened so that positions' entropies differ (0 to
    about 2 nats), with T equal to the generated length (a quota of one, the most confident,
    per step): the canvas is the transcription's, filled in the steps its rule takes (as many
    forwards in one block; with blocks a block filled early waits for its share of T,
    `docs/backbones.md`)."""
    gen = 16
    bb = LLaDA(model="random", seed=5, temperature=0.0, suppress_mask=True)
    bb.transformer.lm_head.weight.data.mul_(40)
    prompt = torch.tensor(bb.encode(Prompt(text="12+30=")))
    settings = {"entropy_bound": bound, "block_length": block_length}
    canvas, steps = bb.canvas(prompt.tolist(), gen), 0
    for t in range(gen):
        batch = StepBatch([canvas], [len(prompt)], [t], [9], gen, settings=[settings])
        canvas = bb.denoise_step(batch)[0]
        steps += 1
        if not (canvas == bb.mask_id).any():
            break
    net, mask = bb.transformer, bb.mask_id
    expected, expected_steps = reference_eb_generate(net, prompt, gen, block_length, bound, mask)
    assert torch.equal(canvas, expected)
    if block_length == gen:
        assert steps == expected_steps
    # the run grows with γ: at 0.5 one position a step, at 3 the whole canvas in 4 forwards
    assert expected_steps == {0.5: 16, 1.0: 10, 1.5: 7 if block_length == gen else 9, 3.0: 4}[bound]


def test_llada_extra_commits_stay_in_the_current_block():
    bb, _ = confident_backbone(LLaDA)
    settings = {"threshold": 0.5, "block_length": 3}
    # T = 6 over two blocks of 3: the first block fills at step 0, then idles until step 3
    assert commits_by_step(bb, 6, settings) == [[0, 1, 2], [], [], [3], [4], [5]]


# -- (c) through the engine: rows end early, charged what they computed ----------------------
class EarlyRows:
    """n rows at the given sampler settings, each to its own end; the cost n·T is a cap."""

    prefix_field: ClassVar[str | None] = None
    scorers = ()
    config = None
    capped = True

    def __init__(self, n: int, settings: dict):
        self.n, self.settings = n, settings

    def cost(self, total_steps):
        return {"denoise": self.n * total_steps}

    def pool_size(self):
        return self.n

    def pool_scores(self):
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=self.n, settings=self.settings)
        return ops.pool(await ops.denoise(rows))


@pytest.mark.parametrize("settings", [{"threshold": 0.9}, {"entropy_bound": 0.5}], ids=str)
def test_tiny_rows_with_a_rule_end_early_and_the_ledger_charges_what_was_computed(
    settings, monkeypatch
):
    T, gen, n = 24, 32, 4  # the demo's protocol
    bb = Tiny()
    computed, works = [], []
    step, count = bb.denoise_step_with_confidence, bb.step_work

    def counted_step(batch):
        computed.append(len(batch.tokens))
        return step(batch)

    def counted_work(batch):
        works.extend(count(batch))
        return works[-len(batch.tokens) :]

    monkeypatch.setattr(bb, "denoise_step_with_confidence", counted_step)
    monkeypatch.setattr(bb, "step_work", counted_work)
    task = Arith(test_size=6)
    early = Method("early", MethodSpec("early"), EarlyRows(n, settings), first())
    engine = Engine(
        backbone=bb, scorers={}, task=task, methods=[early], sampling=Sampling(T, gen, "fewshot")
    )
    records = engine.run(task.problems("test"))
    rows = len(records) * n
    passes = sum(r["ledger"]["passes"]["denoise"] for r in records)
    assert passes == sum(computed) == len(works)
    assert sum(computed) / rows < T / 2  # far fewer steps than T on average (about 5 of 24)
    charged = sum(r["ledger"]["flops"]["denoise"] for r in records)
    assert charged == sum(flops(model_shape(bb), w) for w in works)
    assert all(c["text"] and "<|mask|>" not in c["text"] for r in records for c in r["candidates"])


def first():
    return registry().selector("first")


# -- (d) what a step computes -----------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,config", [(Dream, {}), (LLaDA, {}), (LLaDA, {"cfg_scale": 1.0})], ids=str
)
def test_step_work_counts_the_rows_own_tokens_and_the_heads_positions(cls, config, monkeypatch):
    """Row 0: 3 prompt tokens and 6 generated, 2 of them committed (one block): 9 queries,
    81 attended, the head at the 4 masked. Row 1: 5 prompt tokens, 6 masked, its own blocks
    of 3 at step 0: 11 queries, 121 attended, the head at the first block's 3."""
    bb = cls(model="random", **config)
    first_row = bb.canvas([20, 21, 22], 6)
    first_row[4], first_row[7] = 30, 31
    batch = StepBatch(
        [first_row, bb.canvas([20, 21, 22, 23, 24], 6)],
        [3, 5],
        [2, 0],
        [1, 2],
        6,
        settings=[{}, {"block_length": 3}],
    )
    assert bb.step_work(batch) == [Work(9, 81, 4), Work(11, 121, 3)]
    heads = []
    head = bb.head
    monkeypatch.setattr(bb, "head", lambda hidden: heads.append(hidden.shape[0]) or head(hidden))
    bb.denoise_step(batch)
    assert sum(heads) == passes_per_step(bb) * (4 + 3)  # the head ran where step_work says


def test_step_work_of_a_finished_row_reads_no_head():
    bb = Dream(model="random")
    done = bb.canvas([20, 21], 4)
    done[2:] = 7
    batch = StepBatch([done], [2], [3], [0], 4)
    assert bb.step_work(batch) == [Work(6, 36, 0)]


def test_packed_attention_counts_the_same_work():
    padded, packed = (Dream(model="random", attention=a) for a in ("sdpa", "packed"))
    rows = [padded.canvas([20] * n, 5) for n in (2, 7)]
    batch = StepBatch(rows, [2, 7], [0, 0], [0, 1], 5)
    assert padded.step_work(batch) == packed.step_work(batch) == [Work(7, 49, 5), Work(12, 144, 5)]


FLOOR_RULES = [
    (Dream, "float32", [{}, {"threshold": 1.0}, {"threshold": 0.05}, {"threshold": 0.01}]),
    *(
        (cls, "bfloat16", [{}, *({"entropy_bound": b} for b in (1.0, 10.0, 40.0))])
        for cls in (Dream, LLaDA)
    ),
]


@pytest.mark.parametrize("cls,dtype,settings", FLOOR_RULES, ids=str)
def test_looser_rules_commit_more_on_the_same_floor(cls, dtype, settings):
    """From one state and key, a row under any rule commits what the plain row commits, with
    the same tokens, and more the lower the threshold or the larger the entropy bound (in
    bf16 too, as on a GPU)."""
    bb = cls(model="random", temperature=1.0, dtype=dtype)
    prompt = bb.encode(Prompt(text="3+4="))
    canvas = bb.canvas(prompt, 10)
    n = len(settings)
    for t in range(3):
        batch = StepBatch([canvas] * n, [len(prompt)] * n, [t] * n, [4] * n, 5, settings=settings)
        rows = bb.denoise_step(batch)
        committed = [row != bb.mask_id for row in rows]
        for before, after in itertools.pairwise(committed):
            assert (before <= after).all()
        assert committed[-1].sum() > committed[0].sum()
        assert torch.equal(rows[-1][committed[0]], rows[0][committed[0]])


def test_a_rows_own_rule_replaces_the_runs():
    """A run-wide rule (`--backbone tiny:entropy_bound=0.5`) and a method whose rows set
    another (the Threshold family's τ = 0.9): the row's own rule is the one it decodes by."""
    bb = Dream(model="random", entropy_bound=0.5)
    c = bb.row_config({"threshold": 0.9})
    assert (c.threshold, c.factor, c.entropy_bound) == (0.9, None, None)
    assert bb.row_config({"temperature": 0.7}).entropy_bound == 0.5  # no rule of its own
    assert LLaDA(model="random", factor=1.0).row_config({"entropy_bound": 0.2}).factor is None
    with pytest.raises(UserError, match="got threshold and entropy_bound"):
        bb.row_config({"threshold": 0.9, "entropy_bound": 0.1})
