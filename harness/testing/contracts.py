"""Contract checks every plugin must pass, parametrised over every registered plugin.

Run them on every installed plugin with `pytest --pyargs dllmbench.testing.contracts`;
`-k NAME` selects your plugin's checks (built-ins always load; DLLMBENCH_PLUGINS=your-dist
leaves out other third-party packages). A factory may carry `contract_configs`, a list of
configurations to check (default: one, the defaults). Backbone, scorer and task checks run
over the registered ones; set DLLMBENCH_PLUGIN_MODULES=dllmbench.testing.doubles to include
the doubles as well.

Strategies and selectors run through the real engine on the deterministic doubles of
`dllmbench.testing.doubles`; backbones, scorers and tasks are checked through their own
interfaces.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from dllmbench.engine import Engine, Limits, Sampling
from dllmbench.interfaces import ScoreBatch, StepBatch
from dllmbench.keys import row_key
from dllmbench.method import Method, MethodSpec
from dllmbench.registry import describe, registry
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum
from dllmbench.types import Candidate, Prompt

STEPS, GEN_LENGTH, PROBLEMS = 12, 5, 5


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what legitimately varies between runs (timings, batch counts)."""
    out = {k: v for k, v in record.items() if k != "ledger"}
    out["passes"] = record["ledger"]["passes"]
    return out


