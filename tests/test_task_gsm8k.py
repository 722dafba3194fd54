"""gsm8k: gold solutions extract to their answers; strict and flexible extraction; prompts."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal

import pytest

from dllmbench.loading.registry import registry
from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.gsm8k import EXEMPLARS, Gsm8k, gold_answer, strip_annotations
from dllmbench.tasks.numeric import canonical, extract_flexible, extract_strict, number_key

DATA = PACKAGED  # the copy shipped with dllmbench, named explicitly ($DLLMBENCH_DATA aside)


@pytest.fixture(scope="module")
def task() -> Gsm8k:
    return Gsm8k(data=str(DATA))


def _rows(split: str) -> list[dict]:
    with gzip.open(DATA / "gsm8k" / f"{split}.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_splits_and_sizes(task):
    assert task.splits() == {"train": 7473, "test": 1319}
    problems = task.problems("test")
    assert problems[0].id == "test-0" and len({p.id for p in problems}) == 1319


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gold_solution_extracts_to_its_gold_answer(task, split):
    rows = _rows(split)
    problems = task.problems(split)
    assert len(rows) == len(problems) == {"train": 7473, "test": 1319}[split]
    for row, problem in zip(rows, problems, strict=True):
        final = row["answer"].rsplit("####", 1)[1].strip()
        assert problem.gold == canonical(final)
        answer = task.extract(row["answer"])
        assert answer == problem.gold, (problem.id, row["answer"][-80:])
        assert task.grade(problem, answer, row["answer"])
        assert task.answer_key(answer) == Decimal(final.replace(",", ""))


STRICT = [
    ("#### 72", "72"),
    ("so 5 + 3 = 8\n#### 8", "8"),
    ("#### 1,234", "1234"),
    ("#### $1,234.50", "1234.5"),
    ("#### -5", "-5"),
    ("#### 3.50", "3.5"),
    ("#### 0.25", "0.25"),
    ("#### 007", "7"),
    ("#### 12%", "12"),
    ("#### -0", "0"),
    ("####12", "12"),
    # the first #### wins: a model that runs on into an invented next question writes more
    ("#### 18\n\nQuestion: Tom has 3 cats.\nAnswer: 3 + 1 = 4\n#### 4", "18"),
    ("#### 7. The end, with 99 more words", "7"),
    ("#### 7\nI hope 42 is not the answer", "7"),
    # a #### with no number after it is passed over
    ("#### unknown\nso she pays $40", "40"),
    ("The answer is 42.", "42"),
    ("the answer is: $3.75 per cup, not 4", "3.75"),
    ("So the final answer is 1,000,000", "1000000"),
    ("The answer is $-3$.", "-3"),
    ("We get \\boxed{17} and then 9", "17"),
    ("\\boxed{\\$25}", "25"),
    ("\\boxed{2.5}", "2.5"),
    ("He has 5 apples, buys 3, so 8 apples", "8"),
    ("Total: 1,200 dollars.", "1200"),
    ("it is -4 degrees", "-4"),
    ("costs $0.50 each", "0.5"),
    # a sign before the dollar sign is the number's
    ("#### -$5", "-5"),
    ("#### -$1,234.50", "-1234.5"),
    ("#### $-5", "-5"),
    ("The answer is -$3.", "-3"),
    ("\\boxed{-\\$25}", "-25"),
    ("so the change is -$3", "-3"),
    ("he lost -$ 4 in all", "-4"),
    ("5 - $3 = $2", "2"),  # a minus with a space before "$" is subtraction, not a sign
    ("#### -$-5", "-5"),  # a doubled sign is no number; the "$-5" inside it is
    ("no numbers here", None),
    ("", None),
    ("####", None),
]


@pytest.mark.parametrize("text,expected", STRICT)
def test_strict_extraction(text, expected):
    assert extract_strict(text) == expected


FLEXIBLE = [
    ("#### 72", "72"),
    ("#### 18\nQuestion: next\n#### 4", "4"),  # the last number, unlike strict
    ("The answer is 42. Then 7 more.", "7"),
    ("it costs $1,234.50.", "1234.5"),
    ("temperature -4", "-4"),
    ("-$3", "-3"),
    ("#### -$5", "-5"),
    ("he owes $-7", "-7"),
    ("3.50", "3.5"),
    ("a . b", None),  # nothing numeric
    ("...", None),  # lm-eval matches "..." but it is no number
    ("", None),
]


@pytest.mark.parametrize("text,expected", FLEXIBLE)
def test_flexible_extraction(text, expected):
    assert extract_flexible(text) == expected


def test_numbers_compare_as_numbers(task):
    problem = task.problems("test")[0]  # gold 18
    assert problem.gold == "18"
    assert task.grade(problem, "18.00", "")
    assert task.grade(problem, "18", "")
    assert not task.grade(problem, "18.5", "")
    assert not task.grade(problem, None, "")
    assert number_key("3.50") == number_key("3.5") != number_key("3")
    assert task.answer_key("3.50") == task.answer_key("3.5")
    assert task.answer_key("3.5") != task.answer_key("3")
    assert hash(task.answer_key("1000")) == hash(task.answer_key("1000.0"))
    long = "9" * 6000  # LLaDA digit spam: exact, no int-conversion limit
    assert task.answer_key(extract_strict(long)) == Decimal(long)


def test_flexible_option(task):
    flexible = Gsm8k(data=str(DATA), extraction="flexible")
    text = "#### 18\nQuestion: next one\n#### 4"
    assert task.extract(text) == "18" and flexible.extract(text) == "4"
    with pytest.raises(ValueError, match="strict or flexible"):
        Gsm8k(data=str(DATA), extraction="loose")


def test_fewshot_exemplars_are_the_first_eight_train_solutions(task):
    rows = _rows("train")[:8]
    assert len(EXEMPLARS) == 8
    for (question, solution), row in zip(EXEMPLARS, rows, strict=True):
        assert question == row["question"]
        assert solution == strip_annotations(row["answer"])
        assert "<<" not in solution and gold_answer(solution) == gold_answer(row["answer"])


def test_prompts(task):
    problem = task.problems("test")[3]
    chat = task.prompt(problem, "chat")
    assert chat.is_chat and chat.messages[-1] == {"role": "user", "content": problem.question}
    text = task.prompt(problem, "fewshot").text
    assert text.startswith("Question: " + EXEMPLARS[0][0] + "\nAnswer: ")
    assert text.endswith(f"\n\nQuestion: {problem.question}\nAnswer:")
    assert text.count("Question: ") == 9 and text.count("#### ") == 8
    assert not re.search(r"<<[^>]*>>", text)


def test_registered_with_its_options():
    task = registry().task("gsm8k", data=str(DATA / "gsm8k" / "test.jsonl.gz"))
    assert task.splits() == {"test": 1319}
    assert task.data_files() == {
        str(DATA / "gsm8k" / "test.jsonl.gz"): (
            "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
        )
    }
