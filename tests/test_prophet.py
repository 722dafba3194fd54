"""Prophet (`prophet`): the reference's early-exit loop transcribed in plain torch against the
strategy on a tiny random LLaDA (tokens, steps taken and passes charged), what each step is
charged for the head it computes, rows that do not use the rule left as they were, and the
refusals before a run starts."""

from __future__ import annotations

import pytest
import torch
from last_character import LastCharacter

from dllmbench.api.interfaces import StepBatch, model_shape
from dllmbench.core.flops import Work, flops
from dllmbench.core.keys import row_key
from dllmbench.execution.engine import Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA

SEED = 0


def method(spec: str) -> Method:
    return Method.build(registry(), MethodSpec.parse(spec))


def run(bb, task, specs, steps, gen_length):
    engine = Engine(
        backbone=bb,
        scorers={},
        task=task,
        methods=[method(s) for s in specs],
        sampling=Sampling(steps, gen_length, "fewshot", SEED),
    )
    return engine.run(task.problems("test"))


def finals(bb, monkeypatch):
    """Each row's canvas after every step the engine ran, by row key (its last is final)."""
    seen: dict[int, list[torch.Tensor]] = {}
    step = bb.denoise_step_with_predictions

    def observed(batch):
        out = step(batch)
        for key, row in zip(batch.keys, out, strict=True):
            seen.setdefault(key, []).append(row[0].clone())
        return out

    monkeypatch.setattr(bb, "denoise_step_with_predictions", observed)
    return seen


# -- the reference, transcribed ----------------------------------------------------------------
def reference_constraints(bb, text: str) -> dict[int, int]:
    """eval_llada.py's `_parse_constraints`: "pos:word|...", each word with a leading space."""
    out: dict[int, int] = {}
    for part in text.split("|"):
        where, word = part.split(":", 1)
        for k, token in enumerate(
            bb.tokenizer.encode(" " + word.strip(), add_special_tokens=False)
        ):
            out[int(where) + k] = token
    return out


