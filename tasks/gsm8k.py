"""GSM8K: grade-school word problems with a numeric answer (train 7473, test 1319).

Extraction is the protocol's strict extractor (`dllmbench.tasks.numeric.extract_strict`);
`extraction="flexible"` swaps in lm-eval's flexible-extract, a diagnostic that inflates
accuracy and is never the protocol. Answers are compared as numbers: 3.50 = 3.5 ≠ 3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Prompt
from dllmbench.tasks.data import Row, TaskData, need_fields
from dllmbench.tasks.numeric import (
    canonical,
    extract_flexible,
    extract_strict,
    number_key,
    same_number,
)

SYSTEM = "You are a helpful assistant."
HUB = ("openai/gsm8k", "main")
SIZES = {"train": 7473, "test": 1319}
EXTRACTORS = {"strict": extract_strict, "flexible": extract_flexible}

# The first eight train problems, their solutions without the <<calculator>> annotations.
EXEMPLARS: tuple[tuple[str, str], ...] = (
    (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether in April and May?",
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April "
        "and May.\n#### 72",
    ),
    (
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
        "babysitting. How much did she earn?",
        "Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n"
        "#### 10",
    ),
    (
        "Betty is saving money for a new wallet which costs $100. Betty has only half of the "
        "money she needs. Her parents decided to give her $15 for that purpose, and her "
        "grandparents twice as much as her parents. How much more money does Betty need to buy "
        "the wallet?",
        "In the beginning, Betty has only 100 / 2 = $50.\nBetty's grandparents gave her 15 * 2 = "
        "$30.\nThis means, Betty needs 100 - 50 - 30 - 15 = $5 more.\n#### 5",
    ),
    (
        "Julie is reading a 120-page book. Yesterday, she was able to read 12 pages and today, "
        "she read twice as many pages as yesterday. If she wants to read half of the remaining "
        "pages tomorrow, how many pages should she read?",
        "Maila read 12 x 2 = 24 pages today.\nSo she was able to read a total of 12 + 24 = 36 "
        "pages since yesterday.\nThere are 120 - 36 = 84 pages left to be read.\nSince she wants "
        "to read half of the remaining pages tomorrow, then she should read 84/2 = 42 pages.\n"
        "#### 42",
    ),
    (
        "James writes a 3-page letter to 2 different friends twice a week.  How many pages does "
        "he write a year?",
        "He writes each friend 3*2=6 pages a week\nSo he writes 6*2=12 pages every week\nThat "
        "means he writes 12*52=624 pages a year\n#### 624",
    ),
    (
        "Mark has a garden with flowers. He planted plants of three different colors in it. Ten "
        "of them are yellow, and there are 80% more of those in purple. There are only 25% as "
        "many green flowers as there are yellow and purple flowers. How many flowers does Mark "
        "have in his garden?",
        "There are 80/100 * 10 = 8 more purple flowers than yellow flowers.\nSo in Mark's "
        "garden, there are 10 + 8 = 18 purple flowers.\nPurple and yellow flowers sum up to 10 + "
        "18 = 28 flowers.\nThat means in Mark's garden there are 25/100 * 28 = 7 green flowers.\n"
        "So in total Mark has 28 + 7 = 35 plants in his garden.\n#### 35",
    ),
    (
        "Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 "
        "small pizzas. A large pizza has 16 slices and a small pizza has 8 slices. If he eats it "
        "all, how many pieces does he eat that day?",
        "He eats 32 from the largest pizzas because 2 x 16 = 32\nHe eats 16 from the small pizza "
        "because 2 x 8 = 16\nHe eats 48 pieces because 32 + 16 = 48\n#### 48",
    ),
    (
        "Ken created a care package to send to his brother, who was away at boarding school.  "
        "Ken placed a box on a scale, and then he poured into the box enough jelly beans to "
        "bring the weight to 2 pounds.  Then, he added enough brownies to cause the weight to "
        "triple.  Next, he added another 2 pounds of jelly beans.  And finally, he added enough "
        "gummy worms to double the weight once again.  What was the final weight of the box of "
        "goodies, in pounds?",
        "To the initial 2 pounds of jelly beans, he added enough brownies to cause the weight to "
        "triple, bringing the weight to 2*3=6 pounds.\nNext, he added another 2 pounds of jelly "
        "beans, bringing the weight to 6+2=8 pounds.\nAnd finally, he added enough gummy worms "
        "to double the weight once again, to a final weight of 8*2=16 pounds.\n#### 16",
    ),
)


def strip_annotations(solution: str) -> str:
    """A gold solution without its calculator annotations: `48/2 = <<48/2=24>>24` → `48/2 = 24`."""
    return re.sub(r"<<[^<>]*>>", "", solution)


def gold_answer(solution: str) -> str | None:
    """The canonical number on a gold solution's final `#### N` line."""
    if "####" not in solution:
        return None
    return canonical(solution.rsplit("####", 1)[1])


