"""The demo ORM's synthetic negatives: a worked solution with exactly one slip, carried forward."""

from __future__ import annotations

import random

import pytest

from dllmbench.demo.negatives import apply, parse, slip
from dllmbench.tasks.arith import Arith


def wrong_lines(text: str) -> list[int]:
    """Indices of the lines whose arithmetic is wrong, and -1 when the final answer is not the
    last line's result."""
    steps = parse(text)
    bad = [i for i, s in enumerate(steps) if apply(s.op, s.left, s.right) != s.result]
    final = int(text.rsplit("#### ", 1)[1])
    return bad + ([-1] if final != steps[-1].result else [])


def copy_slips(text: str) -> list[int]:
    steps = parse(text)
    return [i for i in range(1, len(steps)) if steps[i].left != steps[i - 1].result]


@pytest.mark.parametrize("config", [{}, {"min_steps": 2, "max_steps": 3}, {"max_steps": 1}])
def test_every_slip_is_one_slip_of_a_valid_solution(config):
    task = Arith(**config)
    rng = random.Random(0)
    kinds = {"result": 0, "copy": 0, "final": 0}
    for example in task.examples("train", 0, 400):
        assert wrong_lines(example.solution) == [] and copy_slips(example.solution) == []
        text, answer = slip(example.solution, rng)
        assert text != example.solution
        assert text.endswith(f"#### {answer}")
        steps = parse(text)
        assert len(steps) == len(parse(example.solution))
        assert all(s.left >= 0 and s.right >= 0 and s.result >= 0 for s in steps)
        wrong, copies = wrong_lines(text), copy_slips(text)
        assert len(wrong) + len(copies) == 1, (example.solution, text)  # exactly one slip
        if copies:
            kinds["copy"] += 1
        elif wrong == [-1]:
            kinds["final"] += 1
        else:
            kinds["result"] += 1
    assert kinds["result"] > kinds["final"] > 0
    assert (kinds["copy"] > 0) == (task.config.max_steps > 1)


def test_a_slip_is_labelled_by_its_final_answer():
    """A slip can cancel (a wrong result that a later division rounds away): the label is
    whether the final answer still equals the problem's."""
    rng = random.Random(1)
    task = Arith(min_steps=2, max_steps=3)
    outcomes = set()
    for example in task.examples("train", 0, 2000):
        _, answer = slip(example.solution, rng)
        outcomes.add(answer == example.answer)
    assert False in outcomes