def reference_prophet(
    bb, prompt, *, steps, gen_length, block, constraints, answer_at, length, bars, cfg=0.0
):
    """generate_earlyexit.py's `generate` at temperature 0, low-confidence remasking, with
    guidance at scale `cfg` (0: none; it masks the constraints with the prompt), on one
    sample: the constraints placed; every step one forward of the whole canvas (two with
    guidance); the answer region's mean top-2 logit gap against its phase's bar (by the
    1-based global step over T); on exit every masked position takes x0 and decoding stops;
    else the block's quota (of the block's masked positions when it began) commits the most
    confident masked positions of the block. Returns the canvas and the forward steps run."""
    plen, mask = len(prompt), bb.mask_id
    x = torch.tensor([prompt + [mask] * gen_length])
    held = reference_constraints(bb, constraints) if constraints else {}
    for pos, token in held.items():
        if plen + pos < x.shape[1]:
            x[0, plen + pos] = token
    prompt_index = x != mask  # the prompt and the constraints
    start = plen + (answer_at if answer_at is not None else max(held) + 2)
    answer = list(range(start, min(plen + gen_length, start + length)))
    blocks, forwards, global_step = gen_length // block, 0, 0
    per = steps // blocks
    for b in range(blocks):
        begin, end = plen + b * block, plen + (b + 1) * block
        masked_block = int((x[0, begin:end] == mask).sum())
        quota = [masked_block // per + (j < masked_block % per) for j in range(per)]
        for j in range(per):
            global_step += 1
            masked = x == mask
            with torch.no_grad():
                logits = bb.transformer(input_ids=x).logits  # [1, L, V]
                if cfg > 0:
                    un_x = x.clone()
                    un_x[prompt_index] = mask
                    un = bb.transformer(input_ids=un_x).logits
                    logits = un + (cfg + 1) * (logits - un)
            forwards += 1
            x0 = logits.argmax(-1)
            p = torch.softmax(logits.double(), dim=-1)
            x0_p = p.gather(-1, x0[..., None])[..., 0]
            gaps = []
            for pos in answer:
                top = torch.topk(logits[:, pos, :], k=2, dim=-1).values
                gaps.append((top[0, 0] - top[0, 1]).item())
            progress = global_step / steps
            bar = bars[0] if progress < 0.33 else bars[1] if progress < 0.67 else bars[2]
            if gaps and sum(gaps) / len(gaps) >= bar:
                x[masked] = x0[masked]
                return x[0], forwards
            x0_p[:, end:] = -torch.inf
            x0 = torch.where(masked, x0, x)
            confidence = torch.where(masked, x0_p, -torch.inf)
            if quota[j] > 0:
                picked = torch.topk(confidence[0], k=quota[j]).indices
                x[0, picked] = x0[0, picked]
    return x[0], forwards


# (seed of the random model, block length, constraints, answer_at, answer_length, bars, the
# forwards each of the three problems takes: an exit mid-run, at the last step, or none;
# classifier-free guidance's scale)
CASES = [
    (0, 4, "5:ab", None, 3, (1.0, 0.09, 0.02), [2, 2, 5]),
    (3, 4, "5:ab", None, 3, (1.0, 0.05, 0.05), [2, 6, 2]),
    (0, 4, "5:ab", None, 3, (1.0, 1.0, 1.0), [6, 6, 6]),
    (3, 12, "", 8, 4, (0.3, 0.3, 0.03), [5, 6, 6]),
    (0, 6, "2:a|9:b", 6, 5, (0.5, 0.08, 0.02), [2, 2, 2]),
    (0, 6, "2:a|9:b", 6, 5, (1.0, 1.0, 1.0), [6, 6, 6]),
    (0, 4, "5:ab", None, 3, (1.0, 0.15, 0.04), [2, 5, 5], 1.0),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_prophet_rows_are_the_references_token_for_token(case, monkeypatch):
    seed, block, constraints, answer_at, length, bars, forwards, *guidance = case
    cfg = guidance[0] if guidance else 0.0
    steps, gen_length = 6, 12
    bb = LLaDA(model="random", temperature=0.0, block_length=block, seed=seed, cfg_scale=cfg)
    task = LastCharacter(3)
    options = [f"answer_length={length}", f"early={bars[0]}", f"mid={bars[1]}", f"late={bars[2]}"]
    if constraints:
        options.append(f"constraints={constraints}")
    if answer_at is not None:
        options.append(f"answer_at={answer_at}")
    seen = finals(bb, monkeypatch)
    records = run(bb, task, [f"prophet:n=1,{','.join(options)}+first"], steps, gen_length)
    by_problem = {r["problem"]: r for r in records}
    taken = []
    for problem in task.problems("test"):
        record = by_problem[problem.id]
        prompt = bb.encode(task.prompt(problem, "fewshot"))
        expected, ran = reference_prophet(
            bb,
            prompt,
            steps=steps,
            gen_length=gen_length,
            block=block,
            constraints=constraints,
            answer_at=answer_at,
            length=length,
            bars=bars,
            cfg=cfg,
        )
        rows = seen[row_key(SEED, problem.id, "sample", (0,))]
        assert torch.equal(rows[-1], expected)
        assert len(rows) == ran == record["ledger"]["passes"]["denoise"] // bb.passes_per_step
        assert record["candidates"][0]["text"] == bb.decode(expected, len(prompt))
        assert record["candidates"][0]["settings"]["prophet"] is True
        taken.append(ran)
    if forwards is not None:
        assert taken == forwards


# -- what each step is charged --------------------------------------------------------------------
def counting_head(monkeypatch) -> list[int]:
    """The positions the LM head runs at, call by call."""
    counted: list[int] = []
    head = DiffusionBackbone.head

    def observed(self, states):
        counted.append(states.shape[0])
        return head(self, states)

    monkeypatch.setattr(DiffusionBackbone, "head", observed)
    return counted


def test_each_step_is_charged_the_head_it_computed_by_hand(monkeypatch):
    """Blocks of 4 of 12, T = 6, the first block held ("0:abc": a space and three letters),
    the answer region those 4 held positions, bars never reached. The head runs at the
    block's masked positions, every masked one after it (what an exit would commit) and the
    region (held, never eligible): 0+8+4, 0+8+4, 4+4+4, 2+4+4, 4+0+4, 2+0+4 = 60 positions,
    where a plain sample's is 4, 2, 4, 2, 4, 2 = 18 (the held block commits nothing: its quota
    counts its masked positions, none, as the reference's). The ledger charges exactly what ran."""
    bb = LLaDA(model="random", temperature=0.0, block_length=4)
    task = LastCharacter(1)
    counted = counting_head(monkeypatch)
    spec = "prophet:n=1,constraints=0:abc,answer_at=0,answer_length=4,early=1e9,mid=1e9,late=1e9"
    (prophet,) = run(bb, task, [spec + "+first"], 6, 12)
    assert sum(counted) == 60
    shape = model_shape(bb)
    width = len(bb.encode(task.prompt(task.problems("test")[0], "fewshot"))) + 12
    assert prophet["ledger"]["passes"] == {"denoise": 6}
    body = 6 * flops(shape, Work.full(width, head=0))
    assert prophet["ledger"]["flops"]["denoise"] == body + 2 * shape.head * 60
    counted.clear()
    (plain,) = run(bb, task, ["independent:n=1+first"], 6, 12)
    assert sum(counted) == 18
    extra = prophet["ledger"]["flops"]["denoise"] - plain["ledger"]["flops"]["denoise"]
    assert extra == 2 * shape.head * (60 - 18)


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=str)
def test_rows_that_exit_are_charged_the_forwards_and_heads_they_ran(case, monkeypatch):
    """With exits mid-run, the passes are the forwards each row ran and the FLOPs the
    forward over each plus 2·P_head per position the head ran at, counted where it runs."""
    seed, block, constraints, answer_at, length, bars, forwards, *_ = case
    bb = LLaDA(model="random", temperature=0.0, block_length=block, seed=seed)
    task = LastCharacter(3)
    options = f"answer_length={length},early={bars[0]},mid={bars[1]},late={bars[2]}"
    options += f",constraints={constraints}" if constraints else ""
    options += f",answer_at={answer_at}" if answer_at is not None else ""
    counted = counting_head(monkeypatch)
    records = run(bb, task, [f"prophet:n=1,{options}+first"], 6, 12)
    shape = model_shape(bb)
    assert sorted(r["ledger"]["passes"]["denoise"] for r in records) == sorted(forwards)
    body = 0
    for r in records:
        problem = next(p for p in task.problems("test") if p.id == r["problem"])
        width = len(bb.encode(task.prompt(problem, "fewshot"))) + 12
        body += r["ledger"]["passes"]["denoise"] * flops(shape, Work.full(width, head=0))
    charged = sum(r["ledger"]["flops"]["denoise"] for r in records)
    assert charged == body + 2 * shape.head * sum(counted)


@pytest.mark.parametrize("cls", [LLaDA, Dream])
def test_rows_that_do_not_use_the_rule_are_stepped_and_charged_as_before(cls):
    """Beside prophet rows of the same keys (the same canvases, but for the held tokens),
    independent samples come out as alone, bit for bit, and are charged as alone."""
    bb = cls(model="random", temperature=0.8, block_length=4, suppress_mask=True)
    task = LastCharacter(2)
    alone = run(bb, task, ["independent:n=2+first"], 6, 12)
    specs = [
        "independent:n=2+first",
        "prophet:n=2,answer_at=2,early=0.05,mid=0.05,late=0.01+first",
        "prophet:n=2,constraints=5:ab,mid=0.05+first",
    ]
    mixed = run(bb, task, specs, 6, 12)
    beside = [r for r in mixed if r["method"].startswith("independent")]
    key = lambda r: r["problem"]  # noqa: E731
    for a, b in zip(sorted(alone, key=key), sorted(beside, key=key), strict=True):
        assert [c["text"] for c in a["candidates"]] == [c["text"] for c in b["candidates"]]
        assert a["ledger"]["passes"] == b["ledger"]["passes"]
        assert a["ledger"]["flops"] == b["ledger"]["flops"]
    prophets = [r for r in mixed if r["method"].startswith("prophet")]
    assert any(r["ledger"]["passes"]["denoise"] < 12 for r in prophets)  # some rows exited


def test_the_baseline_holds_the_same_constraints_without_the_exit(monkeypatch):
    """`exit=false`: the paper's baseline, the constraints held, every row all T steps, and
    its tokens the reference's with bars never reached."""
    bb = LLaDA(model="random", temperature=0.0, block_length=4)
    task = LastCharacter(2)
    seen = finals(bb, monkeypatch)
    records = run(bb, task, ["prophet:n=1,constraints=5:ab,exit=false+first"], 6, 12)
    assert all(r["ledger"]["passes"] == {"denoise": 6} for r in records)
    # the records show what the rows carried: the constraints, no exit
    assert all(c["settings"] == {"constraints": "5:ab"} for r in records for c in r["candidates"])
    for problem in task.problems("test"):
        prompt = bb.encode(task.prompt(problem, "fewshot"))
        expected, _ = reference_prophet(
            bb,
            prompt,
            steps=6,
            gen_length=12,
            block=4,
            constraints="5:ab",
            answer_at=None,
            length=5,
            bars=(1e9, 1e9, 1e9),
        )
        assert torch.equal(seen[row_key(SEED, problem.id, "sample", (0,))][-1], expected)


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "backbone,method_spec,needles",
    [
        (
            "dream:model=random,block_length=4,cache=prefix",
            "prophet:n=1,answer_at=3+first",
            ["Fast-dLLM's cache", "cache=none"],
        ),
        ("tiny-block", "prophet:n=1,answer_at=3+first", ["cannot vary per row", "prophet"]),
        (
            "llada:model=random,block_length=4,cache=dual",
            "prophet:n=1,answer_at=3+first",
            ["Fast-dLLM's cache", "cache=none"],
        ),
        ("llada:model=random", "prophet:n=1+first", ["answer region", "answer_at="]),
        ("llada:model=random", "prophet:n=1,constraints=ab+first", ["position:word", "20:The"]),
        ("llada:model=random", "prophet:n=1,answer_at=-1+first", ["answer_at", ">= 0"]),
        ("llada:model=random", "prophet:n=1,answer_at=2,mid=nan+first", ["mid", "finite"]),
    ],
)
def test_plan_refuses_what_cannot_be_honoured_in_one_line(cli, backbone, method_spec, needles):
    from conftest import assert_user_error

    result = cli(
        "plan", "--backbone", backbone, "--method", method_spec, "--budget", "100", "--steps", "24"
    )
    assert_user_error(result, *needles)


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("budget", ["100", "1e9flops"])
def test_a_block_backbone_refuses_the_rule_in_the_same_line_at_any_budget(
    cli, tmp_path, command, budget
):
    """On a block-diffusion backbone, whose rows cannot vary the rule's settings, a FLOP
    budget (checked before the models load, to price it) gives the line a budget in passes
    gives, not the Config's complaint about an unknown keyword."""
    from conftest import assert_user_error

    args = [command, "--task", "arith", "--backbone", "tiny-block", "--methods", "vanilla"]
    args += ["--method", "prophet:n=1,answer_at=2+first", "--budget", budget]
    args += ["--out", str(tmp_path / "run")] if command == "run" else []
    result = cli(*args)
    assert_user_error(result, "cannot vary per row", "prophet", "choose a backbone")
    assert "unexpected keyword" not in result.err


