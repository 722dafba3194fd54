"""Rows with their own sampler settings and T, canvas edits, and the published methods built
on them (HEX, ReMDM, Prism-style search, sampler ensembles): hand-worked cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dllmbench.api.interfaces import StepBatch, commit_orders
from dllmbench.api.ops import DenoiseRequest, Ops
from dllmbench.core.errors import UserError
from dllmbench.core.flops import Work
from dllmbench.core.keys import row_key
from dllmbench.core.types import Problem, Prompt, Rows
from dllmbench.plugins.backbones.base import block_step
from dllmbench.plugins.backbones.block import REMASKINGS, BlockDiffusion
from dllmbench.plugins.backbones.dream import RANKED_ALGS, Dream
from dllmbench.plugins.backbones.fast_dllm_v2 import FastDLLMv2
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.strategies.ensemble import Ensemble
from dllmbench.plugins.strategies.hex import paper_blocks
from dllmbench.plugins.strategies.prism import Prism, PrismConfig, shares, widths
from dllmbench.plugins.strategies.remdm import ReMDMConfig, sigmas
from dllmbench.testing import run_strategy


# -- samplers: a row's own settings in a shared forward --------------------------------------
def _steps(bb, rows, T, settings, plens):
    """Every row from its masked canvas to T, all in one batch per step."""
    keys = [row_key(0, "p", "sample", (i,)) for i in range(len(rows))]
    for t in range(T):
        batch = StepBatch(rows, plens, [t] * len(rows), keys, T, settings=settings)
        rows = bb.denoise_step(batch)
    return rows


@pytest.mark.parametrize(
    "cls,varied",
    [
        (Dream, {"temperature": 0.9, "alg": "entropy", "alg_temp": 0.0, "block_length": 3}),
        (Dream, {"alg": "origin", "top_p": 0.8, "block_length": 2}),
        (LLaDA, {"temperature": 0.8, "remasking": "random", "block_length": 3}),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_rows_own_settings_in_a_mixed_batch_give_what_that_sampler_gives_alone(
    cls, varied, dtype
):
    """Rows with different settings share each forward, and each row's tokens are those of a
    backbone configured with its settings, stepping it alone (in the dtype users run too)."""
    T, gen = 6, 6
    shared = cls(model="random", dtype=dtype)
    alone = cls(model="random", dtype=dtype, **varied)
    prompt = shared.encode(Prompt(text="12+3="))
    canvas = shared.canvas(prompt, gen)
    mixed = _steps(shared, [canvas] * 4, T, [{}, varied, {}, varied], [len(prompt)] * 4)
    for i in (1, 3):
        own = _steps(alone, [canvas] * 4, T, [{}] * 4, [len(prompt)] * 4)[i]
        assert torch.equal(mixed[i], own)
    plain = _steps(cls(model="random", dtype=dtype), [canvas] * 4, T, [{}] * 4, [len(prompt)] * 4)
    assert torch.equal(mixed[0], plain[0]) and torch.equal(mixed[2], plain[2])
    assert not any(torch.equal(mixed[i], plain[i]) for i in (1, 3))


def test_a_row_cannot_set_what_its_backbone_does_not_vary():
    bb = Dream(model="random")
    with pytest.raises(UserError, match="cfg_scale"):
        bb.check_row_settings({"cfg_scale": 1.0}, 6, 6)
    with pytest.raises(UserError, match="alg must be one of"):
        bb.check_row_settings({"alg": "banana"}, 6, 6)


@pytest.mark.parametrize("name", ["tiny", "tiny-block"])
def test_a_row_setting_refused_names_the_backbone_the_run_was_given(name):
    # tiny is a dream and tiny-block a block model: the user typed --backbone tiny
    from dllmbench.loading.registry import registry

    bb = registry().build("backbone", name, model="random")
    with pytest.raises(UserError, match=rf"^{name}: a row's sampler settings"):
        bb.check_row_settings({"temperature": -1.0}, 6, 6)
    with pytest.raises(UserError, match=rf"^{name}: a row cannot set 'cfg_scale'"):
        bb.check_row_settings({"cfg_scale": 1.0}, 6, 6)


def test_block_step_is_the_references_schedule_when_blocks_divide():
    # gen 8, blocks of 4, T 4: two blocks of two steps
    assert [(s.end, s.j, s.per, s.even) for s in (block_step(8, 4, 4, t) for t in range(4))] == [
        (4, 0, 2, True),
        (4, 1, 2, True),
        (8, 0, 2, True),
        (8, 1, 2, True),
    ]
    # gen 5, blocks of 2 (2, 2, 1), T 4: block b starts at ⌈4b/3⌉ = 0, 2, 3
    assert [(s.end, s.per) for s in (block_step(5, 2, 4, t) for t in range(4))] == [
        (2, 2),
        (2, 2),
        (4, 1),
        (5, 1),
    ]
    # more blocks than steps: the last step opens every block left
    assert block_step(8, 1, 3, 2).end == 8


def test_llada_rows_with_their_own_blocks_end_fully_decoded():
    bb = LLaDA(model="random", temperature=0.7)
    prompt = bb.encode(Prompt(text="1+1="))
    canvas = bb.canvas(prompt, 7)
    out = _steps(
        bb, [canvas] * 3, 5, [{"block_length": 3}, {"block_length": 7}, {}], [len(prompt)] * 3
    )
    assert all(int((row[len(prompt) :] == bb.mask_id).sum()) == 0 for row in out[:2])


# -- ops: settings, T, edits, concatenation, ownership ---------------------------------------
PROBLEM = Problem("p0", "3+4=", 7)


def _ops(row_settings=frozenset({"temperature"}), confidences=True):
    canvas = torch.tensor([5, 6, 7] + [99] * 6)
    return Ops(
        problem=PROBLEM,
        seed=0,
        total_steps=4,
        canvas=canvas,
        prompt_len=3,
        scorers={"prm": True},
        owners=lambda n: [("m",)] * n,
        row_settings=row_settings,
        confidences=confidences,
    )


def _posted(awaitable) -> DenoiseRequest:
    request = awaitable.send(None)
    awaitable.close()
    return request


def test_rows_carry_their_own_settings_and_t_and_are_charged_their_own_steps():
    ops = _ops()
    rows = ops.start(PROBLEM, 3, settings=[{"steps": 2}, {"temperature": 0.3}, {"steps": 6}])
    assert rows.totals == (2, 4, 6)
    assert rows.setting(1) == {"temperature": 0.3} and rows.setting(0) == {}
    request = _posted(ops.denoise(rows))
    assert request.steps == (2, 4, 6)
    # the engine charges each step a row takes as it computes it (2 + 4 + 6 passes below)
    with pytest.raises(ValueError, match="past T"):
        _posted(ops.denoise(rows, steps=3))
    with pytest.raises(UserError, match="cannot vary"):
        ops.start(PROBLEM, 1, settings={"block_length": 2})


def test_a_setting_held_in_a_numpy_scalar_is_stored_as_the_python_number():
    """A strategy may compute its settings with numpy; the rows hold plain Python numbers,
    which the engine reads without running code of the value's own."""
    rows = _ops().start(PROBLEM, 2, settings=[{"temperature": t} for t in np.linspace(0.5, 1, 2)])
    assert [rows.setting(i) for i in range(2)] == [{"temperature": 0.5}, {"temperature": 1.0}]
    assert all(type(value) is float for row in rows.settings for _, value in row)
    assert (
        type(_ops().start(PROBLEM, 1, settings={"temperature": np.int64(1)}).settings[0][0][1])
        is int
    )


