"""arith: synthetic GSM-style word problems, small enough for a tiny model to learn.

Each problem has one to three arithmetic steps (`min_steps` to `max_steps`) over small integers,
in a small vocabulary:

    Tom has 3 apples. He buys 4 more. How many apples does he have now?
    3+4=7
    #### 7

Problems come from a seed. The test split is a fixed list (`test_size` distinct questions);
the train split is a stream that never repeats a test question: `examples("train", start, n)`
gives any stretch of it (it is unlimited), `splits()` reports `train_size` of it. Answers are
nonnegative integers; extraction is gsm8k's strict extractor.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Prompt
from dllmbench.tasks.numeric import extract_strict, number_key, same_number

NAMES = (("Tom", "he", "his"), ("Ann", "she", "her"), ("Sam", "he", "his"), ("Mia", "she", "her"))
ITEMS = ("apples", "pens", "books", "cards", "eggs", "balls")


@dataclass(frozen=True)
class Example:
    """One generated problem: question, worked solution (ending `#### N`) and answer."""

    question: str
    solution: str
    answer: int


def format_example(question: str, solution: str | None = None) -> str:
    """The plain-text format of the `fewshot` prompt: "Question: …\\nAnswer: …"."""
    head = f"Question: {question}\nAnswer:"
    return head if solution is None else f"{head} {solution}"


def generate(
    rng: random.Random,
    max_steps: int,
    max_start: int = 10,
    max_operand: int = 5,
    min_steps: int = 1,
) -> Example:
    """A problem of min_steps..max_steps steps; every intermediate value is a nonnegative
    integer.

    The first value is at most `max_start`; a term added or taken away is at most
    `max_operand`; multiplying is by 2 or 3 (up to 50 before it), dividing by 2 to 5 exactly.
    """
    name, he, _his = rng.choice(NAMES)
    other = rng.choice([n for n, _, _ in NAMES if n != name])
    items = rng.choice(ITEMS)
    value = rng.randint(1, max_start)
    sentences = [f"{name} has {value} {items}."]
    lines = []
    for _ in range(rng.randint(min_steps, max_steps)):
        ops = ["+"] + (["-"] if value >= 1 else []) + (["*"] if 1 <= value <= 50 else [])
        divisors = [d for d in (2, 3, 4, 5) if value % d == 0 and value > d]
        if divisors:
            ops.append("/")
        op = rng.choice(ops)
        if op == "+":
            b = rng.randint(1, max_operand)
            verb = rng.choice(("buys", "finds", "gets"))
            sentences.append(f"{he.capitalize()} {verb} {b} more.")
            new = value + b
        elif op == "-":
            b = rng.randint(1, min(value, max_operand))
            verb = rng.choice((f"gives {b} to {other}", f"loses {b}", f"sells {b}"))
            sentences.append(f"{he.capitalize()} {verb}.")
            new = value - b
        elif op == "*":
            b = rng.randint(2, 3)
            word = {2: "twice", 3: "three times"}[b]
            sentences.append(f"Then {he} has {word} as many.")
            new = value * b
        else:
            b = rng.choice(divisors)
            sentences.append(f"{he.capitalize()} puts them in {b} equal bags and keeps one bag.")
            new = value // b
        lines.append(f"{value}{op}{b}={new}")
        value = new
    sentences.append(f"How many {items} does {he} have now?")
    solution = "\n".join([*lines, f"#### {value}"])
    return Example(" ".join(sentences), solution, value)


# draws in a row that give no new test question: the options' questions are (nearly) all used
EXHAUSTED = 20_000
MAX_TEST_SIZE = 100_000


@dataclass(frozen=True)
class ArithConfig:
    seed: int = 0  # generator seed: the test set and the train stream both follow from it
    test_size: int = 500  # problems in the fixed test split (distinct questions)
    train_size: int = 20000  # size splits() reports for train; examples() reaches any index
    max_steps: int = 2  # arithmetic steps per problem, min_steps to this (at most 3)
    min_steps: int = 1  # the fewest steps a problem has
    max_start: int = 10  # the first number is 1 to this
    max_operand: int = 5  # a number added or taken away is 1 to this
    shots: int = 0  # exemplars (the first train problems) before the question in `fewshot`

    def __post_init__(self) -> None:
        if not 1 <= self.test_size <= MAX_TEST_SIZE or self.train_size < 1:
            raise ValueError(
                f"test_size must be 1 to {MAX_TEST_SIZE:,} (made at load: about 50,000 a "
                "second) and train_size >= 1"
            )
        if not 1 <= self.max_steps <= 3:
            raise ValueError(f"max_steps must be 1, 2 or 3, got {self.max_steps}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(
                f"min_steps must be 1 to max_steps ({self.max_steps}), got {self.min_steps}"
            )
        if self.max_start < 1 or self.max_operand < 1:
            raise ValueError("max_start and max_operand must be >= 1")
        if self.shots < 0:
            raise ValueError(f"shots must be >= 0, got {self.shots}")


class Arith:
    """Synthetic word problems; prompts `chat` and `fewshot` ("Question: …\\nAnswer:")."""

    Config = ArithConfig
    contract_configs: ClassVar[list[dict]] = [{}, {"test_size": 20, "max_steps": 1, "shots": 2}]

    def __init__(self, **config: Any):
        self.config = ArithConfig(**config)
        self._problems: dict[str, list[Problem]] = {}

    def _rng(self, split: str, index: int, attempt: int) -> random.Random:
        """The generator of one problem: a function of (seed, split, index, attempt) only."""
        stream = {"test": 1, "train": 2}[split]
        return random.Random(((self.config.seed * 4 + stream) << 40 | index) << 12 | attempt)

    def _generate(self, rng: random.Random) -> Example:
        c = self.config
        return generate(rng, c.max_steps, c.max_start, c.max_operand, c.min_steps)

    @cached_property
    def _test(self) -> list[Example]:
        out, seen, index, last_new = [], set(), 0, 0
        while len(out) < self.config.test_size:
            example = self._generate(self._rng("test", index, 0))
            index += 1
            if example.question not in seen:
                seen.add(example.question)
                out.append(example)
                last_new = index
            if index - last_new > EXHAUSTED:  # the questions these options allow are used up
                c = self.config
                raise UserError(
                    f"arith: cannot make {c.test_size} distinct test problems with "
                    f"min_steps={c.min_steps}, max_steps={c.max_steps}, max_start={c.max_start}, "
                    f"max_operand={c.max_operand} (about {len(out)} exist); ask for at most "
                    f"{len(out)}, or allow more steps or larger numbers"
                )
        return out

    @cached_property
    def _test_questions(self) -> frozenset[str]:
        return frozenset(e.question for e in self._test)

    def train_example(self, index: int) -> Example:
        """Train problem `index` (any nonnegative integer); never a test question."""
        for attempt in range(1000):
            example = self._generate(self._rng("train", index, attempt))
            if example.question not in self._test_questions:
                return example
        raise UserError("arith: the train stream cannot avoid the test set; lower test_size")

    def examples(self, split: str, start: int = 0, count: int | None = None) -> Iterator[Example]:
        """Examples of a split from `start`; the train stream is endless when count is None."""
        if split == "test":
            stop = self.config.test_size if count is None else min(start + count, len(self._test))
            yield from self._test[start:stop]
            return
        if split != "train":
            raise UserError(f"arith has no split {split!r}; splits: train, test")
        index = start
        while count is None or index < start + count:
            yield self.train_example(index)
            index += 1

    def splits(self) -> dict[str, int]:
        return {"train": self.config.train_size, "test": self.config.test_size}

    def problems(self, split: str) -> list[Problem]:
        size = self.splits().get(split)
        if size is None:
            raise UserError(f"arith has no split {split!r}; splits: train, test")
        if split not in self._problems:
            self._problems[split] = [
                Problem(f"{split}-{i}", e.question, str(e.answer), {})
                for i, e in enumerate(self.examples(split, 0, size))
            ]
        return list(self._problems[split])

    def prompt(self, problem: Problem, style: str) -> Prompt:
        if style == "chat":
            return Prompt(messages=({"role": "user", "content": problem.question},))
        if style == "fewshot":
            shots = [
                format_example(e.question, e.solution)
                for e in self.examples("train", 0, self.config.shots)
            ]
            return Prompt(text="\n\n".join([*shots, format_example(problem.question)]))
        raise UserError(f"arith has prompt styles chat and fewshot, not {style!r}")

    def extract(self, text: str) -> str | None:
        return extract_strict(text)

    def answer_key(self, answer: str) -> Decimal | None:
        return number_key(answer)

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return same_number(answer, problem.gold)

    def data_files(self) -> dict[str, str]:
        return {}  # generated: the configuration (seed) is the data


@hookimpl
def dllmbench_register_tasks(register):
    register("arith", Arith)
