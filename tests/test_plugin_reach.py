"""What a strategy plugin can reach: never a problem's answer. This module is itself a plugin
(`registry_with`)."""

from __future__ import annotations

import json

from conftest import toy_argv

from dllmbench.api.hookspecs import hookimpl

SEEN: list[object] = []


class PeeksAtTheAnswer:
    """Majority@2 that looks for the answer everywhere a strategy is handed the problem."""

    scorers = ()
    prefix_field = None

    def __init__(self, **config):
        pass

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": 2 * total_steps}

    def pool_size(self) -> int:
        return 2

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=2)
        SEEN.extend([problem.gold, ops.problem.gold, rows.problem.gold])
        rows = await ops.denoise(rows)
        SEEN.append(rows.problem.gold)
        return ops.pool(rows)


@hookimpl
def dllmbench_register_strategies(register):
    register("peeks_at_the_answer", PeeksAtTheAnswer)


def test_a_strategy_never_sees_the_answer_and_its_answers_are_still_graded(
    tmp_path, cli, registry_with
):
    registry_with(__name__)
    SEEN.clear()
    argv = [*toy_argv(4), "--methods", "orm_rerank,prm_rerank", "--method", "peeks_at_the_answer+majority"]
    result = cli(*argv, "--budget", 16, "--out", tmp_path / "r", "--json")
    assert result.code == 0, result.err
    assert len(SEEN) == 4 * 4 and all(gold is None for gold in SEEN)
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    peeked = [r for r in records if r["method"].startswith("peeks")]
    assert len(peeked) == 4 and any(r["correct"] for r in records)
    assert all(isinstance(r["correct"], bool) for r in peeked)
