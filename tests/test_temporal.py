"""Temporal Self-Consistency Voting (`temporal`): the reference's loop transcribed in plain
torch against the strategy on a tiny random LLaDA, what each step is charged for its
predictions, rows that do not ask left as they were, the guards on `ops.predictions`, and the
plan-time refusal on a backbone that reports no predictions."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from last_character import LastCharacter

from dllmbench.api.interfaces import model_shape, pool_size_of
from dllmbench.core.flops import Work, flops
from dllmbench.core.keys import row_key
from dllmbench.core.types import Pool
from dllmbench.execution.engine import Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import DiffusionBackbone, purpose_generator
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.strategies.temporal import Temporal
from dllmbench.testing.doubles import ToyBackbone, ToySum
from dllmbench.testing.helpers import run_methods, run_strategy

SEED = 0


def method(spec: str) -> Method:
    return Method.build(registry(), MethodSpec.parse(spec))


def run(bb, task, specs, steps, gen_length, **capacity):
    methods = [method(s) for s in specs]
    engine = Engine(
        backbone=bb,
        scorers={},
        task=task,
        methods=methods,
        sampling=Sampling(steps, gen_length, "fewshot", SEED),
    )
    return engine, engine.run(task.problems("test"))


# -- the reference, transcribed ----------------------------------------------------------------
def reference_weight(weighting: str, alpha: float, s: int, steps: int) -> float:
    if weighting == "fixed":
        return 1.0
    if weighting == "linear":
        return (s + 1) / steps
    return math.exp(alpha * s / steps)


def reference_temporal(
    bb, problem, task, *, copy, steps, gen_length, block, temperature, weighting, alpha
):
    """The reference's low-confidence sampler with the temporal tally, on one sample: at every
    step the model runs on the whole canvas, x0 is the argmax of the (Gumbel-noised) logits
    at every position, committed tokens are kept, x0 is decoded and its answer tallied with
    w(s); the most confident masked positions of the current block take x0.

    Two things are the harness's own, on both sides: the uniforms (the backbone's keyed
    generators: one draw per position of the current block in position order, another for
    the masked positions after it, where the reference draws one [L, V] tensor), and the
    decoding of a prediction (`backbone.decode`, as for every candidate)."""
    prompt = bb.encode(task.prompt(problem, "fewshot"))
    plen, mask = len(prompt), bb.mask_id
    x = torch.tensor([prompt + [mask] * gen_length])
    key = row_key(SEED, problem.id, "sample", (copy,))
    blocks = gen_length // block
    per = steps // blocks
    history = []  # (text, answer key or None, weight) per step
    s = 0
    for b in range(blocks):
        end = plen + (b + 1) * block
        block_masked = int((x[0, plen + b * block : end] == mask).sum())
        quota = [block_masked // per + (j < block_masked % per) for j in range(per)]
        for j in range(per):
            masked = x == mask
            with torch.no_grad():
                logits = bb.transformer(input_ids=x).logits[0]  # [L, V]
            vocab = logits.shape[-1]
            if temperature > 0:
                u = torch.full((x.shape[1], vocab), 0.5, dtype=torch.float64)
                here = masked[0].clone()
                here[end:] = False
                after = masked[0].clone()
                after[:end] = False
                gen = purpose_generator(key, s, "token")
                u[here] = torch.rand((int(here.sum()), vocab), generator=gen, dtype=torch.float64)
                gen = purpose_generator(key, s, "predict")
                u[after] = torch.rand((int(after.sum()), vocab), generator=gen, dtype=torch.float64)
                noised = logits.double().exp() / (-torch.log(u)) ** temperature
                x0 = noised.argmax(-1)[None]
            else:
                x0 = logits.argmax(-1)[None]
            p = torch.softmax(logits.double(), dim=-1)
            x0_p = p.gather(-1, x0[0, :, None])[:, 0][None]
            x0 = torch.where(masked, x0, x)
            confidence = torch.where(masked, x0_p, torch.tensor(-math.inf, dtype=torch.float64))
            confidence[:, end:] = -math.inf
            # the temporal tally of this step's prediction
            text = bb.decode(x0[0], plen)
            answer = task.extract(text)
            answer_key = None if answer is None else task.answer_key(answer)
            history.append((text, answer_key, reference_weight(weighting, alpha, s, steps)))
            picked = torch.topk(confidence[0], k=quota[j]).indices
            x[0, picked] = x0[0, picked]
            s += 1
    return history, x[0]


def tally(history):
    totals: dict = {}
    for _, answer_key, weight in history:
        if answer_key is not None:
            totals[answer_key] = totals.get(answer_key, 0.0) + weight
    return totals


@pytest.mark.parametrize(
    "temperature,block,weighting,n",
    [(0.0, 4, "exp", 1), (0.8, 4, "exp", 1), (0.8, 12, "linear", 1), (0.8, 6, "fixed", 2)],
)
def test_temporal_tallies_the_references_predictions_step_by_step(temperature, block, weighting, n):
    steps, gen_length, alpha = 6, 12, 5.0
    bb = LLaDA(model="random", temperature=temperature, block_length=block)
    task = LastCharacter(2)
    spec = f"temporal:n={n},weighting={weighting},alpha={alpha}+weighted_majority:by=weight"
    _, records = run(bb, task, [spec], steps, gen_length)
    for problem, record in zip(task.problems("test"), records, strict=True):
        samples = [
            reference_temporal(
                bb,
                problem,
                task,
                copy=i,
                steps=steps,
                gen_length=gen_length,
                block=block,
                temperature=temperature,
                weighting=weighting,
                alpha=alpha,
            )
            for i in range(n)
        ]
        # the pool: step by step, each sample's prediction at that step
        expected = [samples[i][0][s] for s in range(steps) for i in range(n)]
        got = [
            (c["text"], None if c["key"] is None else c["key"], c["weight"])
            for c in record["candidates"]
        ]
        assert got == expected
        assert [c["lineage"] for c in record["candidates"]] == [
            [i, s] for s in range(steps) for i in range(n)
        ]
        # the vote: the tallies, in the order answers were first tallied, and the winner
        totals = tally(expected)
        assert list(totals.items()) == list(tally(got).items())
        chosen = record["selected"]
        if totals:
            best = max(totals, key=totals.get)  # first of the largest, as the reference's dict
            assert record["candidates"][chosen]["key"] == best
        else:
            assert chosen is None
        # the last step's prediction is the sample itself, unless the model committed the
        # mask token (the reference sampler can): there the prediction holds a fresh draw
        for i, (_, final) in enumerate(samples):
            if not bool((final == bb.mask_id).any()):
                last = record["candidates"][(steps - 1) * n + i]["text"]
                assert last == bb.decode(final, len(final) - gen_length)
    # not vacuous: answers were tallied
    assert any(c["key"] is not None for r in records for c in r["candidates"])


def test_the_reference_test_sees_a_vote_that_differs_from_the_final_answer():
    """The transcription is worth something only when the predictions along a trajectory
    disagree: on these seeds some step's answer differs from the final one, and the
    weighting changes the winner of at least one problem."""
    bb = LLaDA(model="random", temperature=0.8, block_length=4)
    task = LastCharacter(4)
    _, records = run(
        bb,
        task,
        [
            "temporal:n=1,weighting=fixed+weighted_majority:by=weight",
            "temporal:n=1,weighting=exp,alpha=5+weighted_majority:by=weight",
        ],
        6,
        12,
    )
    fixed = {r["problem"]: r for r in records if "fixed" in r["method"]}
    exp = {r["problem"]: r for r in records if "exp" in r["method"]}
    differs = [
        p for p, r in fixed.items() if len({c["key"] for c in r["candidates"] if c["key"]}) > 1
    ]
    assert differs
    assert any(fixed[p]["answer"] != exp[p]["answer"] for p in fixed) or any(
        fixed[p]["answer"] != fixed[p]["candidates"][-1]["answer"] for p in fixed
    )


# -- what a step is charged ----------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LLaDA, Dream])
def test_each_step_is_charged_the_head_its_predictions_computed(cls, monkeypatch):
    """The ledger charges the head at every position it was computed: the passes are n·T,
    the FLOPs the forward over each row plus 2·P_head per head position the sampler ran
    (counted where the head runs), and beside independent sampling of the same rows exactly
    the masked positions after each step's block (by hand: blocks of 4 of 12, two steps
    each, so 8, 8, 4, 4, 0, 0 per row)."""
    counted = []
    head = DiffusionBackbone.head

    def observed(self, states):
        counted.append(states.shape[0])
        return head(self, states)

    bb = cls(model="random", temperature=0.8, block_length=4)
    task = LastCharacter(1)
    monkeypatch.setattr(DiffusionBackbone, "head", observed)
    _, (temporal,) = run(bb, task, ["temporal:n=2+weighted_majority:by=weight"], 6, 12)
    shape = model_shape(bb)
    width = len(bb.encode(task.prompt(task.problems("test")[0], "fewshot"))) + 12
    assert temporal["ledger"]["passes"] == {"denoise": 2 * 6}
    body = 2 * 6 * flops(shape, Work.full(width, head=0))
    assert temporal["ledger"]["flops"]["denoise"] == body + 2 * shape.head * sum(counted)
    monkeypatch.setattr(DiffusionBackbone, "head", head)
    _, (independent,) = run(bb, task, ["independent:n=2+first"], 6, 12)
    extra = temporal["ledger"]["flops"]["denoise"] - independent["ledger"]["flops"]["denoise"]
    assert extra == 2 * shape.head * 2 * (8 + 8 + 4 + 4 + 0 + 0)


def test_rows_that_do_not_ask_are_stepped_and_charged_as_before():
    """Beside a temporal pool of the same rows (same keys, so the same canvases in one
    forward), independent samples come out as alone, bit for bit, and are charged as alone;
    the temporal pool's last predictions are those samples."""
    bb = LLaDA(model="random", temperature=0.8, block_length=4, suppress_mask=True)
    task = LastCharacter(2)
    _, alone = run(bb, task, ["independent:n=2+first"], 6, 12)
    _, mixed = run(
        bb, task, ["independent:n=2+first", "temporal:n=2+weighted_majority:by=weight"], 6, 12
    )
    beside = [r for r in mixed if r["method"].startswith("independent")]
    temporal = [r for r in mixed if r["method"].startswith("temporal")]
    for a, b, t in zip(alone, beside, temporal, strict=True):
        assert [c["text"] for c in a["candidates"]] == [c["text"] for c in b["candidates"]]
        assert a["ledger"]["passes"] == b["ledger"]["passes"]
        assert a["ledger"]["flops"] == b["ledger"]["flops"]
        assert [c["text"] for c in t["candidates"][-2:]] == [c["text"] for c in a["candidates"]]
        assert t["ledger"]["flops"]["denoise"] > a["ledger"]["flops"]["denoise"]


