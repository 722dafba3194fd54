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


class ForgesScores:
    """Writes a score of its own into every candidate (past the read-only dict) and picks the
    last candidate."""

    needs = ("orm",)
    ceiling = False

    def __init__(self, **config):
        pass

    def select(self, candidates, *, rng, labels=None):
        for c in candidates:
            dict.__setitem__(c.scores, "orm", 99.0)
            object.__setattr__(c, "answer", "forged")
        return len(candidates) - 1


@hookimpl
def dllmbench_register_selectors(register):
    register("forges_scores", ForgesScores)


def test_a_strategy_never_sees_the_answer_and_its_answers_are_still_graded(
    tmp_path, cli, registry_with
):
    registry_with(__name__)
    SEEN.clear()
    argv = [
        *toy_argv(4),
        "--methods",
        "orm_rerank,prm_rerank",
        "--method",
        "peeks_at_the_answer+majority",
    ]
    result = cli(*argv, "--budget", 16, "--out", tmp_path / "r", "--json")
    assert result.code == 0, result.err
    assert len(SEEN) == 4 * 4 and all(gold is None for gold in SEEN)
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    peeked = [r for r in records if r["method"].startswith("peeks")]
    assert len(peeked) == 4 and any(r["correct"] for r in records)
    assert all(isinstance(r["correct"], bool) for r in peeked)


def test_what_a_selector_does_to_its_candidates_never_reaches_the_record(
    tmp_path, cli, registry_with
):
    """The forging selector shares ORM Rerank@4's pool (the same rows, the same ORM scores):
    its records show the pool's true scores and answers, and only its choice is its own."""
    registry_with(__name__)
    argv = [*toy_argv(3), "--methods", "orm_rerank,prm_rerank"]
    argv += ["--method", "independent:n=4+forges_scores", "--budget", 36]
    result = cli(*argv, "--out", tmp_path / "r")
    assert result.code == 0, result.err
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    honest = {r["problem"]: r for r in records if r["method"] == "ORM Rerank@4"}
    forged = [r for r in records if "Rerank" not in r["method"]]
    assert len(honest) == len(forged) == 3
    for r in forged:
        same = honest[r["problem"]]["candidates"]
        assert [c["scores"] for c in r["candidates"]] == [c["scores"] for c in same]
        assert all(c["scores"]["orm"] != 99.0 for c in r["candidates"])
        assert [c["answer"] for c in r["candidates"]] == [c["answer"] for c in same]
        assert r["selected"] == 3 and r["answer"] == same[3]["answer"] != "forged"
