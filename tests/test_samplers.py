"""The samplers' numerics and noise: float64 draws in bf16, per-purpose noise, keyed ties,
LLaDA's pure-diffusion options, determinism, and a Base-style LLaDA checkpoint."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from test_backbones import save_llada, trajectory

from dllmbench.api.interfaces import StepBatch
from dllmbench.core.keys import row_key, torch_generator
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones import dream as dream_module
from dllmbench.plugins.backbones.base import (
    PURPOSES,
    DiffusionBackbone,
    purpose_generator,
    top_ranked,
)
from dllmbench.plugins.backbones.dream import Dream, DreamConfig, sample_tokens
from dllmbench.plugins.backbones.llada import LLaDA, LLaDAConfig, gumbel_max, low_confidence
from dllmbench.plugins.backbones.loading import char_tokenizer, random_model
from dllmbench.plugins.backbones.tiny import TinyConfig

DREAM_VOCAB = 152_064


class Positional(torch.nn.Module):
    """A transformer whose logits at (re-based) position j are row j of `table` [P, V]."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.lm_head = torch.nn.Linear(table.shape[0], table.shape[1], bias=False)
        self.lm_head.weight.data = table.T.contiguous().float()

    def model(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        positions = position_ids if position_ids is not None else torch.arange(input_ids.shape[1])
        positions = positions.expand(input_ids.shape)
        hidden = torch.nn.functional.one_hot(positions, self.lm_head.in_features).float()
        return type("Out", (), {"last_hidden_state": hidden})()


def keyed_uniforms(keys: int, width: int, purpose: str = "token") -> torch.Tensor:
    """[keys, width] uniforms as the samplers draw them: row i is key i's noise at step 0."""
    row = torch.zeros(width, dtype=torch.long)
    batch = StepBatch([row] * keys, [0] * keys, [0] * keys, list(range(keys)), 1)
    return DiffusionBackbone.noise(batch, [0] * keys, width, purpose)


# -- 1. Dream's token draw in float64 -----------------------------------------------------------
def zipf_like_logits() -> torch.Tensor:
    """[1, 152064] bf16 logits: a few hundred likely tokens at random places, a long tail."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(DREAM_VOCAB, generator=gen)
    head = torch.randperm(DREAM_VOCAB, generator=gen)[:300]
    logits[head] = 9 + 1.5 * torch.randn(300, generator=gen)
    return logits.to(torch.bfloat16)[None]


def binned(mass: torch.Tensor, order: torch.Tensor, head: int = 400, tail_bins: int = 64):
    """`mass` [V] on a partition: the `head` likeliest tokens one by one, the rest in bins."""
    bins = torch.empty(mass.shape[0], dtype=torch.long)
    bins[order[:head]] = torch.arange(head)
    rest = order[head:].sort().values
    bins[rest] = head + torch.arange(rest.shape[0]) * tail_bins // rest.shape[0]
    return torch.zeros(head + tail_bins, dtype=torch.float64).index_add_(0, bins, mass.double())


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_dream_draw_in_bf16_follows_the_float64_softmax_at_full_vocabulary(temperature):
    logits = zipf_like_logits()
    exact = torch.softmax(logits.double() / temperature, dim=-1)[0]
    order = exact.argsort(descending=True)
    draws = 4 * 10**6  # 4000 keys × 1000 masked positions, each with its own keyed uniform
    u = keyed_uniforms(4000, 1000).reshape(1, draws)
    config = DreamConfig(temperature=temperature, alg="maskgit_plus")
    x0, confidence = sample_tokens(logits, u, config)
    freq = torch.bincount(x0[0], minlength=DREAM_VOCAB).double() / draws
    tv = 0.5 * (binned(freq, order) - binned(exact, order)).abs().sum().item()
    assert tv < 0.01, tv
    assert confidence.dtype == torch.float64
    torch.testing.assert_close(confidence[0], exact[x0[0]], rtol=1e-12, atol=0)
    # the old draw, an inverse CDF over a bf16 cumsum of bf16 probabilities, fails this test
    cdf = torch.softmax(logits / temperature, dim=-1)[0].cumsum(-1).double()
    old = torch.diff(cdf, prepend=cdf.new_zeros(1)).clamp(min=0) / cdf[-1]
    old_tv = 0.5 * (binned(old, order) - binned(exact, order)).abs().sum().item()
    assert old_tv > 0.03, old_tv


def test_dream_draw_never_takes_a_filtered_token():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 500, generator=gen).to(torch.bfloat16)
    u = torch.rand(3, 4000, generator=gen, dtype=torch.float64)
    u[:, 0], u[:, 1] = 0.0, 1 - 2**-53  # the ends of [0, 1)
    x0, _ = sample_tokens(logits, u, DreamConfig(temperature=1.0, top_k=3))
    top3 = logits.topk(3, dim=-1).indices
    assert all(set(x0[i].tolist()) == set(top3[i].tolist()) for i in range(3))
    x0, _ = sample_tokens(logits, u, DreamConfig(temperature=1.0, top_p=0.05))
    probs = torch.softmax(logits.double(), -1)
    for i in range(3):
        kept = probs[i].argsort(descending=True)
        nucleus = kept[: int((probs[i][kept].cumsum(0) <= 0.05).sum()) + 1]
        assert set(x0[i].tolist()) <= set(nucleus.tolist())


@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_dream_confidences_are_the_references_in_float64(alg, temperature):
    gen = torch.Generator().manual_seed(2)
    logits = (3 * torch.randn(5, 50, generator=gen)).to(torch.bfloat16)
    u = torch.rand(5, 1, generator=gen, dtype=torch.float64)
    x0, confidence = sample_tokens(logits, u, DreamConfig(temperature=temperature, alg=alg))
    scaled = logits.double() / (temperature or 1.0)
    probs = torch.softmax(scaled, -1)
    if temperature == 0:
        assert torch.equal(x0[:, 0], logits.argmax(-1))
    top2 = probs.topk(2, -1).values
    expected = {
        "origin": probs.gather(-1, x0)[:, 0],
        "maskgit_plus": probs.gather(-1, x0)[:, 0],
        "topk_margin": top2[:, 0] - top2[:, 1],
        "entropy": (probs * torch.log(probs + 1e-10)).sum(-1),
    }[alg]
    assert confidence.dtype == torch.float64
    torch.testing.assert_close(confidence[:, 0], expected, rtol=1e-12, atol=1e-15)


def test_dream_head_in_chunks_gives_the_same_steps(monkeypatch):
    bb = Dream(model="random", dtype="bfloat16")
    whole, _ = trajectory(bb, 12, 4)
    monkeypatch.setattr(dream_module, "CHUNK_ELEMENTS", 3 * len(bb.tokenizer))  # 3 positions
    chunked, _ = trajectory(bb, 12, 4)
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked, strict=True))


# -- 12. LLaDA's low_confidence in float64 --------------------------------------------------------
def test_llada_low_confidence_is_a_float64_softmax_in_bf16():
    logits = torch.zeros(2, 126_464, dtype=torch.bfloat16)
    logits[1, 5] = -(2**-8)  # the second row's x0 is a hair likelier than the first's
    x0 = logits.argmax(-1)
    got = low_confidence(logits, x0, [])
    assert got.dtype == torch.float64
    assert torch.equal(got, torch.softmax(logits.double(), -1).gather(-1, x0[:, None])[:, 0])
    assert got[1] > got[0]
    as_float32 = torch.softmax(logits.float(), -1).gather(-1, x0[:, None])[:, 0]
    assert as_float32[0] == as_float32[1]  # the old float32 softmax could not tell them apart


# -- 4. LLaDA Instruct's pure-diffusion options --------------------------------------------------
def eos_canvas_model():
    """A LLaDA over a tokenizer with EOS and EoT, whose answer positions prefer EOS (two of
    them, the most confident), EoT (one), or 'a' (three, less confident)."""
    tok = char_tokenizer(("<|eot_id|>",))
    vocab = tok.get_vocab()
    eos, eot, a, b = tok.eos_token_id, vocab["<|eot_id|>"], vocab["a"], vocab["b"]
    table = torch.zeros(10, len(tok))
    for pos, (token, logit) in enumerate([(eos, 9.0), (eos, 8.0), (eot, 7.0)], start=4):
        table[pos, token] = logit
        table[pos, b] = logit - 2  # the runner-up when EOS is barred
    for pos, logit in zip((7, 8, 9), (4.0, 3.5, 3.0), strict=True):
        table[pos, a] = logit
    return Positional(table), tok, (eos, eot, a, b)


def llada_steps(**config):
    net, tok, ids = eos_canvas_model()
    bb = LLaDA(transformer=net, tokenizer=tok, temperature=0.0, **config)
    prompt = tok("1+1=")["input_ids"]
    canvas = bb.canvas(prompt, 6)
    states = [canvas]
    for t in range(3):
        states.append(bb.denoise_step(StepBatch([states[-1]], [4], [t], [5], 3))[0])
    newly = [
        sorted((after != before).nonzero().flatten().tolist())
        for before, after in itertools.pairwise(states)
    ]
    return states[-1], newly, ids


def test_llada_confidence_eos_eot_inf_commits_eos_and_eot_last():
    _, newly, _ = llada_steps()
    assert newly == [[4, 5], [6, 7], [8, 9]]  # by confidence: EOS, EOS, EoT first
    final, newly, (eos, eot, a, _) = llada_steps(confidence_eos_eot_inf=True)
    # EOS and EoT have confidence 0: the 'a' positions go first, the three ties last
    assert newly[0] == [7, 8] and 9 in newly[1]
    assert sorted(newly[1] + newly[2]) == [4, 5, 6, 9]
    assert final[4:].tolist() == [eos, eos, eot, a, a, a]  # but they are still drawn


def test_llada_confidence_eos_eot_inf_renormalises_over_the_other_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 1.0]])
    x0 = logits.argmax(-1)  # EOS (0) in the first row, token 1 in the second
    got = low_confidence(logits, x0, [0, 3])
    rest = torch.softmax(logits.double()[:, 1:3], -1)
    assert got[0] == 0 and torch.isclose(got[1], rest[1, 0], rtol=1e-15)


def test_llada_logits_eos_inf_never_draws_eos():
    final, _, (eos, eot, a, b) = llada_steps()
    assert (final == eos).sum() == 2
    final, _, _ = llada_steps(logits_eos_inf=True)
    assert final[4:].tolist() == [b, b, eot, a, a, a]  # EOS barred, EoT untouched


def test_llada_base_checkpoint_loads_raw_through_the_same_path(tmp_path):
    """LLaDA-8B-Base: no chat template, and the mask only an additional special token."""
    tok = char_tokenizer(("<|mdm_mask|>", "<|eot_id|>"))
    src = LLaDA(transformer=random_model("llada", tok, 4, torch.float32), tokenizer=tok)
    save_llada(src, tmp_path, with_mask=False)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("mask_token", None)
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    for file in tmp_path.glob("chat_template.*"):
        file.unlink()
    special = tmp_path / "special_tokens_map.json"
    if special.exists():
        special.write_text(json.dumps({**json.loads(special.read_text()), "mask_token": None}))
    base = LLaDA(model=str(tmp_path))
    assert base.chat is False
    assert base.mask_id == base.tokenizer.convert_tokens_to_ids("<|mdm_mask|>")
    shots = Prompt(messages=({"role": "user", "content": "Q: 1+1\nA: 2"},))
    assert base.encode(shots) == base.tokenizer("Q: 1+1\nA: 2")["input_ids"]
    states, _ = trajectory(base, 8, 4)
    assert not (states[-1] == base.mask_id).all()


# -- 2. defaults and determinism ------------------------------------------------------------------
def test_llada_defaults_to_the_papers_temperature():
    assert LLaDAConfig().temperature == 0.5


def test_a_default_llada_run_gives_different_candidates_to_different_copies():
    from dllmbench.execution.engine import Engine, Sampling
    from dllmbench.execution.method import Method, MethodSpec
    from dllmbench.loading.registry import registry
    from dllmbench.testing.doubles import ToySum

    task = ToySum(size=2)
    method = Method.build(registry(), MethodSpec.parse("independent:n=4+first"))
    engine = Engine(
        backbone=LLaDA(model="random"),
        scorers={},
        task=task,
        methods=[method],
        sampling=Sampling(4, 8, "fewshot", 0),
    )
    for record in engine.run(task.problems("test")):
        texts = [c["text"] for c in record["candidates"]]
        assert len(set(texts)) == 4, texts


@pytest.mark.parametrize(
    "cls,config,deterministic",
    [
        (Dream, {}, False),
        (Dream, {"temperature": 0.0, "alg": "entropy", "alg_temp": 0.0}, True),
        (Dream, {"temperature": 0.0, "alg": "topk_margin", "alg_temp": None}, True),
        (Dream, {"temperature": 0.0, "alg": "origin", "alg_temp": None}, False),
        (Dream, {"temperature": 0.0, "alg": "maskgit_plus", "alg_temp": 0.5}, False),
        (LLaDA, {}, False),
        (LLaDA, {"temperature": 0.0}, True),
        (LLaDA, {"temperature": 0.0, "remasking": "random"}, False),
    ],
)
def test_deterministic_says_whether_keys_can_change_the_sample(cls, config, deterministic):
    bb = cls(model="random", **config)
    assert bb.config.deterministic is deterministic
    finals = {tuple(trajectory(bb, 8, 4, key=key)[0][-1].tolist()) for key in range(6)}
    assert (len(finals) == 1) is deterministic


def test_the_demo_backbone_is_not_deterministic():
    assert TinyConfig().deterministic is False


# -- 6. noise per purpose -------------------------------------------------------------------------
def test_each_purpose_draws_its_own_uniforms():
    key = row_key(0, "p", "sample", (3,))
    draws = {
        p: torch.rand(64, generator=purpose_generator(key, 2, p), dtype=torch.float64)
        for p in PURPOSES
    }
    draws["unsalted"] = torch.rand(64, generator=torch_generator(key, 2), dtype=torch.float64)
    for a, b in itertools.combinations(draws, 2):
        assert not torch.equal(draws[a], draws[b]), (a, b)
    with pytest.raises(ValueError, match="unknown noise purpose"):
        purpose_generator(key, 2, "tokens")


def test_llada_random_remasking_does_not_reuse_the_gumbel_uniforms():
    bb = LLaDA(model="random", temperature=0.7, remasking="random")
    key, gen_length = 11, 6
    prompt = bb.encode(Prompt(text="3+4="))
    canvas, plen = bb.canvas(prompt, gen_length), len(prompt)
    batch = StepBatch([canvas], [plen], [0], [key], 3)
    after = bb.denoise_step(batch)[0]
    # the tokens: Gumbel-max with the "token" stream; the positions: the "order" stream
    logits = bb.logits(canvas[None], torch.ones(1, len(canvas), dtype=torch.long))[0, plen:]
    tokens = gumbel_max(logits, 0.7, purpose_generator(key, 0, "token"))
    order = bb.noise(batch, [0], len(canvas), "order")[0, plen:]
    chosen = order.argsort(descending=True)[:2] + plen
    assert sorted((after != canvas).nonzero().flatten().tolist()) == sorted(chosen.tolist())
    assert torch.equal(after[chosen], tokens[chosen - plen])
    first_gumbel = torch.rand(
        (gen_length, logits.shape[-1]),
        generator=purpose_generator(key, 0, "token"),
        dtype=torch.float64,
    )[0, : len(canvas)]
    full_order = bb.noise(batch, [0], len(canvas), "order")[0]
    assert not torch.equal(full_order, first_gumbel)  # the issue: these used to be equal


# -- 10. ties broken by a keyed uniform -----------------------------------------------------------
def flat_backbone(cls):
    """Every answer position has the same logits: every confidence ties."""
    tok = char_tokenizer()
    table = torch.zeros(24, len(tok))
    table[:, tok.get_vocab()["7"]] = 4.0
    config = {"temperature": 0.0}
    if cls is Dream:
        config.update(alg="maskgit_plus", alg_temp=0.0)
    return cls(transformer=Positional(table), tokenizer=tok, **config)


def first_commits(bb, key, others=()):
    """The positions (from the answer start) a row with `key` commits at step 0 of 4, alone
    or batched after rows `others` (prompt, key) of other lengths."""
    rows = [(p, k) for p, k in others] + [("12+30=", key)]
    ids = [bb.encode(Prompt(text=p)) for p, _ in rows]
    batch = StepBatch(
        [bb.canvas(i, 8) for i in ids],
        [len(i) for i in ids],
        [0] * len(rows),
        [k for _, k in rows],
        4,
    )
    before, after = batch.tokens[-1], bb.denoise_step(batch)[-1]
    return tuple(((after != before).nonzero().flatten() - len(ids[-1])).tolist())


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_equal_confidences_are_broken_by_the_key_not_by_position(cls):
    bb = flat_backbone(cls)
    sets = [first_commits(bb, key) for key in range(12)]
    assert len(set(sets)) >= 4  # the committed set varies with the key ...
    quota = len(sets[0])  # Dream commits 1 at step 0 of 4, LLaDA 2
    assert quota == (1 if cls is Dream else 2) and all(len(s) == quota for s in sets)
    leftmost = tuple(range(quota))
    assert sets.count(leftmost) < 12  # ... and does not always go to the leftmost positions
    for key in (0, 5):
        assert first_commits(bb, key) == sets[key]  # reproducible for a key
        mixed = first_commits(bb, key, others=[("1+1=", 99), ("123+4567=", 7)])
        assert mixed == sets[key]  # independent of the batch


def test_without_ties_the_top_ranked_are_the_highest_scores():
    gen = torch.Generator().manual_seed(3)
    score = torch.rand(5, 30, generator=gen, dtype=torch.float64)
    score[:, 20:] = -torch.inf
    k = torch.tensor([0, 1, 4, 20, 7])
    for _ in range(3):
        ties = torch.rand(5, 30, generator=gen, dtype=torch.float64)
        chosen = top_ranked(score, k, ties)
        for row in range(5):
            expected = set(score[row].topk(int(k[row])).indices.tolist())
            assert set(chosen[row].nonzero().flatten().tolist()) == expected
