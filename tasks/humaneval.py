"""HumanEval: 164 Python functions to complete from a signature and docstring, graded by
running the problem's `check(candidate)` in the sandbox, on MBPP's judge.

One split, `test` (all 164). The answer is the first fenced code block of the generation (the
first that defines something when there are several), else the raw text; a raw completion ends
where a line starts at the left margin again (the usual stop sequences: `def`, `class`, `if`,
`print`, `#`, …), since what follows the body is not the function's. The program run is the
problem's prompt completed by the answer: a function body (indented) continues the prompt, a
whole program follows it (the prompt's imports and helpers stay defined; the answer's own
definition of the function wins).

`check(candidate)` is split into its statements, `candidate` named as the entry point: each
`assert` of a shape the judge knows is judged outside the program's process like MBPP's
(`dllmbench.tasks.mbpp_judge`: only the actual side runs in the sandbox, its value comes back as
data); asserts of a constant true (`assert True, "…"`) are dropped. A check() with anything
else (loops, helpers, asserts of other shapes) is replayed instead, as a conversation
(`Sandbox.converse`): a run with no program in it (the prompt's helpers, the setup, `random`
seeded) runs check() with a `candidate` that sends each call's arguments out as data, and the
program's run, holding only the program, answers each with the value its function returns, as
data; the judge's verdict is the grade. The test's top-level code (imports, `METADATA`,
helpers) runs after the program as setup.

Prompt styles: `chat` (the prompt in a user message, asking for the completed function in one
code block) and `fewshot`, the raw prompt to continue (HumanEval is zero-shot: the model cards'
and lm-eval's evaluation gives the prompt alone; the name lets a preset use one style name for
a base model on every task).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.errors import UserError
from dllmbench.core.types import Problem, Prompt
from dllmbench.tasks.data import TaskData, need_fields
from dllmbench.tasks.mbpp import Mbpp, MbppConfig, Tests, fenced_block
from dllmbench.tasks.mbpp_judge import Check, plan

HUB = ("openai/openai_humaneval", None)
SIZES = {"test": 164}
FILE = "HumanEval.jsonl"

_check = need_fields(task_id=str, prompt=str, entry_point=str, canonical_solution=str, test=str)


def _check_row(row: dict[str, Any]) -> str | None:
    problem = _check(row)
    if problem:
        return problem
    if not row["entry_point"].isidentifier():
        return "has an entry_point that is not a Python name"
    try:
        _checks(row["test"], row["entry_point"])
    except (SyntaxError, ValueError) as exc:
        return f"has a test that cannot be read ({exc})"
    return None


class _Rename(ast.NodeTransformer):
    """One name → another, wherever the test reads it."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.old:
            return ast.copy_location(ast.Name(self.new, node.ctx), node)
        return node


def _checks(test: str, entry_point: str) -> tuple[str, tuple[Check, ...]]:
    """(setup, checks) of a problem's test: its top-level code but `check`, and each statement
    of `check`'s body as a check (asserts of a known shape judged outside, the rest in the
    program's process)."""
    module = ast.parse(test)
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise ValueError("no single check(candidate) function")
    (function,) = checks
    if [a.arg for a in function.args.args] != ["candidate"]:
        raise ValueError("check takes something else than (candidate)")
    setup = "\n".join(ast.unparse(n) for n in module.body if n is not function)
    # the replayed form: a call of the function by its own name is a call of `candidate` too
    # (made before the renaming below, which edits the tree)
    copy = ast.parse(ast.unparse(function))
    original = ast.unparse(_Rename(entry_point, "candidate").visit(copy))
    out = []
    for statement in function.body:
        if isinstance(statement, ast.Assert) and _always_true(statement.test):
            continue  # `assert True, "…"`: holds whatever the program does
        source = ast.unparse(_Rename("candidate", entry_point).visit(statement))
        out.append(plan(source) if isinstance(statement, ast.Assert) else Check("exec", source))
    if all(c.outside for c in out):
        return setup, tuple(out)
    # loops, helpers, asserts of other shapes: the whole check() is replayed outside
    return setup, (Check("replay", original, entry_point),)


def _always_true(test: ast.expr) -> bool:
    try:
        return bool(ast.literal_eval(test))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def extract_program(text: str) -> str | None:
    """The answer in a generation: a fenced block, else the raw text up to the first line
    after its start that begins at the left margin (where a completion's function ends)."""
    block = fenced_block(text)
    if block is not None:
        return block or None
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        return None
    kept = lines[start : start + 1]
    if lines[start][:1] in (" ", "\t"):  # a body: it ends where the margin is reached again
        for line in lines[start + 1 :]:
            if line.strip() and line[:1] not in (" ", "\t"):
                break
            kept.append(line)
    else:
        kept = lines[start:]
    out = "\n".join(kept).rstrip()
    return out or None


@dataclass(frozen=True)
class HumanEvalConfig(MbppConfig):
    # a .jsonl[.gz] file or a folder (holding HumanEval.jsonl[.gz], or humaneval/ with it);
    # None: $DLLMBENCH_DATA/humaneval/ when it exists, else the packaged copy
    data: str | None = None
    # a revision of openai/openai_humaneval to load from the Hub instead of the packaged copy
    revision: str | None = None


class HumanEval(Mbpp):
    """HumanEval graded by execution on MBPP's sandbox and judge; prompts `chat`, `fewshot`."""

    Config = HumanEvalConfig
    contract_configs: ClassVar[list[dict]] = [{}]

    def _task_data(self) -> TaskData:
        return TaskData(
            "humaneval",
            data=self.config.data,
            revision=self.config.revision,
            files={"test": FILE},
            hub=HUB,
            sizes=SIZES,
            check=_check_row,
        )

    def problems(self, split: str) -> list[Problem]:
        out = []
        for row in self._data.rows(split):
            f = row.fields
            setup, checks = _checks(f["test"], f["entry_point"])
            gold = Tests(
                tuple(c.source for c in checks),
                setup,
                f["prompt"] + f["canonical_solution"],
                checks,
                prefix=f["prompt"],
            )
            meta = {
                "task_id": f["task_id"],
                "entry_point": f["entry_point"],
                "source": row.where,
                "judged_in_process": sum(not c.outside for c in checks),
                "replayed": any(c.kind == "replay" for c in checks),
            }
            # "HumanEval/7" → "7": an id that is safe in any file name
            out.append(Problem(f["task_id"].rsplit("/", 1)[-1], f["prompt"], gold, meta))
        return out

    def prompt(self, problem: Problem, style: str) -> Prompt:
        if style == "chat":
            name = problem.meta["entry_point"]
            return Prompt(
                messages=(
                    {
                        "role": "user",
                        "content": (
                            f"Complete the Python function `{name}`:\n\n```python\n"
                            f"{problem.question.rstrip()}\n```\n\nWrite the whole function, "
                            "with the imports it needs, in one ```python code block."
                        ),
                    },
                )
            )
        if style == "fewshot":
            return Prompt(text=problem.question)
        raise UserError(f"humaneval has prompt styles chat and fewshot, not {style!r}")

    def extract(self, text: str) -> str | None:
        return extract_program(text)


@hookimpl
def dllmbench_register_tasks(register):
    register("humaneval", HumanEval)