def test_denoising_rows_to_their_t_when_all_stand_there_posts_nothing():
    # rows a sampler ended early all stand at their T: `denoise(rows)` (each to its own T)
    # takes no step and charges nothing, as `denoise(rows, steps)` does for such rows
    ops = _ops()
    rows = ops.start(PROBLEM, 2)
    decoded = rows.tokens.clone()
    decoded[:, rows.prompt_len :] = 1
    final = ops._issue(rows.advanced(decoded, (4, 4)))
    finishing = ops.denoise(final)
    with pytest.raises(StopIteration) as done:
        finishing.send(None)
    assert done.value.value is final


def test_a_setting_no_backbone_varies_is_refused_without_naming_one_that_would():
    # 'foo' is no backbone's setting: the line points at sets_per_row, not at dream or llada
    with pytest.raises(UserError) as refused:
        _ops().start(PROBLEM, 1, settings={"foo": 1})
    line = str(refused.value)
    assert "'foo'" in line and "sets_per_row()" in line and "dream" not in line


def test_remask_is_a_free_recorded_edit_by_each_policy():
    ops = _ops()
    rows = ops.start(PROBLEM, 2, confidence=True)
    decoded = rows.tokens.clone()
    decoded[:, 3:] = torch.tensor([1, 2, 3, 4, 5, 6])
    confidence = torch.full(decoded.shape, float("nan"))
    confidence[:, 3:] = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.7, 0.3])
    rows = ops._issue(rows.advanced(decoded, (1, 1), confidence))  # as a denoise gives it

    edited = ops.remask(rows, positions=[[0, 5], [2]])
    assert edited.edits == (((1, (0, 5)),), ((1, (2,)),))
    assert edited.tokens[0, 3].item() == 99 and edited.tokens[0, 8].item() == 99
    assert torch.isnan(edited.confidence[0, 3]) and not torch.isnan(edited.confidence[0, 4])

    least = ops.remask(rows, least_confident=2)
    assert least.edits[0] == ((1, (1, 3)),)  # confidences 0.1 and 0.2

    among = ops.remask(rows, least_confident=1, among=3)
    assert among.edits[0][0][1][0] in (1, 3, 5)

    everything = ops.remask(rows, sigma=1.0)
    assert everything.edits[0] == ((1, (0, 1, 2, 3, 4, 5)),)
    again = ops.remask(rows, sigma=0.5, label="x")
    assert again.edits == ops.remask(rows, sigma=0.5, label="x").edits  # keyed, repeatable
    # edits post no request: nothing is computed, so nothing is charged

    with pytest.raises(ValueError, match="one of"):
        ops.remask(rows, sigma=0.5, positions=[0])
    # a row at its T is final: naming its positions is an error, a policy leaves it alone
    finished = ops._issue(rows.advanced(decoded, (4, 1), confidence))
    with pytest.raises(ValueError, match="at its T"):
        ops.remask(finished, positions=[0])
    with pytest.raises(ValueError, match="row 0 is at its T"):
        ops.remask(finished, positions=[[0], [2]])
    # positions per row: a final row given none is left alone, the others are edited
    mixed = ops.remask(finished, positions=[[], [2]])
    assert mixed.edits == ((), ((1, (2,)),))
    assert torch.equal(mixed.tokens[0], finished.tokens[0])
    with pytest.raises(ValueError, match="3 lists for 2 rows"):
        ops.remask(rows, positions=[[0], [1], [2]])
    kept = ops.remask(finished, sigma=1.0)
    assert kept.edits == ((), ((1, (0, 1, 2, 3, 4, 5)),))
    assert torch.equal(kept.tokens[0], finished.tokens[0])
    assert ops.remask(finished, least_confident=2).edits == ((), ((1, (1, 3)),))
    plain = ops.start(PROBLEM, 2)
    with pytest.raises(ValueError, match="confidence=True"):
        ops.remask(plain.advanced(decoded, (1, 1)), least_confident=1)
    with pytest.raises(UserError, match="does not report"):
        _ops(confidences=False).start(PROBLEM, 1, confidence=True)