def fewshot_prompt(question: str, exemplars: tuple[tuple[str, str], ...] = EXEMPLARS) -> str:
    """lm-eval style "Question: …\\nAnswer: …" exemplars, then the question; blank lines apart."""
    shots = [f"Question: {q}\nAnswer: {a}" for q, a in exemplars]
    return "\n\n".join([*shots, f"Question: {question}\nAnswer:"])


def _check_row(row: dict[str, Any]) -> str | None:
    problem = need_fields(question=str, answer=str)(row)
    if problem:
        return problem
    if gold_answer(row["answer"]) is None:
        return "has an answer that does not end in '#### <number>'"
    return None


@dataclass(frozen=True)
class Gsm8kConfig:
    # a .jsonl[.gz] file or a folder (holding train.jsonl/test.jsonl[.gz], or gsm8k/ with them);
    # None: $DLLMBENCH_DATA/gsm8k/ when it exists, else the packaged copy
    data: str | None = None
    # "strict": the protocol's extractor; "flexible": lm-eval's last number (diagnostic only)
    extraction: str = "strict"
    # a revision (branch, tag or commit) of openai/gsm8k to load from the Hub instead of the
    # packaged copy; ignored when data comes from data= or $DLLMBENCH_DATA
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.extraction not in EXTRACTORS:
            raise ValueError(f"extraction must be strict or flexible, got {self.extraction!r}")


class Gsm8k:
    """GSM8K with strict numeric extraction; prompts `chat` (0-shot) and `fewshot` (8-shot)."""

    Config = Gsm8kConfig
    contract_configs: ClassVar[list[dict]] = [{}, {"extraction": "flexible"}]

    def __init__(self, **config: Any):
        self.config = Gsm8kConfig(**config)
        self._extract = EXTRACTORS[self.config.extraction]
        self._data = TaskData(
            "gsm8k",
            data=self.config.data,
            revision=self.config.revision,
            files={"train": "train.jsonl", "test": "test.jsonl"},
            hub=HUB,
            sizes=SIZES,
            check=_check_row,
        )

    def splits(self) -> dict[str, int]:
        return self._data.splits()

    def problems(self, split: str) -> list[Problem]:
        return [self._problem(split, i, row) for i, row in enumerate(self._data.rows(split))]

    @staticmethod
    def _problem(split: str, index: int, row: Row) -> Problem:
        gold = gold_answer(row.fields["answer"])
        return Problem(f"{split}-{index}", row.fields["question"], gold, {"source": row.where})

    def prompt(self, problem: Problem, style: str) -> Prompt:
        if style == "chat":
            return Prompt(
                messages=(
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": problem.question},
                )
            )
        if style == "fewshot":
            return Prompt(text=fewshot_prompt(problem.question))
        raise UserError(f"gsm8k has prompt styles chat and fewshot, not {style!r}")

    def extract(self, text: str) -> str | None:
        return self._extract(text)

    def answer_key(self, answer: str) -> Decimal | None:
        return number_key(answer)

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return same_number(answer, problem.gold)

    def data_files(self) -> dict[str, str]:
        return self._data.data_files()


@hookimpl
def dllmbench_register_tasks(register):
    register("gsm8k", Gsm8k)
