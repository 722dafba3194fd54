"""Built-in strategies: declared cost equals passes spent; guided search keeps the best."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from dllmbench.api.interfaces import ScoreBatch
from dllmbench.api.ops import segments
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.strategies.ranking import top
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum


class Recording(ToyScorer):
    """A toy PRM that remembers every score it gave, by prompt and step."""

    def __init__(self):
        super().__init__()
        self.calls: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = defaultdict(list)

    def score(self, batch: ScoreBatch) -> np.ndarray:
        values = super().score(batch)
        for tokens, plen, step, v in zip(
            batch.tokens, batch.prompt_lens, batch.steps, values, strict=True
        ):
            self.calls[tuple(tokens[:plen].tolist())].append((step, v))
        return values


def run(spec: str, T: int, problems: int = 2, scorer=None, gen: int = 4):
    task = ToySum(size=problems)
    method = Method.build(registry(), MethodSpec.parse(spec), "m")
    engine = Engine(
        backbone=ToyBackbone(),
        scorers={"prm": scorer or ToyScorer()},
        task=task,
        methods=[method],
        sampling=Sampling(T, gen, "fewshot", 0),
        capacity=Capacity(batch_rows=256, problems=problems),
    )
    return method, engine.run(task.problems("test")), engine


@pytest.mark.parametrize(
    "k,b,m,T,final",
    [
        (8, 64, 1, 128, "prune"),
        (8, 48, 1, 128, "prune"),
        (8, 16, 1, 128, "prune"),
        (8, 48, 2, 128, "prune"),
        (8, 16, 4, 128, "keep"),
        (4, 64, 2, 128, "keep"),
        (6, 7, 3, 20, "prune"),
        (3, 5, 1, 12, "keep"),
    ],
)
def test_prm_guided_cost_formula_matches_passes_spent(k, b, m, T, final):
    spec = f"prm_guided:k={k},every={b},keep={m},final={final}+first"
    method, records, engine = run(spec, T)
    declared = {"denoise": k * T, "score:prm": k * math.ceil(T / b)}
    assert method.cost(T) == declared
    for record in records:
        assert record["ledger"]["passes"] == declared
        assert len(record["candidates"]) == (k if final == "keep" else 1)
    # physically: every row-step was one row of some forward
    assert engine.ledger.physical()["denoise"]["rows"] == 2 * k * T


@pytest.mark.parametrize("b,per_k", [(64, 130), (48, 131), (16, 136)])
def test_prm_guided_cost_at_T128(b, per_k):
    strategy = registry().strategy("prm_guided", k=8, every=b)
    assert sum(strategy.cost(128).values()) == 8 * per_k


@pytest.mark.parametrize("k,b,T", [(8, 64, 128), (4, 48, 128), (6, 16, 64), (5, 7, 20)])
def test_smc_cost_formula_matches_passes_spent(k, b, T):
    method, records, _ = run(f"smc:k={k},every={b}+weighted_majority:by=weight", T)
    declared = {"denoise": k * T, "score:prm": k * math.ceil(T / b)}
    assert method.cost(T) == declared
    assert all(r["ledger"]["passes"] == declared for r in records)


@pytest.mark.parametrize("n,T", [(1, 128), (3, 17), (8, 128)])
def test_independent_cost_formula_matches_passes_spent(n, T):
    method, records, _ = run(f"independent:n={n}+first", T)
    assert method.cost(T) == {"denoise": n * T}
    assert all(r["ledger"]["passes"] == {"denoise": n * T} for r in records)


def test_segments_cover_T_with_a_shorter_last_one():
    assert segments(128, 64) == [64, 64]
    assert segments(128, 48) == [48, 48, 32]
    assert segments(128, 16) == [16] * 8
    assert segments(10, 20) == [10]
    assert sum(segments(127, 5)) == 127


def test_top_is_stable_descending_and_rejects_nan():
    assert top(np.array([0.1, 0.9, 0.9, 0.5]), 2).tolist() == [1, 2]
    with pytest.raises(ValueError):
        top(np.array([0.1, np.nan]), 1)


@pytest.mark.parametrize("keep", [1, 2, 4])
def test_guided_search_keeps_the_best_children_each_segment(keep):
    k, b, T = 8, 6, 12
    scorer = Recording()
    # 12 generated positions: no two children are the same row at step b, so every child's
    # score is its own (the engine scores identical rows once)
    _, records, _ = run(
        f"prm_guided:k={k},every={b},keep={keep},final=keep+first",
        T,
        problems=3,
        scorer=scorer,
        gen=12,
    )
    assert len(scorer.calls) == 3
    for record in records:
        # this record's prompt is the one whose final scores are its candidates' scores
        finals = [c["scores"]["prm"] for c in record["candidates"]]
        calls = next(
            c
            for c in scorer.calls.values()
            if {round(float(v), 9) for s, v in c if s == T} == {round(v, 9) for v in finals}
        )
        first = np.array([v for step, v in calls if step == b])
        assert len(first) == k
        survivors = set(top(first, keep).tolist())
        # children of segment 2 descend from the survivors: lineage (survivor, child)
        assert {c["lineage"][0] for c in record["candidates"]} == survivors
        assert all(len(c["lineage"]) == 2 for c in record["candidates"])
        per_survivor = defaultdict(int)
        for c in record["candidates"]:
            per_survivor[c["lineage"][0]] += 1
        assert set(per_survivor.values()) == {k // keep}


def test_guided_prune_returns_the_argmax_of_the_last_segment():
    scorer = Recording()
    _, records, _ = run("prm_guided:k=8,every=6+first", 12, problems=3, scorer=scorer)
    last_maxima = sorted(max(v for s, v in calls if s == 12) for calls in scorer.calls.values())
    chosen = sorted(r["candidates"][0]["scores"]["prm"] for r in records)
    assert np.allclose(chosen, last_maxima)


@pytest.mark.parametrize("keep,final", [(1, "keep"), (2, "prune")])
def test_guided_info_records_each_segment(keep, final):
    """info: per segment the step, each child's mask ratio, score and parent, and the kept."""
    k, b, T = 8, 6, 12
    scorer = Recording()
    _, records, _ = run(
        f"prm_guided:k={k},every={b},keep={keep},final={final}+first",
        T,
        problems=2,
        scorer=scorer,
        gen=12,
    )
    for record in records:
        info = record["info"]
        assert info["step"] == [b, T]
        # the toy commits ⌈masked / steps left⌉ per step: one of 12 per step, 6 left at step 6
        assert info["mask"] == [[0.5] * k, [0.0] * k]
        calls = next(
            c
            for c in scorer.calls.values()
            if sorted(round(float(v), 6) for s, v in c if s == b) == sorted(info["scores"][0])
        )
        first = np.array([v for step, v in calls if step == b])
        assert info["scores"][0] == [round(float(v), 6) for v in first]
        assert info["kept"][0] == top(first, keep).tolist()
        assert info["parent"] == [[-1] * k, np.repeat(info["kept"][0], k // keep).tolist()]
        last = np.array(info["scores"][1])
        kept = list(range(k)) if final == "keep" else [int(np.argmax(last))]
        assert info["kept"][1] == kept
        assert [c["scores"]["prm"] for c in record["candidates"]] == pytest.approx(
            last[kept].tolist(), abs=1e-6
        )