def test_rows_concatenate_within_one_problem_and_stream_only():
    ops = _ops()
    rows = ops.start(PROBLEM, 2)
    joined = Rows.concat(rows.take(0).repeat(2), rows.take(1))
    assert joined.lineage == ((0, 0), (0, 1), (1,))
    assert joined.totals == (4, 4, 4)
    with pytest.raises(ValueError, match="one lineage"):
        Rows.concat(rows, rows)
    other = _ops().start(PROBLEM, 1, stream="other")
    with pytest.raises(ValueError, match="one problem, seed, stream"):
        Rows.concat(rows, other)


def test_ops_refuses_rows_it_did_not_start():
    ops = _ops()
    rows = ops.start(PROBLEM, 1)
    stranger = Ops(
        problem=Problem("p1", "1+1=", 2),
        seed=0,
        total_steps=4,
        canvas=torch.tensor([5, 6, 7] + [99] * 6),
        prompt_len=3,
        scorers={},
        owners=lambda n: [("m",)] * n,
    )
    with pytest.raises(ValueError, match="rows of problem 'p0'"):
        stranger.pool(rows.advanced(rows.tokens, (4,)))
    with pytest.raises(ValueError, match=r"given problem 'p0'"):
        stranger.start(PROBLEM, 1)


# -- the methods, by hand --------------------------------------------------------------------
def test_hex_takes_the_papers_block_lengths_and_cycles_them():
    assert paper_blocks(256) == (8, 16, 32, 64, 128)
    assert paper_blocks(512) == (16, 32, 64, 128, 256)
    assert paper_blocks(48) == (1, 3, 6, 12, 24)
    records = run_strategy("hex:n=5,blocks=1/2/5+majority", steps=12)
    assert all(r["ledger"]["passes"] == {"denoise": 60} for r in records)


