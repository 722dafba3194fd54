"""Answer extraction is linear in the text: a generation built to make a pattern backtrack
(64k blank lines in a code block, a fence with no line after it, markers repeated) is read
in milliseconds by every task, never in the seconds to minutes a quadratic scan takes."""

from __future__ import annotations

import random
import re
import time

import pytest

from dllmbench.loading.registry import registry
from dllmbench.tasks.mbpp import _DEFINES, fenced_block, fences

SIZE = 64_000
# far above what a linear scan of SIZE characters takes on a slow machine, far below what a
# quadratic one does (64k blank lines in a fence took 45 s)
BOUND_S = 2.0
PIECES = (
    "\n",
    " ",
    " \n",
    "```",
    "`",
    "####",
    "answer is ",
    "The final answer is",
    "\\boxed{",
    "{",
    "}",
    "$",
    "-",
    "1,",
    "1.",
    ".",
    "\\",
    "def ",
    "\\frac{",
    "(",
    "[DONE]",
    "[BEGIN]",
    "\\$ ",
)


def adversarial(piece: str) -> list[str]:
    run = piece * (SIZE // len(piece))
    return [run, "```python\n" + run, "```" + run, run + "\nx = 1\n```", run + " answer is 5"]


@pytest.mark.parametrize("name", ["arith", "gsm8k", "math500", "mbpp", "humaneval"])
def test_every_task_extracts_in_time_linear_in_the_text(name):
    task = registry().task(name)
    for piece in PIECES:
        for text in adversarial(piece):
            start = time.perf_counter()
            task.extract(text)
            seconds = time.perf_counter() - start
            assert seconds < BOUND_S, (name, piece, seconds)


# the expressions the one-pass reader replaced, for the equivalence below
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
DEFINES = re.compile(r"^\s*(?:def|class|import|from)\s", re.MULTILINE)


def test_the_one_pass_reader_finds_the_blocks_the_expression_found():
    rng = random.Random(0)
    alphabet = ["`", "```", "\n", " ", "\t", "python", "py", "def ", "x", "import ", "\r", "\f"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert fences(text) == FENCE.findall(text), repr(text)
        assert bool(_DEFINES.search(text)) == bool(DEFINES.search(text)), repr(text)
    assert fenced_block("Here:\n```python\ndef f():\n    return 1\n```\nok") == (
        "def f():\n    return 1"
    )
    assert fenced_block("```\n\n\nx = 2\n\n") == "x = 2"  # an unclosed fence runs to the end
    assert fenced_block("``` no newline") is None
