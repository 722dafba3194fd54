"""math500: boxed extraction, math-verify grading in workers, and the per-grade time limit."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from dllmbench.core.types import Problem
from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.math500 import EXEMPLARS, Math500, last_boxed, normalize

DATA = PACKAGED  # the copy shipped with dllmbench, named explicitly ($DLLMBENCH_DATA aside)


@pytest.fixture(scope="module")
def task():
    task = Math500(data=str(DATA))
    yield task
    task.close()


def _rows() -> list[dict]:
    with gzip.open(DATA / "math500" / "test.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_problems(task):
    problems = task.problems("test")
    assert task.splits() == {"test": 500} and len(problems) == 500
    assert problems[0].id == "test/precalculus/807.json"
    assert problems[0].meta["subject"] == "Precalculus" and "solution" not in problems[0].meta


def test_every_gold_verifies_against_itself_and_its_solutions_box(task):
    rows, problems = _rows(), task.problems("test")
    for row, problem in zip(rows, problems, strict=True):
        assert task.extract(row["solution"]) == row["answer"] == problem.gold
    assert all(task.grade_many([(p, p.gold, "") for p in problems]))
    boxed = [
        (p, task.extract(r["solution"]), r["solution"]) for r, p in zip(rows, problems, strict=True)
    ]
    assert all(task.grade_many(boxed))


EXTRACT = [
    ("so the answer is $\\boxed{5}$.", "5"),
    ("\\boxed{1} first, then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    (
        "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}",
        "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    ),
    ("nested \\boxed{\\{1, \\{2\\}\\}} ok", "\\{1, \\{2\\}\\}"),
    ("$\\fbox{42}$", "42"),
    ("\\boxed 7$ and more", "7"),
    ("\\boxed{\\frac{1}{2}", None),  # cut off: unbalanced
    ("\\boxed{}", None),
    ("no box, answer is 5", None),
    ("", None),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


PAIRS = [
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac12", "1/2", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("x^2+1", "1+x^2", True),
    ("3", "3.0", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("90^\\circ", "90", True),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
    ("x=5", "5", True),
    ("\\text{(C)}", "C", True),
    ("-\\frac{2}{3}", "\\frac{-2}{3}", True),
    ("1000", "1,000", True),
    ("(1,2)", "(2,1)", False),
    ("[1,2)", "[1,2]", False),
    ("3", "3.5", False),
    ("2", "-2", False),
    ("\\pi", "3.14", False),
    ("(-\\infty, 3]", "(-\\infty,3)", False),
]


@pytest.mark.parametrize("gold,answer,expected", PAIRS)
def test_equivalent_and_different_pairs(task, gold, answer, expected):
    problem = Problem("p", "q", gold)
    assert task.grade(problem, answer, f"\\boxed{{{answer}}}") is expected


def test_grade_many_matches_grade(task):
    items = [(Problem(f"p{i}", "q", g), a, "") for i, (g, a, _) in enumerate(PAIRS)]
    assert task.grade_many([*items, (items[0][0], None, "")]) == [e for *_, e in PAIRS] + [False]


def test_answer_keys():
    assert normalize("\\dfrac{1}{2}") == normalize("\\frac12") == normalize("0.5")
    assert normalize("\\left( 1, 2 \\right)") == normalize("(1,2)")
    assert normalize("90^\\circ") == normalize("90")
    assert normalize("\\text{Monday}") == "Monday"
    assert normalize("x = 3") == "3"
    assert normalize("3") != normalize("-3")


@pytest.mark.slow
def test_a_grade_that_runs_too_long_counts_wrong_within_its_limit():
    task = Math500(data=str(DATA), timeout=1.0, workers=1)
    try:
        problem = Problem("p", "q", "3")
        assert task.grade(problem, "3", "")  # starts the worker
        start = time.monotonic()
        assert task.grade(problem, "9^{9^{9^{9}}}", "") is False  # sympy would never return
        assert time.monotonic() - start < 2.0
        worker = task._pool.workers[0]
        assert worker.proc is None  # killed
        assert task.grade(problem, "3.0", "")  # a fresh worker grades the next answer
        worker.proc.kill()  # a worker that dies between grades is replaced
        worker.proc.wait()
        assert task.grade(problem, "\\frac{6}{2}", "")
        assert not task.grade(problem, "4", "")
    finally:
        task.close()


FAKE_MATH_VERIFY = """
import json, os

def _log(**kw):
    with open(os.environ["FAKE_MATH_VERIFY_LOG"], "a") as fh:
        fh.write(json.dumps(kw) + "\\n")

def parse(pred, parsing_timeout=5):
    _log(call="parse", timeout=parsing_timeout)
    return pred

def verify(gold, target, timeout_seconds=5):
    _log(call="verify", timeout=timeout_seconds)
    return gold == target
"""


@pytest.mark.parametrize("config,seconds", [({}, 30), ({"timeout": 2.5}, 3)])
def test_the_grade_timeout_reaches_math_verify(tmp_path, monkeypatch, config, seconds):
    """The task's `timeout` (default 30 s, the paper's grader) is what the worker gives
    math-verify's parse and verify, not math-verify's own 5 s (a stand-in math_verify records
    the arguments, so nothing waits)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "math_verify.py").write_text(FAKE_MATH_VERIFY)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(fake))
    monkeypatch.setenv("FAKE_MATH_VERIFY_LOG", str(log))
    task = Math500(data=str(DATA), workers=1, **config)
    assert task.config.timeout == config.get("timeout", 30.0)
    try:
        assert task.grade(Problem("p", "q", "3"), "3", "")
    finally:
        task.close()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["call"] for c in calls] == ["parse", "parse", "verify"]
    assert all(c["timeout"] == seconds for c in calls), calls


def test_prompts(task):
    problem = task.problems("test")[0]
    chat = task.prompt(problem, "chat")
    assert (
        "\\boxed{}" in chat.messages[0]["content"]
        and chat.messages[1]["content"] == problem.question
    )
    text = task.prompt(problem, "fewshot").text
    assert text.count("Problem:\n") == 5 and text.endswith(f"{problem.question}\n\nSolution:")
    assert text.count("\\boxed{") == 4
    questions = {r["problem"].strip() for r in _rows()}
    assert not any(q.strip() in questions for q, _ in EXEMPLARS)  # no test problem as a shot
