"""MBPP: 974 short Python tasks, each with three asserts, graded by running them in a sandbox.

Splits by task_id, as in the dataset's own release: prompt 1–10, test 11–510, validation
511–600, train 601–974. The program is the first fenced code block of the generation (the
first that defines something when there are several), else the text before `[DONE]`; it passes
when the program, the task's test_setup_code and every test of `test_list` run to the end in
the sandbox (`dllmbench.tasks.sandbox`) and every value the sandbox returns is right: asserts of
known shapes are judged outside the program's process (`dllmbench.tasks.mbpp_judge`), the rest
inside it, counted in `meta["judged_in_process"]`. Grades are cached per (task, program).
"""

from __future__ import annotations

import ast
import hashlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Prompt
from dllmbench.tasks.data import TaskData, need_fields
from dllmbench.tasks.mbpp_judge import MODULES, Check, Undecodable, decode, holds, plan
from dllmbench.tasks.sandbox import ISOLATIONS, Conversation, Limits, Outcome, Sandbox, Steps

HUB = ("google-research-datasets/mbpp", "full")
RANGES = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
SIZES = {split: hi - lo + 1 for split, (lo, hi) in RANGES.items()}
FEWSHOT_IDS = (2, 3, 4)  # the exemplars of the original paper and lm-eval (prompt split)

# a fence's language: the word after its backticks (and blanks); the rest of its line is ignored
_LANGUAGE = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
# a line that defines something; its indent never crosses a line, so a search is linear
_DEFINES = re.compile(r"^[^\S\n]*(?:def|class|import|from)\s", re.MULTILINE)


def task_text(text: str, tests: Sequence[str]) -> str:
    """The task as the original paper and lm-eval state it, ending before the program."""
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        f"Your code should pass these tests:\n\n" + "\n".join(tests)
    )


def fenced_block(text: str) -> str | None:
    """The program among a generation's fenced blocks: the first Python (or unlabelled) block
    that defines something, else the first such block, else the first block; without the
    blank lines around it ("" when empty). None when the text has no fenced block."""
    blocks = [(lang.lower(), body) for lang, body in fences(text)]
    if not blocks:
        return None
    python = [b for lang, b in blocks if lang in ("python", "py", "python3", "")] or [
        b for _, b in blocks
    ]
    body = next((b for b in python if _DEFINES.search(b)), python[0])
    return body.strip("\n").rstrip()


def fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in one pass: a fence is three backticks and the
    rest of their line (whose first word is the language), the body runs to the next three
    backticks or the end of the text. Backticks with no line after them open nothing."""
    blocks = []
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        line_end = text.find("\n", start + 3)
        if line_end < 0:
            break
        language = _LANGUAGE.match(text, start + 3, line_end)
        end = text.find("```", line_end + 1)
        body = text[line_end + 1 : end if end >= 0 else len(text)]
        blocks.append((language.group(1) if language else "", body))
        if end < 0:
            break
        pos = end + 3
    return blocks


def extract_program(text: str) -> str | None:
    """The program in a generation: a fenced block (```python …``` or ``` …```), else the raw
    text cut at `[DONE]` (the few-shot stop marker; a leading `[BEGIN]` is dropped)."""
    block = fenced_block(text)
    if block is not None:
        return block or None
    raw = text.split("[DONE]", 1)[0]
    if "[BEGIN]" in raw:
        raw = raw.split("[BEGIN]", 1)[1]
    raw = raw.strip("\n").rstrip()
    return raw if raw.strip() else None


def program_key(program: str) -> str:
    """Programs vote together when their syntax trees match (comments, layout ignored)."""
    try:
        form = ast.dump(ast.parse(program))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        form = "unparsed:" + program.strip()
    return hashlib.sha256(form.encode()).hexdigest()[:16]


def _in_range(split: str, row: dict[str, Any]) -> bool:
    lo, hi = RANGES[split]
    return lo <= int(row["task_id"]) <= hi


_check = need_fields(task_id=int, text=str, code=str, test_list=list)


def _check_row(row: dict[str, Any]) -> str | None:
    problem = _check(row)
    if problem:
        return problem
    if not all(isinstance(t, str) for t in row["test_list"]) or not row["test_list"]:
        return "has a test_list that is not a non-empty list of strings"
    if not isinstance(row.get("test_setup_code", ""), str):
        return "has a test_setup_code that is not a string"
    return None


@dataclass(frozen=True)
class Tests:
    """A task's gold: its asserts, its setup code and the reference solution."""

    asserts: tuple[str, ...]
    setup: str
    reference: str
    checks: tuple[Check, ...] = ()  # how each assert is judged (`mbpp_judge.plan`)
    # what the answer completes (HumanEval's prompt: imports, signature, docstring); "" for MBPP
    prefix: str = ""