def run_methods(
    methods: list[Method],
    *,
    batch_rows: int = 64,
    problems: int = PROBLEMS,
    steps: int = STEPS,
    seed: int = 0,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Run methods on the toy task; every scorer they name is a toy scorer."""
    names = sorted({s for m in methods for s in m.scorers() if s != "weight"})
    scorers = {name: ToyScorer(partial=name != "orm") for name in names}
    task = ToySum(size=problems)
    engine = Engine(
        backbone=ToyBackbone(),
        scorers=scorers,
        task=task,
        methods=methods,
        sampling=Sampling(steps, GEN_LENGTH, "fewshot", seed),
        limits=Limits(batch_rows=batch_rows, problems=3),
    )
    records = engine.run(task.problems("test"))
    return {(r["problem"], r["method"]): comparable(r) for r in records}


def _method(
    strategy: str,
    config: dict[str, Any],
    selector: str = "first",
    selector_config: dict[str, Any] | None = None,
) -> Method:
    return Method.build(
        registry(), MethodSpec(strategy, dict(config), selector, dict(selector_config or {}))
    )


def _roundtrip(kind: str, name: str, obj: Any) -> None:
    config = json.loads(json.dumps(describe(obj)))
    rebuilt = registry().build(kind, name, **config)
    assert describe(rebuilt) == describe(obj), f"{kind} {name}: configuration does not round-trip"


# -- strategies ------------------------------------------------------------------------------


def test_strategy_spends_what_it_declares(dllmbench_strategy):
    name, config = dllmbench_strategy
    method = _method(name, config)
    records = run_methods([method])  # the engine raises CostMismatch on any difference
    declared = method.cost(STEPS)
    for record in records.values():
        assert record["passes"] == declared
    assert len(records) == PROBLEMS


def test_strategy_same_seed_same_result(dllmbench_strategy):
    name, config = dllmbench_strategy
    assert run_methods([_method(name, config)]) == run_methods([_method(name, config)])
    other = run_methods([_method(name, config)], seed=1)
    assert other.keys() == run_methods([_method(name, config)]).keys()


def test_strategy_independent_of_batch_size(dllmbench_strategy):
    name, config = dllmbench_strategy
    results = [run_methods([_method(name, config)], batch_rows=b) for b in (1, 7, 64)]
    assert results[0] == results[1] == results[2]


def test_strategy_independent_of_other_methods(dllmbench_strategy):
    name, config = dllmbench_strategy
    alone = run_methods([_method(name, config)])
    others = [
        _method("independent", {"n": 3}, "majority"),
        _method("prm_guided", {"k": 4, "every": 5}, "first"),
    ]
    mine = _method(name, config)
    together = run_methods([*(m for m in others if m.id != mine.id), mine])
    assert {k: v for k, v in together.items() if k in alone} == alone


def test_strategy_config_roundtrips(dllmbench_strategy):
    name, config = dllmbench_strategy
    _roundtrip("strategy", name, registry().strategy(name, **config))


def test_strategy_prefix_pools_nest(dllmbench_strategy):
    name, config = dllmbench_strategy
    strategy = registry().strategy(name, **config)
    field = strategy.prefix_field
    if field is None:
        assert strategy.prefix_field is None  # the strategy makes no nesting claim to check
        return
    size = describe(strategy)[field]
    small = run_methods([_method(name, {**config, field: size})])
    large = run_methods([_method(name, {**config, field: size + 2})])
    for (pid, _), rec in small.items():
        big = next(v for (p, _), v in large.items() if p == pid)
        assert rec["candidates"] == big["candidates"][:size]


# -- selectors -------------------------------------------------------------------------------


def _candidates() -> list[Candidate]:
    answers = ["4", None, "7", "4", "9"]
    return [
        Candidate(
            i,
            a or "",
            a,
            None if a is None else int(a),
            (i,),
            {"orm": float(i % 3), "prm": float(-i)},
            1.0 / (i + 1),
        )
        for i, a in enumerate(answers)
    ]


def test_selector_declares_its_kind(dllmbench_selector):
    name, config = dllmbench_selector
    selector = registry().selector(name, **config)
    assert isinstance(selector.ceiling, bool)
    assert all(isinstance(s, str) for s in selector.needs)


def test_selector_never_needs_labels_unless_ceiling(dllmbench_selector):
    name, config = dllmbench_selector
    selector = registry().selector(name, **config)
    if selector.ceiling:
        labels = [False, False, True, False, True]
        chosen = selector.select(_candidates(), rng=np.random.default_rng(0), labels=labels)
        assert chosen is not None and 0 <= chosen < 5
        return
    chosen = selector.select(_candidates(), rng=np.random.default_rng(0), labels=None)
    assert chosen is None or 0 <= chosen < 5


def test_selector_deterministic_and_costed(dllmbench_selector):
    name, config = dllmbench_selector
    selector = registry().selector(name, **config)
    strategy = "smc" if "weight" in describe(selector).values() else "independent"
    sconf = {"k": 4, "every": 6} if strategy == "smc" else {"n": 4}
    method = _method(strategy, sconf, name, config)
    first = run_methods([method])  # the ledger check covers the selector's scoring
    assert first == run_methods([_method(strategy, sconf, name, config)])
    for record in first.values():
        assert record["passes"] == method.cost(STEPS)


def test_selector_config_roundtrips(dllmbench_selector):
    name, config = dllmbench_selector
    _roundtrip("selector", name, registry().selector(name, **config))


# -- backbones -------------------------------------------------------------------------------


def _canvases(backbone: Any, n: int) -> list[tuple[torch.Tensor, int]]:
    task = ToySum(size=n)
    out = []
    for problem in task.problems("test"):
        ids = backbone.encode(Prompt(text=problem.question))
        out.append((backbone.canvas(ids, GEN_LENGTH), len(ids)))
    return out


def _step(backbone: Any, rows: list[tuple[torch.Tensor, int, int, int]]) -> list[torch.Tensor]:
    return backbone.denoise_step(
        StepBatch(
            tokens=[r[0] for r in rows],
            prompt_lens=[r[1] for r in rows],
            steps=[r[2] for r in rows],
            keys=[r[3] for r in rows],
            total_steps=STEPS,
        )
    )


def test_backbone_canvas_is_prompt_then_masks(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = registry().backbone(name, **config)
    for canvas, plen in _canvases(backbone, 3):
        assert canvas.dim() == 1 and canvas.dtype == torch.long
        assert (canvas[plen:] == backbone.mask_id).all() and len(canvas) == plen + GEN_LENGTH


def test_backbone_row_alone_equals_row_in_batch(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = registry().backbone(name, **config)
    rows = [
        (c, p, i % STEPS, row_key(0, f"p{i}", "sample", (i,)))
        for i, (c, p) in enumerate(_canvases(backbone, 6))
    ]
    batched = _step(backbone, rows)
    for row, out in zip(rows, batched, strict=True):
        assert torch.equal(_step(backbone, [row])[0], out)
        assert torch.equal(_step(backbone, [row])[0], out)  # and again: no hidden state


def test_backbone_trajectory_ends_decodable(dllmbench_backbone):
    name, config = dllmbench_backbone
    backbone = registry().backbone(name, **config)
    canvas, plen = _canvases(backbone, 1)[0]
    key = row_key(0, "p", "sample", (0,))
    for t in range(STEPS):
        canvas = _step(backbone, [(canvas, plen, t, key)])[0]
    assert isinstance(backbone.decode(canvas, plen), str)


# -- scorers ---------------------------------------------------------------------------------


def test_scorer_returns_one_finite_float_per_row(dllmbench_scorer):
    name, config = dllmbench_scorer
    # a scorer that reads a model names the backbone to check it on: (name, config)
    spec = getattr(registry().info("scorer", name).factory, "contract_backbone", None)
    backbone = registry().backbone(spec[0], **spec[1]) if spec else ToyBackbone()
    scorer = registry().scorer(name, shared={"backbone": backbone}, **config)
    canvases = _canvases(backbone, 4)
    batch = ScoreBatch([c for c, _ in canvases], [p for _, p in canvases], [0] * 4, STEPS)
    values = np.asarray(scorer.score(batch))
    assert values.shape == (4,) and np.isfinite(values).all()
    single = [
        float(np.asarray(scorer.score(ScoreBatch([c], [p], [0], STEPS)))[0]) for c, p in canvases
    ]
    np.testing.assert_allclose(values, single, rtol=1e-5, atol=1e-6)
    assert isinstance(scorer.reads_partial, bool)


# -- tasks -----------------------------------------------------------------------------------


def test_task_problems_are_well_formed(dllmbench_task):
    name, config = dllmbench_task
    task = registry().task(name, **config)
    splits = task.splits()
    assert splits, f"task {name} has no splits"
    for split, size in splits.items():
        problems = task.problems(split)
        assert len(problems) == size
        assert len({p.id for p in problems}) == size, "problem ids must be unique"
    problem = task.problems(next(iter(splits)))[0]
    for style in ("chat", "fewshot"):
        assert isinstance(task.prompt(problem, style), Prompt)
    assert task.grade(problem, None, "") is False
    assert task.extract("") is None


def test_task_grade_many_agrees_with_grade(dllmbench_task):
    """`grade_many`, which the engine uses for a whole pool when a task has it, must give
    `grade`'s verdicts in order: for no answer, a likely wrong one and the gold one (when the
    gold is an answer string)."""
    name, config = dllmbench_task
    task = registry().task(name, **config)
    if not hasattr(task, "grade_many"):
        pytest.skip(f"task {name} has no grade_many; the engine calls grade")
    problems = task.problems(next(iter(task.splits())))[:2]
    items = [
        (p, a, a or "")
        for p in problems
        for a in ((None, "0", p.gold) if isinstance(p.gold, str) else (None, "0"))
    ]
    assert list(task.grade_many(items)) == [task.grade(*item) for item in items]
