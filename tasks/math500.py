"""MATH-500: competition problems with LaTeX answers, graded by math-verify (test, 500).

The answer is the content of the last `\\boxed{…}` (or `\\fbox{…}`) with balanced braces.
Grades run in worker processes under a time limit (`dllmbench.tasks.mathverify`): a grade that
times out or crashes its worker counts as wrong and the run goes on. Answers vote together when
their normalized strings (`normalize`, after Hendrycks' MATH `strip_string`) are equal.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Prompt
from dllmbench.tasks.data import TaskData, need_fields
from dllmbench.tasks.mathverify import VerifyPool

HUB = ("HuggingFaceH4/MATH-500", None)
SIZES = {"test": 500}
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# Minerva's four MATH exemplars (Lewkowycz et al. 2022, as in lm-eval's minerva_math), each
# solution ending in its boxed answer.
EXEMPLARS: tuple[tuple[str, str], ...] = (
    (
        "Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.}",
        "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, "
        "so $x\\ge2$, and $5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal "
        "to zero, so $5-x>0$, which gives $x<5$. Therefore, the domain of the expression is "
        "$\\boxed{[2,5)}$.",
    ),
    (
        "If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find "
        "$\\det (\\mathbf{A} \\mathbf{B}).$",
        "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) "
        "= (2)(12) = \\boxed{24}.$",
    ),
    (
        "Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights "
        "instead, how many times must Terrell lift them in order to lift the same total weight?",
        "If Terrell lifts two 20-pound weights 12 times, he lifts a total of "
        "$2\\cdot 12\\cdot20=480$ pounds of weight.  If he lifts two 15-pound weights instead "
        "for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ pounds of weight.  "
        "Equating this to 480 pounds, we can solve for $n$:\n\\begin{align*}\n30n&=480\\\\\n"
        "\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}",
    ),
    (
        "If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n"
        "\\end{align*}has a solution $(x, y)$ where $x$ and $y$ are both nonzero, find "
        "$\\frac{a}{b},$ assuming $b$ is nonzero.",
        "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n"
        "$$6y-9x=-\\frac{3}{2}a.$$Since we also know that $6y-9x=b$, we have\n\n"
        "$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$",
    ),
)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{…}` or `\\fbox{…}` (balanced braces), or of `\\boxed x`."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    rest = text[i:]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):  # `\boxed 5`
        content = rest.lstrip().split("$")[0].split("\n")[0].strip()
        return content or None
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for j, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                content = rest[1:j].strip()
                return content or None
    return None  # unbalanced: the answer was cut off


def _fix_fracs(s: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{x}` → `\\frac{1}{x}`."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail)
    return out


def normalize(answer: str) -> str:
    """A canonical string for voting: Hendrycks' MATH `strip_string`, plus `\\text{}` unwrapped."""
    s = answer.strip().replace("\n", "").replace("\\!", "")
    s = re.sub(r"\\\\+", r"\\", s)
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "").replace("\\,", "").replace("\\;", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    match = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if match:
        s = f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}"
    return s.rstrip(".")


@dataclass(frozen=True)
class Math500Config:
    # a .jsonl[.gz] file or a folder (holding test.jsonl[.gz], or math500/ with it); None:
    # $DLLMBENCH_DATA/math500/ when it exists, else the packaged copy
    data: str | None = None
    # a revision of HuggingFaceH4/MATH-500 to load from the Hub instead of the packaged copy
    revision: str | None = None
    # seconds per grade, as the paper's grader; math-verify's own parsing and verification
    # time-outs get the same (whole seconds); a grade that runs longer counts as wrong
    timeout: float = 30.0
    memory_mb: int = 4096  # address-space limit of each grading worker (0: none)
    workers: int = 0  # grading worker processes for grade_many (0: one per CPU core)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.memory_mb < 0 or self.workers < 0:
            raise ValueError("memory_mb and workers must be >= 0")


class Math500:
    """MATH-500 graded by math-verify; prompts `chat` (boxed instruction) and `fewshot` (4-shot)."""

    Config = Math500Config
    contract_configs: ClassVar[list[dict]] = [{}]

    def __init__(self, **config: Any):
        self.config = Math500Config(**config)
        self._data = TaskData(
            "math500",
            data=self.config.data,
            revision=self.config.revision,
            files={"test": "test.jsonl"},
            hub=HUB,
            sizes=SIZES,
            check=need_fields(problem=str, answer=str),
        )
        self._pool: VerifyPool | None = None
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[str, str], bool] = {}

    def splits(self) -> dict[str, int]:
        return self._data.splits()

    def problems(self, split: str) -> list[Problem]:
        out = []
        for i, row in enumerate(self._data.rows(split)):
            f = row.fields
            pid = f.get("unique_id") or f"{split}-{i}"
            meta = {"subject": f.get("subject"), "level": f.get("level"), "source": row.where}
            out.append(Problem(str(pid), f["problem"], f["answer"], meta))
        return out

    def prompt(self, problem: Problem, style: str) -> Prompt:
        if style == "chat":
            return Prompt(
                messages=(
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": problem.question},
                )
            )
        if style == "fewshot":
            shots = [f"Problem:\n{q}\n\nSolution:\n{a}" for q, a in EXEMPLARS]
            return Prompt(text="\n\n".join([*shots, f"Problem:\n{problem.question}\n\nSolution:"]))
        raise UserError(f"math500 has prompt styles chat and fewshot, not {style!r}")

    def extract(self, text: str) -> str | None:
        return last_boxed(text)

    def answer_key(self, answer: str) -> str:
        return normalize(answer)

    def _workers(self) -> VerifyPool:
        with self._lock:
            if self._pool is None:
                size = self.config.workers or os.cpu_count() or 1
                self._pool = VerifyPool(size, self.config.memory_mb)
            return self._pool

    def verify(self, gold: str, answer: str) -> bool:
        """math-verify's verdict on `answer` against `gold`, within the time limit (cached)."""
        key = (gold, answer)
        if key not in self._verdicts:
            ok, _how = self._workers().verify(gold, answer, self.config.timeout)
            self._verdicts[key] = ok
        return self._verdicts[key]

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return answer is not None and self.verify(problem.gold, answer)

    def grade_many(self, items: Sequence[tuple[Problem, str | None, str]]) -> list[bool]:
        """Grades of many (problem, answer, text) at once, across the worker processes."""
        todo = sorted({(p.gold, a) for p, a, _ in items if a is not None} - set(self._verdicts))
        if todo:
            verdicts = self._workers().verify_many(todo, self.config.timeout)
            self._verdicts.update(zip(todo, verdicts, strict=True))
        return [a is not None and self._verdicts[(p.gold, a)] for p, a, _ in items]

    def close(self) -> None:
        """Stop the grading workers (they also stop with the process)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def data_files(self) -> dict[str, str]:
        return self._data.data_files()


@hookimpl
def dllmbench_register_tasks(register):
    register("math500", Math500)