def test_the_pool_is_n_by_t_and_sized_at_t():
    strategy = Temporal(n=3)
    assert strategy.pool_size() == 3 and pool_size_of(strategy, 24) == 72
    assert method("temporal:n=3+argmax:scorer=orm").cost(24) == {"denoise": 72, "score:orm": 72}
    records = run_strategy("temporal:n=3+weighted_majority:by=weight", steps=5, problems=2)
    assert [len(r["candidates"]) for r in records] == [15, 15]
    assert all(r["ledger"]["passes"] == {"denoise": 15} for r in records)


# -- the guards on ops.predictions --------------------------------------------------------------
class Forging:
    """A strategy that tampers with what ops.predictions reads (or asks it wrongly)."""

    scorers: tuple[str, ...] = ()
    prefix_field: ClassVar[str | None] = None

    def __init__(self, how: str):
        self.how = how
        self.config = {"how": how}

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": total_steps}

    def pool_size(self) -> int:
        return 1

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem, ops) -> Pool:
        rows = ops.start(problem, copies=1, predictions=self.how != "unasked")
        if self.how == "early":
            ops.predictions(rows)
        rows = await ops.denoise(rows, ops.T - 1)
        if self.how == "tamper":
            rows.prediction[0, rows.prompt_len :] = 3  # a prediction ops never produced
        made = ops.predictions(rows)
        rows = await ops.denoise(rows, 1)
        return ops.pool(made if self.how == "tamper" else rows)