def test_remdm_sigmas_follow_the_cap_and_loop_schedules():
    # T = 4, η = 0.3: σ_1 = min(.3, (1 − α_s)/α_t) = min(.3, .5/.25), σ_2 = min(.3, .25/.5)
    assert sigmas(ReMDMConfig(eta=0.3), 4) == [0.0, 0.3, 0.3, 0.0]
    assert sigmas(ReMDMConfig(eta=0.9), 4) == [0.0, 0.9, 0.5, 0.0]
    # loop: σ = η while t_k = 1 − k/10 lies in [0.05, 0.55], never before the last step
    loop = sigmas(ReMDMConfig(schedule="loop", eta=0.02), 10)
    assert loop == [0, 0, 0, 0, 0, 0.02, 0.02, 0.02, 0.02, 0]


def test_remdm_costs_its_extra_steps_and_its_remasks_change_the_samples():
    plain = run_strategy("remdm:n=3,eta=0.0+majority", steps=12)
    remasked = run_strategy("remdm:n=3,eta=0.9+majority", steps=12)
    longer = run_strategy("remdm:n=3,schedule=loop,eta=0.5,extra=4+majority", steps=12)
    assert [r["ledger"]["passes"]["denoise"] for r in longer] == [48] * len(longer)
    texts = lambda records: [c["text"] for r in records for c in r["candidates"]]  # noqa: E731
    assert texts(plain) == texts(run_strategy("independent:n=3+majority", steps=12))
    assert texts(remasked) != texts(plain)


def test_prism_widths_and_cost_by_hand():
    config = PrismConfig(n=8, final=2, start=0.0, end=0.5, decay=2.0)
    denoised, cuts = widths(config, 8)
    assert denoised == [8, 4, 2, 2, 2, 2, 2, 2]  # targets 8, ⌈8/2⌉, ⌈8/4⌉, then final
    assert cuts == [0, 8, 4, 0, 0, 0, 0, 0]
    assert Prism(n=8, final=2, start=0.0, end=0.5, decay=2.0).cost(8) == {
        "denoise": 24,
        "score:self": 12,
    }
    assert shares(5, 2) == [3, 2]
    records = run_strategy("prism:n=6,final=2,start=0,end=1,scorer=prm+majority", steps=12)
    assert all(len(r["candidates"]) == 2 for r in records)
    assert all(r["info"]["kept"] for r in records)


