"""Helpers for plugin authors' own tests: candidates, rows and pools built by hand, and a run
of one method on the toy task through the real engine.

    from dllmbench.testing import make_candidates, run_strategy

    chosen = MySelector().select(make_candidates(["4", None, "7", "4"]), rng=rng)
    records = run_strategy("beam:beam=2,width=2,every=4+majority", steps=16)

The toy task is the `toy_sum` double of `dllmbench.testing.doubles`: `a+b=` questions, a
character-level backbone that knows the answers and commits each position to the right
character with probability 0.85 (evenly over the T steps: `toy:spread=true`), and toy
scorers (a process scorer for every name, an outcome scorer for `orm`). A run takes
milliseconds and needs no model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dllmbench.core.schema import Record
from dllmbench.core.types import Candidate, Lineage, Pool, Problem, Rows
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum, intended

STEPS, GEN_LENGTH, PROBLEMS = 12, 5, 5
_UNSET: Any = object()


def make_candidate(
    index: int = 0,
    answer: str | None = None,
    *,
    text: str | None = None,
    answer_key: Any = _UNSET,
    lineage: Lineage | None = None,
    scores: Mapping[str, float] | None = None,
    weight: float | None = None,
) -> Candidate:
    """One `Candidate` as a selector sees it. By default its text is the answer, its
    `answer_key` the answer itself (`None`, invalid, when the answer is `None`) and its
    lineage `(index,)`."""
    return Candidate(
        index=index,
        text=(answer or "") if text is None else text,
        answer=answer,
        answer_key=answer if answer_key is _UNSET else answer_key,
        lineage=(index,) if lineage is None else tuple(lineage),
        scores=dict(scores or {}),
        weight=weight,
    )


def make_candidates(
    answers: Sequence[str | None],
    *,
    scores: Mapping[str, Sequence[float]] | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[Candidate, ...]:
    """A pool's candidates as a selector receives them (a tuple of read-only candidates):
    candidate i has answer `answers[i]`,
    `scores[name][i]` for each scorer name and weight `weights[i]`."""
    scores = dict(scores or {})
    for name, values in scores.items():
        if len(values) != len(answers):
            raise ValueError(f"scores[{name!r}] has {len(values)} values for {len(answers)}")
    if weights is not None and len(weights) != len(answers):
        raise ValueError(f"weights has {len(weights)} values for {len(answers)} answers")
    return tuple(
        make_candidate(
            i,
            answer,
            scores={name: float(values[i]) for name, values in scores.items()},
            weight=None if weights is None else float(weights[i]),
        )
        for i, answer in enumerate(answers)
    )


def make_rows(
    n: int,
    *,
    step: int = STEPS,
    problem: Problem | None = None,
    gen_length: int = GEN_LENGTH,
    seed: int = 0,
) -> Rows:
    """`n` rows of one toy problem (`3+4=` unless given), all at `step`, with lineage `(i,)`.
    At step 0 the generated positions are masks; at any later step they hold the toy
    model's intended answer (the sum, then end-of-sequence tokens)."""
    problem = problem or Problem("toy-0", "3+4=", 7)
    backbone = ToyBackbone()
    prompt = backbone.encode(ToySum().prompt(problem, "fewshot"))
    canvas = backbone.canvas(prompt, gen_length)
    if step > 0:
        canvas[len(prompt) :] = torch.tensor(intended(prompt, gen_length))
    return Rows(
        problem=problem,
        seed=seed,
        stream="sample",
        prompt_len=len(prompt),
        tokens=canvas.unsqueeze(0).repeat(n, 1),
        steps=(step,) * n,
        lineage=tuple((i,) for i in range(n)),
        owners=(("test",),) * n,
    )


def make_pool(
    size: int,
    *,
    scores: Mapping[str, Sequence[float]] | None = None,
    weights: Sequence[float] | None = None,
    info: dict[str, Any] | None = None,
    steps: int = STEPS,
) -> Pool:
    """A `Pool` of `size` final toy rows (see `make_rows`) with the given scores, weights
    and info, as `ops.pool` would return it at T = `steps`."""
    return Pool(
        make_rows(size, step=steps),
        {name: np.asarray(values, np.float64) for name, values in (scores or {}).items()},
        None if weights is None else np.asarray(weights, np.float64),
        dict(info or {}),
    )


def run_methods(
    methods: Sequence[Method],
    *,
    steps: int = STEPS,
    gen_length: int = GEN_LENGTH,
    problems: int = PROBLEMS,
    seed: int = 0,
    batch_rows: int = 64,
    backbone: Mapping[str, Any] | None = None,
) -> list[Record]:
    """Run built methods on the toy task through the real engine; one record per problem
    and method. Every scorer they name is a toy scorer (an outcome scorer for `orm`).
    `backbone`: options of the toy backbone (`{"threshold": 0.5}`: rows may end early)."""
    names = sorted({s for m in methods for s in m.scorers() if s != "weight"})
    task = ToySum(size=problems)
    engine = Engine(
        backbone=ToyBackbone(spread=True, **dict(backbone or {})),
        scorers={name: ToyScorer(partial=name != "orm") for name in names},
        task=task,
        methods=list(methods),
        sampling=Sampling(steps, gen_length, "fewshot", seed),
        capacity=Capacity(batch_rows=batch_rows, problems=3),
    )
    records = engine.run(task.problems("test"))
    recorded, recorded_flops = Counter[str](), Counter[str]()
    for record in records:
        recorded.update(record["ledger"]["passes"])
        recorded_flops.update(record["ledger"].get("flops", {}))
    if dict(recorded) != engine.ledger.passes() or dict(recorded_flops) != engine.ledger.flops():
        raise AssertionError(
            f"the records hold {dict(recorded)} passes and {dict(recorded_flops)} FLOPs, but "
            f"the ledger charged {engine.ledger.passes()} and {engine.ledger.flops()}"
        )
    return records


def run_strategy(
    spec: str,
    *,
    steps: int = STEPS,
    gen_length: int = GEN_LENGTH,
    problems: int = PROBLEMS,
    seed: int = 0,
    batch_rows: int = 64,
) -> list[Record]:
    """Run one method, written as on the command line (`strategy[:k=v,...][+selector[:k=v,...]]`,
    selector `first` when left out), on `problems` toy problems at T = `steps`; return its
    records (docs/results-schema.md), one per problem. The strategy and selector come from
    the registry, so yours must be installed or named in DLLMBENCH_PLUGIN_MODULES. Any
    contract breach the engine catches (the ledger check, a short pool) is raised."""
    method = Method.build(registry(), MethodSpec.parse(spec))
    return run_methods(
        [method],
        steps=steps,
        gen_length=gen_length,
        problems=problems,
        seed=seed,
        batch_rows=batch_rows,
    )
