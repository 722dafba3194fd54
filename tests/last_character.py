"""A task the random models of the sampler tests cannot answer, shared by tests/test_temporal.py
and tests/test_prophet.py."""

from __future__ import annotations

from dllmbench.core.types import Problem, Prompt


class LastCharacter:
    """Questions the random model cannot answer; the answer is the last character of the
    text, so the random model's predictions give many different answers along a trajectory
    (and none when a prediction ends at once)."""

    def __init__(self, size: int = 2):
        self.size = size

    def splits(self) -> dict[str, int]:
        return {"test": self.size}

    def problems(self, split: str) -> list[Problem]:
        return [
            Problem(f"q{i}", f"{i} plus {i + 3} is", str((2 * i + 3) % 10))
            for i in range(self.size)
        ]

    def prompt(self, problem: Problem, style: str) -> Prompt:
        return Prompt(text=problem.question)

    def extract(self, text: str) -> str | None:
        return text[-1] if text else None

    def answer_key(self, answer: str) -> str:
        return answer

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return answer == problem.gold

    def data_files(self) -> dict[str, str]:
        return {}
