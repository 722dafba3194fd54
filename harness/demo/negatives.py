"""Worked solutions with one slip: the demo ORM's synthetic negatives.

The tiny model's own samples are too few, and its mistakes too much its own, for an outcome
verifier to learn arithmetic from them alone. So the ORM also learns from train problems
written out twice: the worked solution (correct) and the same solution with one slip of the
kinds the model makes, carried forward as the model carries it (every later line is right
given the slip, so only the slip is wrong):

- a wrong result: a line's result off by a little (`4+4=10`), later lines computed from it;
- a copy slip: a line starting from a number other than the previous result;
- a final answer that is not the last line's result.

The label is whether the final answer still equals the problem's answer (a slip can cancel).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

LINE = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")


@dataclass
class Step:
    left: int
    op: str
    right: int
    result: int

    def text(self) -> str:
        return f"{self.left}{self.op}{self.right}={self.result}"


def apply(op: str, left: int, right: int) -> int:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    return left * right if op == "*" else left // right


def parse(solution: str) -> list[Step]:
    """The steps of an `arith` worked solution ("3+4=7\\n7*2=14\\n#### 14")."""
    steps = []
    for line in solution.split("\n")[:-1]:
        match = LINE.match(line)
        if match is None:
            raise ValueError(f"not an arith step: {line!r}")
        left, op, right, result = match.groups()
        steps.append(Step(int(left), op, int(right), int(result)))
    return steps


def carry(steps: list[Step], start: int) -> None:
    """Recompute steps[start:] from the value before them, keeping each line valid arith
    (a subtraction takes at most what there is, a division that no longer divides adds)."""
    for at in range(max(start, 1), len(steps)):
        steps[at].left = steps[at - 1].result
        settle(steps[at])


def settle(step: Step) -> None:
    """Make `step` valid arith again after its left side changed, and recompute it."""
    if step.op == "-":
        step.right = min(step.right, step.left)
    if step.op == "/" and (step.right == 0 or step.left % step.right):
        step.op = "+"
    step.result = apply(step.op, step.left, step.right)


def slip(solution: str, rng: random.Random) -> tuple[str, int]:
    """`solution` with one slip carried forward: (text, its final answer)."""
    steps = parse(solution)
    at = rng.randrange(len(steps))
    kind = rng.random()
    if kind < 0.7:  # a wrong result
        right = steps[at].result
        near = [right + d for d in (-3, -2, -1, 1, 2, 3, 10, -10) if right + d >= 0]
        steps[at].result = rng.choice(near)
        carry(steps, at + 1)
        final = steps[-1].result
    elif kind < 0.85 and len(steps) > 1:  # a copy slip
        at = max(at, 1)
        left = steps[at].left
        steps[at].left = rng.choice([left + d for d in (-2, -1, 1, 2) if left + d >= 0])
        settle(steps[at])
        carry(steps, at + 1)
        final = steps[-1].result
    else:  # a final answer that is not the last result
        final = abs(steps[-1].result + rng.choice((-2, -1, 1, 2, 10)))
        if final == steps[-1].result:
            final += 1
    text = "\n".join([*(s.text() for s in steps), f"#### {final}"])
    return text, final