@pytest.mark.parametrize(
    "how,needle",
    [
        ("tamper", "ops never produced"),
        ("unasked", "predictions=True"),
        ("early", "has taken no step yet"),
    ],
)
def test_ops_predictions_refuses_what_it_did_not_make(how, needle):
    from dllmbench.core.errors import PluginViolation

    forging = Method("forging", MethodSpec("forging"), Forging(how), registry().selector("first"))
    with pytest.raises(PluginViolation, match=needle):
        run_methods([forging], steps=4, problems=1)


def test_a_backbone_without_predictions_refuses_at_the_first_problem():
    class Silent(ToyBackbone):
        predicts = False

    task = ToySum(size=1)
    engine = Engine(
        backbone=Silent(),
        scorers={},
        task=task,
        methods=[method("temporal:n=1+weighted_majority:by=weight")],
        sampling=Sampling(4, 6, "fewshot"),
    )
    from dllmbench.core.errors import UserError

    with pytest.raises(UserError, match="does not report"):
        engine.run(task.problems("test"))


def test_plan_refuses_temporal_on_a_backbone_without_predictions(cli):
    from conftest import assert_user_error

    spec = "temporal:n=1+weighted_majority:by=weight"
    result = cli("plan", "--backbone", "tiny-block", "--method", spec, "--budget", "100")
    assert_user_error(result, "read each step's predictions", "does not report")
    ok = cli("plan", "--backbone", "tiny", "--method", spec, "--budget", "100", "--steps", "24")
    assert ok.code == 0, ok.err
    bad = cli("plan", "--method", "temporal:weighting=cubic+first", "--budget", "100")
    assert_user_error(bad, "option weighting wants one of", "cubic")


