"""FLOPs per pass at a run's reference row: what the planner converts passes into FLOPs with.

A FLOP budget is per problem, and what one pass costs depends on the row: its prompt's
length, the canvas, the model. The planner prices every kind of pass at the *reference row*:
the mean prompt length of the run's problems (as the backbone encodes them) followed by the
fully masked canvas. A denoising pass is priced as the backbone's first step on that row (its
`step_work`, else a bidirectional forward with the head at every position): every generated
position is masked there, so the price is an upper bound of a later step's. A backbone whose
steps differ in cost along a row (a KV cache, `PricesSteps`) prices a pass as the mean over a
whole row that no step ends early: T passes at that price bound the row's FLOPs. A scoring
pass is priced as the scorer's forward over the same row written out in text (`written`).
The ledger charges each forward's own FLOPs as it happens; the plan's FLOPs are a price, not
a charge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllmbench.api.interfaces import (
    Backbone,
    CountsScoreWork,
    CountsStepWork,
    PricesSteps,
    ScoreBatch,
    Scorer,
    StepBatch,
    Task,
    model_shape,
    passes_per_step,
    positions,
)
from dllmbench.core.errors import UserError
from dllmbench.core.flops import Work, flops
from dllmbench.core.types import Problem
from dllmbench.loading.provenance import Origins


@dataclass(frozen=True)
class Reference:
    """The row a plan prices passes at: its prompt and canvas lengths, and the FLOPs of one
    pass by kind (absent: a model whose shape is unknown)."""

    prompt_tokens: int
    gen_length: int
    rates: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "gen_length": self.gen_length,
            "rates": dict(self.rates),
        }


def reference(
    backbone: Backbone,
    scorers: Mapping[str, Scorer],
    task: Task,
    problems: Sequence[Problem],
    prompt_style: str,
    gen_length: int,
    total_steps: int,
    origins: Origins | None = None,
) -> Reference:
    """The reference row of a run's problems, and the FLOPs of one pass of each kind there.
    What a plugin raises or returns wrongly here is its own fault, named by `origins`."""
    origins = origins or Origins()
    encoded = prompts_fit(backbone, task, problems, prompt_style, gen_length, origins)
    lengths = [len(ids) for ids in encoded]
    prompt = round(sum(lengths) / len(lengths)) if lengths else 0
    rates: dict[str, int] = {}
    shape = model_shape(backbone)
    with origins.blame("backbone", origins.backbone):
        canvas = check_canvas(backbone.canvas([0] * prompt, gen_length), origins)
        if shape is not None:
            if isinstance(backbone, PricesSteps):
                works = list(backbone.row_works(canvas, prompt, total_steps))
            elif isinstance(backbone, CountsStepWork):
                step = StepBatch([canvas], [prompt], [0], [0], total_steps)
                works = list(backbone.step_work(step))[:1]
            else:
                works = [Work.full(len(canvas))]
    if shape is not None:
        if not works or not all(isinstance(w, Work) for w in works):
            what = f"priced a denoising step with {works!r}: a list of Work"
            raise origins.violation("backbone", origins.backbone, what)
        over = total_steps if isinstance(backbone, PricesSteps) else 1  # a row's T, or 1 step
        mean = -(-sum(flops(shape, w) for w in works) // over)
        if mean <= 0:
            what = (
                f"priced a denoising step of its {shape.params}-parameter model at {mean} "
                "FLOPs: a forward computes at least its query tokens"
            )
            raise origins.violation("backbone", origins.backbone, what)
        rates["denoise"] = passes_per_step(backbone) * mean
    finished = canvas.clone()
    stops = set(getattr(backbone, "stop_ids", ()))
    text = [[t for t in ids if t not in stops] for ids in encoded]
    finished[prompt:] = written(text, len(canvas) - prompt)  # a final state of real text
    for name, scorer in scorers.items():
        shape = model_shape(scorer)
        if shape is None:
            continue
        if isinstance(scorer, CountsScoreWork):
            batch = ScoreBatch([finished], [prompt], [total_steps], total_steps)
            with origins.blame("scorer", origins.scorer(name)):
                work = scorer.score_work(batch)[0]
            if not isinstance(work, Work):
                what = f"score_work() returned {work!r} for a row: one Work per row"
                raise origins.violation("scorer", origins.scorer(name), what)
        else:
            work = Work.full(len(finished), head=1)
        rates[f"score:{name}"] = flops(shape, work)
    return Reference(prompt, gen_length, rates)


def described(value: object) -> str:
    """What a plugin returned, in a few words: a tensor's shape and dtype, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def check_canvas(canvas: Any, origins: Origins) -> torch.Tensor:
    """A backbone's canvas, which is a 1-D long tensor, else its broken contract."""
    if not (isinstance(canvas, torch.Tensor) and canvas.dim() == 1 and canvas.dtype == torch.long):
        what = f"canvas() gave {described(canvas)}; return a 1-D long tensor"
        raise origins.violation("backbone", origins.backbone, what)
    return canvas


def prompts_fit(
    backbone: Backbone,
    task: Task,
    problems: Sequence[Problem],
    prompt_style: str,
    gen: int,
    origins: Origins | None = None,
) -> list[list[int]]:
    """Every problem's prompt, encoded: with the canvas, each must fit the backbone's
    positions (`KnowsPositions`), else one line before any forward, instead of a run (or a
    collection) over positions the model never learned (the tiny models have 256: a GSM8K
    prompt of eight shots is over 1,000)."""
    origins = origins or Origins()
    with origins.blame("task", origins.task):
        prompts = [task.prompt(p, prompt_style) for p in problems]
    with origins.blame("backbone", origins.backbone):
        encoded = [list(backbone.encode(prompt)) for prompt in prompts]
    lengths = [len(ids) for ids in encoded]
    limit = positions(getattr(backbone, "config", None))
    longest = max(lengths, default=0)
    if limit is not None and longest + gen > limit:
        problem = problems[lengths.index(longest)].id
        raise UserError(
            f"the prompt of problem {problem!r} ({longest} tokens) and the canvas ({gen}) do "
            f"not fit the backbone's {limit} positions; give a shorter prompt (fewer shots, "
            "another --prompt), a shorter --gen-length, or a model with more positions"
        )
    return encoded


def written(encoded: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """`width` tokens of text, nothing masked and no end token: the longest prompt's tokens
    (end tokens left out) over and over. A scorer that reads the answer as text
    (self-verification asks about the decoded answer) reads about as many tokens again, so its
    price is that of an answer that fills the canvas, not of an empty one."""
    text = max(encoded, key=len, default=[]) or [0]
    return torch.tensor([text[i % len(text)] for i in range(width)], dtype=torch.long)
