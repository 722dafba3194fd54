"""Prophet (`prophet`): the reference's early-exit loop transcribed in plain torch against the
strategy on a tiny random LLaDA (tokens, steps taken and passes charged), what each step is
charged for the head it computes, rows that do not use the rule left as they were, and the
refusals before a run starts."""

from __future__ import annotations

import pytest
import torch

from dllmbench.api.interfaces import model_shape
from dllmbench.core.flops import Work, flops
from dllmbench.core.keys import row_key
from dllmbench.core.types import Problem, Prompt
from dllmbench.execution.engine import Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.backbones.llada import LLaDA

SEED = 0


class LastCharacter:
    """Questions the random model cannot answer; the answer is the last character."""

    def __init__(self, size: int = 3):
        self.size = size

    def splits(self) -> dict[str, int]:
        return {"test": self.size}

    def problems(self, split: str) -> list[Problem]:
        return [
            Problem(f"q{i}", f"{i} plus {i + 3} is", str((2 * i + 3) % 10))
            for i in range(self.size)
        ]

    def prompt(self, problem: Problem, style: str) -> Prompt:
        return Prompt(text=problem.question)

    def extract(self, text: str) -> str | None:
        return text[-1] if text else None

    def answer_key(self, answer: str) -> str:
        return answer

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return answer == problem.gold

    def data_files(self) -> dict[str, str]:
        return {}


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
        for k, token in enumerate(bb.tokenizer.encode(" " + word.strip(), add_special_tokens=False)):
            out[int(where) + k] = token
    return out


def reference_prophet(bb, prompt, *, steps, gen_length, block, constraints, answer_at, length, bars):
    """generate_earlyexit.py's `generate` at temperature 0, low-confidence remasking, no
    guidance, on one sample: the constraints placed; every step one forward of the whole
    canvas; the answer region's mean top-2 logit gap against its phase's bar (by the 1-based
    global step over T); on exit every masked position takes x0 and decoding stops; else the
    block's quota (of the block's masked positions when it began) commits the most confident
    masked positions of the block. Returns the canvas and the forwards run."""
    plen, mask = len(prompt), bb.mask_id
    x = torch.tensor([prompt + [mask] * gen_length])
    held = reference_constraints(bb, constraints) if constraints else {}
    for pos, token in held.items():
        if plen + pos < x.shape[1]:
            x[0, plen + pos] = token
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
# forwards each of the three problems takes: an exit mid-run, at the last step, or none)
CASES = [
    (0, 4, "5:ab", None, 3, (1.0, 0.09, 0.02), [2, 2, 5]),
    (3, 4, "5:ab", None, 3, (1.0, 0.05, 0.05), [2, 6, 2]),
    (0, 4, "5:ab", None, 3, (1.0, 1.0, 1.0), [6, 6, 6]),
    (3, 12, "", 8, 4, (0.3, 0.3, 0.03), [5, 6, 6]),
    (0, 6, "2:a|9:b", 6, 5, (0.5, 0.08, 0.02), [2, 2, 2]),
]


@pytest.mark.parametrize("seed,block,constraints,answer_at,length,bars,forwards", CASES)
def test_prophet_rows_are_the_references_token_for_token(
    seed, block, constraints, answer_at, length, bars, forwards, monkeypatch
):
    steps, gen_length = 6, 12
    bb = LLaDA(model="random", temperature=0.0, block_length=block, seed=seed)
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
        )
        rows = seen[row_key(SEED, problem.id, "sample", (0,))]
        assert torch.equal(rows[-1], expected)
        assert len(rows) == ran == record["ledger"]["passes"]["denoise"]
        assert record["candidates"][0]["text"] == bb.decode(expected, len(prompt))
        taken.append(ran)
    if forwards is not None:
        assert taken == forwards