def test_ensemble_mixes_the_settings_the_backbone_varies():
    dream = Ensemble(n=4, temperatures="0.3/0.8").combinations(Dream.offered_orders)
    assert dream[:3] == [
        {"temperature": 0.3, "alg": "maskgit_plus"},
        {"temperature": 0.3, "alg": "topk_margin"},
        {"temperature": 0.3, "alg": "entropy"},
    ]
    assert len(dream) == 6
    llada = Ensemble(n=4, temperatures="0.5").combinations(LLaDA.offered_orders)
    assert llada == [
        {"temperature": 0.5, "remasking": "low_confidence"},
        {"temperature": 0.5, "remasking": "random"},
    ]
    assert Ensemble(orders="none", temperatures="").combinations(Dream.offered_orders) == [{}]
    block = Ensemble(temperatures="").combinations(BlockDiffusion.offered_orders)
    assert block == [{"remasking": order} for order in REMASKINGS]
    for kind in (Dream, LLaDA, BlockDiffusion):  # every order mixed is one the backbone takes
        backbone = kind(model="random")
        for settings in Ensemble().combinations(commit_orders(backbone)):
            backbone.check_row_settings(settings, 8, 8)
    assert Ensemble(temperatures="1").combinations({}) == [{"temperature": 1.0}]
    with pytest.raises(UserError, match="no commit order to vary per row; use orders=none"):
        Ensemble(orders="a/b").combinations({})


@pytest.mark.parametrize(
    ("kind", "config", "left"),
    [
        (Dream, {}, {"alg": RANKED_ALGS}),
        (Dream, {"threshold": 0.9}, {}),
        (Dream, {"entropy_bound": 0.5}, {"alg": RANKED_ALGS}),  # EB ranks by each order
        (LLaDA, {"factor": 1.0}, {}),
        (LLaDA, {"entropy_bound": 0.5}, {}),
    ],
)
def test_the_orders_offered_to_mix_are_those_a_row_may_set_beside_the_run_wide_rule(
    kind, config, left
):
    """Under a run-wide threshold, factor or entropy bound, only the order that rule ranks by
    is left, so an ensemble's `orders=auto` mixes temperatures alone: every order it mixed
    before was one the backbone then refused, and the run stopped at its first problem."""
    backbone = kind(model="random", **config)
    assert commit_orders(backbone) == left
    for settings in Ensemble().combinations(commit_orders(backbone)):
        backbone.check_row_settings(settings, 8, 8)


def test_a_sampler_ensemble_runs_on_the_demo_model_with_a_threshold(tmp_path, cli):
    argv = ["run", "--task", "arith", "--backbone", "tiny:threshold=0.9", "--limit", 1]
    argv += ["--method", "ensemble:n=4+majority", "--budget", 96, "--out", tmp_path / "r"]
    result = cli(*argv)
    assert result.code == 0, result.err
    record = json.loads((tmp_path / "r" / "samples.jsonl").read_text().splitlines()[0])
    assert len(record["candidates"]) == 4
    assert record["ledger"]["passes"]["denoise"] <= 96


def test_hex_and_ensemble_pools_nest_and_differ_from_the_independent_pool():
    hexed = run_strategy("hex:n=4,blocks=1/5+first", steps=12)
    independent = run_strategy("independent:n=4+first", steps=12)
    assert hexed[0]["ledger"]["passes"] == independent[0]["ledger"]["passes"]
    first = [c["text"] for c in hexed[0]["candidates"]]
    assert first != [c["text"] for c in independent[0]["candidates"]]
    smaller = run_strategy("hex:n=2,blocks=1/5+first", steps=12)
    assert [c["text"] for c in smaller[0]["candidates"]] == first[:2]
    mixed = run_strategy("ensemble:n=4,temperatures=0.5/1/2,orders=none+first", steps=12)
    assert mixed[0]["ledger"]["passes"] == independent[0]["ledger"]["passes"]
    texts = [[c["text"] for c in r["candidates"]] for r in mixed]
    assert texts != [[c["text"] for c in r["candidates"]] for r in independent]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_self_verification_scores_a_row_the_same_beside_any_rows(dtype):
    """A search that prunes on near-equal verdicts must not decide by its batch: a row's
    score is the same alone and beside longer rows."""
    from dllmbench.api.interfaces import ScoreBatch
    from dllmbench.plugins.scorers.self_verify import SelfVerify

    bb = Dream(model="random", dtype=dtype)
    scorer = SelfVerify(backbone=bb)
    prompts = [bb.encode(Prompt(text=t)) for t in ("1+2=", "123+456+7890=", "9=")]
    rows = [bb.canvas(p, 6) for p in prompts]
    for row, p in zip(rows, prompts, strict=True):
        row[len(p) : len(p) + 3] = torch.tensor(bb.encode(Prompt(text="abc"))[-3:])
    plens = [len(p) for p in prompts]
    together = scorer.score(ScoreBatch(rows, plens, [3] * 3, 6))
    for i in range(3):
        alone = scorer.score(ScoreBatch([rows[i]], [plens[i]], [3], 6))
        assert alone[0] == pytest.approx(together[i], rel=1e-6, abs=1e-6)
    assert np.isfinite(together).all()


