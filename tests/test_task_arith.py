"""arith: a seeded synthetic task with disjoint train and test streams and short solutions."""

from __future__ import annotations

import itertools
import re

import pytest

from dllmbench.core.errors import UserError
from dllmbench.tasks.arith import Arith, format_example


@pytest.fixture(scope="module")
def task() -> Arith:
    return Arith()


def test_sizes_and_ids(task):
    assert task.splits() == {"train": 20000, "test": 500}
    test = task.problems("test")
    assert len(test) == 500 and test[0].id == "test-0"
    assert len({p.question for p in test}) == 500


def test_same_seed_same_problems_other_seed_other_problems(task):
    assert Arith().problems("test") == task.problems("test")
    assert Arith(seed=1).problems("test")[:20] != task.problems("test")[:20]
    assert list(task.examples("train", 123, 3)) == list(Arith().examples("train", 123, 3))


def test_train_stream_never_repeats_a_test_question(task):
    test = {p.question for p in task.problems("test")}
    train = task.problems("train")
    assert len(train) == 20000 and not test & {p.question for p in train}
    far = list(task.examples("train", 10**9, 50))  # the stream goes on past train_size
    assert len(far) == 50 and not test & {e.question for e in far}
    endless = task.examples("train")
    assert len(list(itertools.islice(endless, 25000))) == 25000


@pytest.mark.parametrize(
    "config",
    [{}, {"max_steps": 3, "max_start": 20, "max_operand": 10}, {"min_steps": 2, "max_steps": 3}],
    ids=["default", "wide", "demo"],
)
def test_solutions_are_short_correct_and_extract_strictly(config):
    task = Arith(**config)
    c = task.config
    counts = set()
    for example in task.examples("train", 0, 3000):
        lines = example.solution.split("\n")
        counts.add(len(lines) - 1)
        assert lines[-1] == f"#### {example.answer}"
        value = None
        for line in lines[:-1]:
            a, op, b, result = re.fullmatch(r"(\d+)([-+*/])(\d+)=(\d+)", line).groups()
            a, b, result = int(a), int(b), int(result)
            assert a == value if value is not None else 1 <= a <= c.max_start
            assert result == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            assert op not in "+-" or 1 <= b <= c.max_operand
            assert op != "/" or a % b == 0
            value = result
        assert value == example.answer >= 0
        assert task.extract(example.solution) == str(example.answer)
        assert len(example.question.split()) <= 40
    assert counts == set(range(c.min_steps, c.max_steps + 1))  # every count of steps, no other


def test_small_vocabulary(task):
    words = set()
    for p in task.problems("train"):
        words |= {w for w in re.findall(r"[A-Za-z]+", p.question)}
    assert len(words) <= 50


def test_grading_and_keys(task):
    problem = task.problems("test")[0]
    solution = next(task.examples("test", 0, 1)).solution
    assert task.grade(problem, task.extract(solution), solution)
    assert not task.grade(problem, str(int(problem.gold) + 1), "")
    assert not task.grade(problem, None, "")
    assert task.answer_key("7") == task.answer_key("7.0")


def test_prompts(task):
    problem = task.problems("test")[0]
    assert task.prompt(problem, "chat").messages[-1]["content"] == problem.question
    assert task.prompt(problem, "fewshot").text == f"Question: {problem.question}\nAnswer:"
    shots = Arith(shots=2).prompt(problem, "fewshot").text
    first = next(task.examples("train", 0, 1))
    assert shots.startswith(format_example(first.question, first.solution) + "\n\n")
    assert shots.count("Question: ") == 3 and shots.endswith("\nAnswer:")


def test_config_errors():
    with pytest.raises(ValueError):
        Arith(max_steps=4)
    with pytest.raises(ValueError, match="min_steps must be 1 to max_steps"):
        Arith(min_steps=3, max_steps=2)
    with pytest.raises(ValueError):
        Arith(test_size=0)
    with pytest.raises(ValueError, match="test_size must be 1 to 100,000"):
        Arith(test_size=1_000_000)  # made at load: it spun for minutes


def test_a_test_split_larger_than_the_options_allow_is_refused_at_once():
    """One-step problems with small numbers have only so many questions: asking for more
    stops, naming how many exist, as soon as new draws stop giving new ones."""
    with pytest.raises(UserError, match=r"about (\d+) exist\); ask for at most \1"):
        Arith(test_size=5000, max_steps=1, max_start=3, max_operand=2).problems("test")
    with pytest.raises(ValueError):
        Arith(max_operand=0)
    with pytest.raises(UserError, match="no split"):
        Arith().problems("validation")