def test_plan_takes_prophet_on_llada(cli):
    spec = "prophet:n=2,constraints=20:The|21:answer|22:is+majority"
    ok = cli(
        "plan",
        "--backbone",
        "llada:model=random",
        "--method",
        spec,
        "--budget",
        "100",
        "--steps",
        "24",
    )
    assert ok.code == 0, ok.err
    assert "≤ 48" in ok.out


def test_held_tokens_are_placed_before_the_forward_and_make_a_canvas_of_their_own():
    """A row's constraints are written at its masked positions before its step reads the
    canvas (each word with a leading space, its pieces from its position on), so a row
    holding them is not the same canvas as a plain row of the same tokens: both are computed
    (`computed_rows`), and the held tokens stand in the canvas after the step."""
    bb = LLaDA(model="random", temperature=0.0)
    canvas = bb.canvas([20, 21, 22], 8)
    held = {"constraints": "1:ab|6:c"}
    assert bb.held(bb.row_config(held)) == {
        1 + k: t for k, t in enumerate(bb.tokenizer.encode(" ab", add_special_tokens=False))
    } | {6 + k: t for k, t in enumerate(bb.tokenizer.encode(" c", add_special_tokens=False))}
    batch = StepBatch([canvas, canvas], [3, 3], [0, 0], [1, 1], 4, settings=[held, {}])
    assert bb.computed_rows(batch) == [0, 1]
    plain = StepBatch([canvas, canvas], [3, 3], [0, 0], [1, 1], 4)
    assert bb.computed_rows(plain) == [0]
    after = bb.denoise_step(batch)[0]
    for pos, token in bb.held(bb.row_config(held)).items():
        assert int(after[3 + pos]) == token