@pytest.mark.parametrize("arch", ["dream", "llada", "block", "fast-dllm-v2"])
def test_self_verification_reads_one_head_row_as_the_full_logits_would(arch):
    """The verdict is the head's Yes row minus its No row, in float64, at the last hidden
    state the backbone's `logits` reads (Dream's shift, the block models' block-causal mask):
    in float32 it equals logit(Yes) − logit(No) of the full [B, L, V] logits, and it is
    charged as one head row at one position. In bfloat16 the two logits were rounded to 8
    bits before their difference: the verdicts of distinct rows tied."""
    from dllmbench.api.interfaces import ScoreBatch
    from dllmbench.plugins.scorers.batching import by_width, pad_to
    from dllmbench.plugins.scorers.self_verify import SelfVerify

    build = {"dream": Dream, "llada": LLaDA, "block": BlockDiffusion, "fast-dllm-v2": FastDLLMv2}
    blocks = {"block": {"block_length": 4}, "fast-dllm-v2": {"block_length": 4, "sub_block": 2}}
    verdicts = {}
    for dtype in ("float32", "bfloat16"):
        bb = build[arch](model="random", dtype=dtype, **blocks.get(arch, {}))
        scorer = SelfVerify(backbone=bb)
        prompts = [bb.encode(Prompt(text=t)) for t in ("1+2=", "123+456+7890=", "9=", "77=")]
        rows = [bb.canvas(p, 6) for p in prompts]
        for n, (row, p) in enumerate(zip(rows, prompts, strict=True)):
            row[len(p) : len(p) + 3] = torch.tensor(bb.encode(Prompt(text=f"a{n}c"))[-3:])
        batch = ScoreBatch(rows, [len(p) for p in prompts], [3] * 4, 6)
        verdicts[dtype] = scorer.score(batch)
        full = SelfVerify(backbone=bb)
        full._verdict = None  # the backbone's whole logits, as a foreign backbone is read
        hidden = bb.transformer.config.hidden_size
        assert scorer.model_shape == full.model_shape.plus(head=hidden)
        asked = [len(r) for r in scorer._asked(batch)]
        assert scorer.score_work(batch) == [Work.full(n, head=1) for n in asked]
        if dtype == "float32":
            assert verdicts[dtype] == pytest.approx(full.score(batch), rel=1e-5, abs=1e-6)
            continue
        # bfloat16: the logits of the states computed in float64, unrounded (the full
        # logits in bfloat16 are off by up to half a step of 8 bits)
        weight = bb.transformer.lm_head.weight.double()
        asked = scorer._asked(batch)
        for width, members in by_width(asked):  # batched as the scorer batches them
            ids, attn, _ = pad_to(bb, [asked[i] for i in members], width, scorer._pad_id)
            logits = bb.read_states(ids, attn)[:, -1].double() @ weight.T
            exact = logits[:, scorer._yes] - logits[:, scorer._no]
            assert verdicts[dtype][members] == pytest.approx(exact.numpy(), rel=1e-12, abs=1e-12)
        # and as near the float32 model's as its bfloat16 states allow
        assert verdicts[dtype] == pytest.approx(verdicts["float32"], rel=0.1, abs=0.05)


def test_a_pool_holds_only_states_ops_produced():
    """Rows moved to their T outside ops.denoise (uncharged) are refused, as are rows whose
    tokens were written by hand."""
    ops = _ops()
    rows = ops.start(PROBLEM, 2)
    jumped = rows.advanced(rows.tokens, (4, 4))
    with pytest.raises(ValueError, match="never produced"):
        ops.pool(jumped)
    written = rows.tokens.clone()
    written[:, 3:] = 7
    with pytest.raises(ValueError, match="2 row"):
        ops.pool(rows.advanced(written, (4, 4)))