def test_weights_by_hand():
    t = Temporal(weighting="exp", alpha=5.0)
    assert t.weight(0, 4) == 1.0 and t.weight(2, 4) == pytest.approx(math.exp(2.5))
    assert Temporal(weighting="linear").weight(1, 4) == 0.5
    assert Temporal(weighting="fixed").weight(3, 4) == 1.0


class Liar(ToyBackbone):
    """Reports predictions that break the contract, as told."""

    def __init__(self, how: str, **config):
        super().__init__(**config)
        self.how = how

    def denoise_step_with_predictions(self, batch):
        out = []
        for tokens, confidence, made in super().denoise_step_with_predictions(batch):
            if made is not None and self.how == "rewrites":
                made = made.clone()
                made[0] = (int(made[0]) + 1) % 10  # a prompt token changed
            if made is None and self.how == "unasked":
                made = tokens.clone()
            out.append((tokens, confidence, made))
        return out


@pytest.mark.parametrize(
    "how,needle",
    [("rewrites", "keeps the prompt and every committed token"), ("unasked", "did not ask")],
)
def test_a_backbone_whose_predictions_break_the_contract_is_named(how, needle):
    from dllmbench.core.errors import PluginViolation

    task = ToySum(size=1)
    specs = ["temporal:n=1+weighted_majority:by=weight", "independent:n=1+first"]
    engine = Engine(
        backbone=Liar(how),
        scorers={},
        task=task,
        methods=[method(s) for s in specs],
        sampling=Sampling(4, 6, "fewshot"),
    )
    with pytest.raises(PluginViolation, match=needle):
        engine.run(task.problems("test"))


class SamplesAndPredictions:
    """A pool of each row's last prediction but one and the sample itself: rows that record
    predictions joined with the candidates ops.predictions made (which record none)."""

    scorers: tuple[str, ...] = ()
    prefix_field: ClassVar[str | None] = None
    config: ClassVar[dict] = {}

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": 2 * total_steps}

    def pool_size(self) -> int:
        return 4

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem, ops) -> Pool:
        from dllmbench.core.types import Rows

        rows = await ops.denoise(ops.start(problem, copies=2, predictions=True), ops.T - 1)
        made = ops.predictions(rows)
        rows = await ops.denoise(rows, 1)
        return ops.pool(Rows.concat(made, rows))


def test_samples_that_record_predictions_join_a_pool_with_their_predictions():
    """Rows.concat drops the predictions of rows joined with rows that record none; the
    samples left are states ops gave out, so the pool takes them (it refused them as
    'changed outside ops')."""
    joined = Method(
        "joined", MethodSpec("joined"), SamplesAndPredictions(), registry().selector("first")
    )
    (record,) = run_methods([joined], steps=4, problems=1)
    lineages = [tuple(c["lineage"]) for c in record["candidates"]]
    assert lineages == [(0, 2), (1, 2), (0,), (1,)]
    assert record["ledger"]["passes"] == {"denoise": 8}