def test_dream_rows_exit_with_their_draw_and_are_charged_what_ran(monkeypatch):
    """Dream's sampler takes the same rule. A bar of 0 at the first phase exits every row at
    its first step (a gap is never negative): one forward, every masked position the step's
    draw, at temperature 0 the argmax of the logits of the canvas with its held tokens; bars
    never reached leave the row to its T. The ledger charges the head where it ran."""
    bb = Dream(model="random", temperature=0.0, alg_temp=0.0, block_length=4)
    task = LastCharacter(2)
    counted = counting_head(monkeypatch)
    seen = finals(bb, monkeypatch)
    specs = [
        "prophet:n=1,constraints=5:ab,early=0,mid=1e9,late=1e9+first",
        "prophet:n=1,answer_at=1,early=1e9,mid=1e9,late=1e9+first",
    ]
    records = run(bb, task, specs, 6, 12)
    shape = model_shape(bb)
    body = 0
    for r in records:
        problem = next(p for p in task.problems("test") if p.id == r["problem"])
        width = len(bb.encode(task.prompt(problem, "fewshot"))) + 12
        body += r["ledger"]["passes"]["denoise"] * flops(shape, Work.full(width, head=0))
        exits = "constraints" in r["method"]
        assert r["ledger"]["passes"] == {"denoise": 1 if exits else 6}
    charged = sum(r["ledger"]["flops"]["denoise"] for r in records)
    assert charged == body + 2 * shape.head * sum(counted)
    monkeypatch.setattr(DiffusionBackbone, "head", DiffusionBackbone.__dict__["head"])
    held = bb.held(bb.row_config({"constraints": "5:ab"}))
    for problem in task.problems("test"):
        prompt = bb.encode(task.prompt(problem, "fewshot"))
        canvas = bb.canvas(prompt, 12)
        for pos, token in held.items():
            canvas[len(prompt) + pos] = token
        with torch.no_grad():
            expected = bb.logits(canvas[None], torch.ones_like(canvas)[None])[0].argmax(-1)
        expected = torch.where(canvas == bb.mask_id, expected, canvas)
        # both methods' rows share the key; the exiting row's one step is among its canvases
        after = seen[row_key(SEED, problem.id, "sample", (0,))]
        assert any(torch.equal(row, expected) for row in after)