def assemble(prefix: str, answer: str) -> str:
    """The program run for an answer: the answer alone without a prefix; a function body
    (its first line indented) completes the prefix; a whole program follows it (so helpers
    the prefix defines stay defined, and the answer's own definitions win)."""
    if not prefix:
        return answer
    first = next((line for line in answer.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\t"):
        return prefix + answer
    return prefix.rstrip("\n") + "\n\n\n" + answer


# seeds `random` before check() in the judge's run, so that tests drawing inputs from it ask
# the same calls of every program
SEED_RANDOM = "__import__('random').seed(0)"


def _slim(outcome: Outcome, keep: int = 2000) -> Outcome:
    """An outcome with only the ends of its output, for the cache."""
    return replace(outcome, stdout=outcome.stdout[-keep:], stderr=outcome.stderr[-keep:], values=())


@dataclass(frozen=True)
class MbppConfig:
    # a .jsonl[.gz] file or a folder (holding mbpp.jsonl[.gz], or mbpp/ with it); None:
    # $DLLMBENCH_DATA/mbpp/ when it exists, else the packaged copy
    data: str | None = None
    # a revision of google-research-datasets/mbpp (full) to load from the Hub instead of the
    # packaged copy
    revision: str | None = None
    isolation: str = "namespaces"  # sandbox isolation: "namespaces", or "process" (weak)
    timeout: float = 15.0  # wall-clock seconds per program, interpreter start included
    cpu_seconds: int = 5  # CPU seconds per program
    memory_mb: int = 1024  # address space per process, MiB
    output_bytes: int = 65536  # stdout and stderr kept; more fails the program
    processes: int = 1  # tasks (processes, threads) of one program at once; MBPP needs one
    workers: int = 0  # programs graded at once by grade_many (0: two per CPU core)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be namespaces or process, got {self.isolation!r}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        self.limits()  # validates the limits

    def limits(self) -> Limits:
        return Limits(
            timeout=self.timeout,
            cpu_seconds=self.cpu_seconds,
            memory_mb=self.memory_mb,
            output_bytes=self.output_bytes,
            processes=self.processes,
        )


class Mbpp:
    """MBPP graded by execution; prompts `chat` (0-shot) and `fewshot` (3-shot, [BEGIN]/[DONE])."""

    Config = MbppConfig
    contract_configs: ClassVar[list[dict]] = [{}]

    def __init__(self, **config: Any):
        self.config = self.Config(**config)
        self._data = self._task_data()
        # the task's data files (the user's, wherever they are) are never shown to programs
        data = [str(path) for path in self._data.local.values()]
        self.sandbox = Sandbox(self.config.limits(), self.config.isolation, hide=data)
        self._outcomes: dict[tuple[str, str], Outcome] = {}
        self._expected: dict[str, tuple[str, ...]] = {}  # task → records of `before_steps`
        self._lock = threading.Lock()

    def _task_data(self) -> TaskData:
        return TaskData(
            "mbpp",
            data=self.config.data,
            revision=self.config.revision,
            files=dict.fromkeys(RANGES, "mbpp.jsonl"),
            hub=HUB,
            sizes=SIZES,
            check=_check_row,
            select=_in_range,
        )

    def splits(self) -> dict[str, int]:
        return self._data.splits()

    def problems(self, split: str) -> list[Problem]:
        out = []
        for row in self._data.rows(split):
            f = row.fields
            tests = [t.strip() for t in f["test_list"]]
            checks = tuple(plan(t) for t in tests)
            gold = Tests(
                tuple(tests),
                (f.get("test_setup_code") or "").replace("\r\n", "\n"),
                f["code"].replace("\r\n", "\n"),
                checks,
            )
            meta = {
                "task_id": int(f["task_id"]),
                "tests": tests,
                "source": row.where,
                # asserts judged in the program's own process (shapes the judge does not know)
                "judged_in_process": sum(not c.outside for c in checks),
            }
            out.append(Problem(str(f["task_id"]), f["text"], gold, meta))
        return out

    def _exemplars(self) -> str:
        rows = {int(r.fields["task_id"]): r.fields for r in self._data.rows("prompt")}
        missing = [i for i in FEWSHOT_IDS if i not in rows]
        if missing:
            raise UserError(f"mbpp: the fewshot prompt needs tasks {missing} of the prompt split")
        shots = []
        for i in FEWSHOT_IDS:
            f = rows[i]
            code = f["code"].replace("\r\n", "\n").strip()
            shots.append(f"{task_text(f['text'], f['test_list'])}\n[BEGIN]\n{code}\n[DONE]")
        return "\n\n".join(shots)

    def prompt(self, problem: Problem, style: str) -> Prompt:
        task = task_text(problem.question, problem.meta["tests"])
        if style == "chat":
            return Prompt(
                messages=(
                    {
                        "role": "user",
                        "content": f"{task}\n\nWrite the program in one ```python code block.",
                    },
                )
            )
        if style == "fewshot":
            return Prompt(text=f"{self._exemplars()}\n\n{task}\n[BEGIN]\n")
        raise UserError(f"mbpp has prompt styles chat and fewshot, not {style!r}")

    def extract(self, text: str) -> str | None:
        return extract_program(text)

    def answer_key(self, answer: str) -> str:
        return program_key(answer)

    @staticmethod
    def steps(problem: Problem, program: str) -> list[tuple[str, ...]]:
        """What the sandbox runs: the program, the setup code, then each assert: its actual side
        only ("eval": the value comes back to be judged here) or, for a shape the judge does
        not know, the assert. Expected sides computed in a sandbox are not among them: they
        come from a run of their own (`before_steps`), which no program shares. With a
        "replay" check, the program then answers the calls of its function that `judge_steps`
        makes (a conversation, `Sandbox.converse`)."""
        gold: Tests = problem.gold
        checks = gold.checks or tuple(plan(t) for t in gold.asserts)
        steps: list[tuple[str, ...]] = [("program", assemble(gold.prefix, program))]
        replay = [c for c in checks if c.kind == "replay"]
        if replay:
            return [*steps, ("calls", "", "serve", replay[0].actual)]
        if gold.setup.strip():
            steps.append(("setup", gold.setup))
        for i, check in enumerate(checks):
            if check.outside:
                steps.append((f"test {i + 1}", check.actual, "eval"))
            else:
                steps.append((f"test {i + 1}", check.source))
        return steps

    @staticmethod
    def judge_steps(problem: Problem) -> list[tuple[str, ...]]:
        """The run that judges a "replay" check, with no program in it: the prefix (the
        prompt's helpers) and setup, then `check(candidate)`, where each call of `candidate`
        sends its arguments to the program's run as data and returns, as data, the value the
        program's function returned for them."""
        gold: Tests = problem.gold
        (check,) = [c for c in gold.checks if c.kind == "replay"]
        steps: list[tuple[str, ...]] = []
        if gold.prefix.strip():
            steps.append(("prompt", gold.prefix))
        if gold.setup.strip():
            steps.append(("setup", gold.setup))
        steps.append(("check", f"{SEED_RANDOM}\n{check.source}\ncheck(__candidate__)", "ask"))
        return steps

    def _job(self, problem: Problem, program: str) -> Steps | Conversation:
        """What the sandbox runs for a program: its steps, or a conversation with the judge."""
        gold: Tests = problem.gold
        if any(c.kind == "replay" for c in gold.checks):
            return Conversation(self.steps(problem, program), self.judge_steps(problem), decode)
        return self.steps(problem, program)

    @staticmethod
    def before_steps(problem: Problem) -> list[tuple[str, ...]]:
        """The run that computes the expected sides the sandbox's interpreter must compute
        (e.g. `sys.getsizeof((1, 2))`), alone: no program runs in it; [] when there are none."""
        gold: Tests = problem.gold
        checks = gold.checks or tuple(plan(t) for t in gold.asserts)
        before = [(f"expected {i + 1}", c.expected, "eval") for i, c in enumerate(checks)]
        before = [s for s, c in zip(before, checks, strict=True) if c.before]
        if not before:
            return []
        names = ", ".join(MODULES)
        return [("imports", f"import {names}"), *before]

    def expected(self, problem: Problem) -> tuple[str, ...]:
        """The encoded expected sides of `before_steps` (cached per task); an error if that
        run, which holds no program, fails."""
        steps = self.before_steps(problem)
        if not steps:
            return ()
        with self._lock:
            cached = self._expected.get(problem.id)
        if cached is None:
            outcome = self.sandbox.run(steps)
            if not outcome.passed:
                raise UserError(
                    f"mbpp: task {problem.id}'s expected values could not be computed in the "
                    f"sandbox ({outcome.status}: {outcome.stderr.strip()[-200:]})"
                )
            cached = outcome.values
            with self._lock:
                self._expected[problem.id] = cached
        return cached

    @staticmethod
    def judge(problem: Problem, outcome: Outcome, expected: Sequence[str] = ()) -> Outcome:
        """The outcome with the verdict on the returned values (`expected`: the records of the
        task's `before_steps` run): a run that completed but returned a wrong value, or values
        that are not exactly one per check, is `wrong`."""
        if not outcome.passed:
            return outcome
        gold: Tests = problem.gold
        checks = gold.checks or tuple(plan(t) for t in gold.asserts)
        before = [c for c in checks if c.before]
        after = [c for c in checks if c.outside]
        if any(c.kind == "replay" for c in checks):  # judged in the conversation
            return outcome
        if len(outcome.values) != len(after) or len(expected) != len(before):
            return replace(outcome, passed=False, status="wrong")
        try:
            computed = iter([decode(v) for v in expected])
            for check, record in zip(after, outcome.values, strict=True):
                actual = decode(record)
                if check.before:
                    value = next(computed)
                elif check.expected:
                    value = ast.literal_eval(check.expected)
                else:
                    value = None
                if not holds(check, actual, value):
                    return replace(outcome, passed=False, status="wrong")
        except Undecodable:
            return replace(outcome, passed=False, status="wrong")
        return outcome

    def run(self, problem: Problem, program: str) -> Outcome:
        """The sandbox's outcome for a program on a task (cached)."""
        key = (problem.id, program)
        with self._lock:
            cached = self._outcomes.get(key)
        if cached is None:
            expected = self.expected(problem)
            job = self._job(problem, program)
            if isinstance(job, Conversation):
                outcome = self.sandbox.converse(job)
            else:
                outcome = self.sandbox.run(job)
            cached = _slim(self.judge(problem, outcome, expected))
            with self._lock:
                self._outcomes[key] = cached
        return cached

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return answer is not None and self.run(problem, answer).passed

    def grade_many(self, items: Sequence[tuple[Problem, str | None, str]]) -> list[bool]:
        """Grades of many (problem, answer, text) at once, `workers` sandboxes in parallel."""
        todo = {(p.id, a): p for p, a, _ in items if a is not None}
        with self._lock:
            pending = [(p, a) for (_, a), p in todo.items() if (p.id, a) not in self._outcomes]
        needed = {p.id: p for p, _ in pending if self.before_steps(p)}
        with self._lock:
            needed = {i: p for i, p in needed.items() if i not in self._expected}
        computed = self.sandbox.run_many(
            [self.before_steps(p) for p in needed.values()], workers=self.config.workers
        )
        with self._lock:
            for problem_id, outcome in zip(needed, computed, strict=True):
                if outcome.passed:
                    self._expected[problem_id] = outcome.values
        outcomes = self.sandbox.run_many(
            [self._job(p, a) for p, a in pending], workers=self.config.workers
        )
        for (p, a), outcome in zip(pending, outcomes, strict=True):
            final = _slim(self.judge(p, outcome, self.expected(p)))
            with self._lock:
                self._outcomes[(p.id, a)] = final
        return [a is not None and self._outcomes[(p.id, a)].passed for p, a, _ in items]

    def grade_note(self, problem: Problem, answer: str) -> str | None:
        """Kept in the record when the grade came from a second run of a program that timed out
        beside others (`Outcome.reran`: beside only the programs that timed out too)."""
        with self._lock:
            outcome = self._outcomes.get((problem.id, answer))
        if outcome is None or not outcome.reran:
            return None
        return f"timed out beside other programs; run again: {outcome.status}"

    def data_files(self) -> dict[str, str]:
        return self._data.data_files()


@hookimpl
def dllmbench_register_tasks(register):
    register("mbpp", Mbpp)