# -- Dream's prediction against Dream's own sampler ---------------------------------------------
def dream_sample_tokens(logits, u, temperature, top_p, top_k):
    """Dream's `sample_tokens` (generation_utils) in plain torch and float64: temperature, its
    top-p (the first token past the threshold kept) and top-k filters, softmax, and its
    Categorical draw taken by inverse CDF with the uniforms `u` (argmax at temperature 0)."""
    logits = logits.double()
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        ordered, order = torch.sort(logits, descending=True)
        remove = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, remove)
        logits = logits.masked_fill(drop, torch.finfo(logits.dtype).min)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    if temperature == 0:
        return probs.argmax(-1)
    cdf = probs.cumsum(-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return drawn.clamp(max=probs.shape[-1] - 1)


@pytest.mark.parametrize(
    "temperature,top_p,top_k,block",
    [
        (0.0, 1.0, None, None),
        (0.0, 1.0, None, 4),
        (0.7, 1.0, None, None),
        (0.7, 0.9, 20, 4),
        (1.0, 0.8, None, 6),
        (0.5, 1.0, 5, 4),
    ],
)
def test_dreams_prediction_is_its_own_samplers_draw_at_every_masked_position(
    temperature, top_p, top_k, block
):
    """Each step's prediction on a random Dream is what Dream's sampler draws over the whole
    canvas (its x0 at every masked position, before it chooses which to commit), with the
    row's token uniform of that position; the tokens it commits are those same draws."""
    from dllmbench.api.interfaces import StepBatch

    bb = Dream(
        model="random",
        seed=3,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        block_length=block,
        alg_temp=None,
    )
    steps, gen, key = 6, 12, 11
    prompt = torch.randint(0, bb.mask_id, (5,), generator=torch.Generator().manual_seed(2))
    row = torch.cat([prompt, torch.full((gen,), bb.mask_id)])
    beyond = differs_from_argmax = 0
    for s in range(steps):
        batch = StepBatch([row], [5], [s], [key], steps, predict=[True])
        new, _, prediction = bb.denoise_step_with_predictions(batch)[0]
        with torch.no_grad():
            logits = bb.transformer(input_ids=row[None]).logits[0]
        logits = torch.cat([logits[:1], logits[:-1]])  # Dream reads position i from i - 1
        gen_u = purpose_generator(key, s, "token")
        u = torch.rand(len(row), generator=gen_u, dtype=torch.float64)
        masked = row == bb.mask_id
        expected = row.clone()
        expected[masked] = dream_sample_tokens(logits[masked], u[masked], temperature, top_p, top_k)
        assert torch.equal(prediction, expected), f"step {s}"
        committed = new != row
        assert torch.equal(new[committed], expected[committed]), f"step {s}"
        if block is not None:
            beyond += int(masked[5 + (s // (steps // (gen // block)) + 1) * block :].sum())
        argmax = dream_sample_tokens(logits[masked], u[masked], 0.0, top_p, top_k)
        differs_from_argmax += int((expected[masked] != argmax).sum())
        row = new
    assert block is None or beyond > 0  # positions only a prediction draws were compared
    assert temperature == 0 or differs_from_argmax > 0  # the uniforms decided some draws


class Unsized(Temporal):
    """Temporal's pool, declared by pool_size() alone (no pool_size_at)."""

    pool_size_at = None  # type: ignore[assignment]


def test_a_pool_sized_by_steps_without_pool_size_at_is_told_what_declares_it():
    from dllmbench.core.errors import PluginViolation

    assert pool_size_of(Unsized(n=1), 4) == 1  # not SizedBySteps
    unsized = Method("unsized", MethodSpec("unsized"), Unsized(n=1), registry().selector("first"))
    with pytest.raises(PluginViolation, match=r"declared 1 \(pool_size\(\); .*pool_size_at\(T\)"):
        run_methods([unsized], steps=4, problems=1)


def test_plugin_authors_documents_what_a_strategy_reading_predictions_uses():
    """docs/plugin-authors.md alone lets a third-party strategy read predictions: the ops
    table's `ops.start` shows every keyword it takes, and the strategy members table the
    optional members the engine reads (`pool_size_at`, `reads_predictions`)."""
    import inspect
    import re
    from pathlib import Path

    from dllmbench.api.ops import Ops

    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugin-authors.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith("| `ops.start(")]
    shown = row.split("`")[1]
    taken = [p for p in inspect.signature(Ops.start).parameters if p != "self"]
    assert taken and all(re.search(rf"\b{p}\b", shown) for p in taken), (shown, taken)
    members = doc.split("## Search strategies", 1)[1].split("### What `ops` offers", 1)[0]
    for member in ("`pool_size_at(total_steps)`", "`reads_predictions`"):
        assert f"| {member} |" in members, member
