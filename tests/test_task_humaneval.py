"""humaneval: the packaged data, extraction, the program an answer makes, every canonical
solution passing on MBPP's judge, the MBPP cheat suite graded wrong, and a run end to end."""

from __future__ import annotations

import gzip
import hashlib

import pytest
from test_mbpp_cheats import CHEATS

from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.humaneval import HumanEval, extract_program
from dllmbench.tasks.mbpp import assemble

pytestmark = pytest.mark.slow

SHA256 = "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2"


@pytest.fixture(scope="module")
def task() -> HumanEval:
    return HumanEval(data=str(PACKAGED), timeout=10.0)


@pytest.fixture(scope="module")
def problems(task):
    return task.problems("test")


def _body(problem) -> str:
    return problem.gold.reference[len(problem.gold.prefix) :]


def test_the_packaged_data_is_upstreams(task):
    raw = gzip.decompress((PACKAGED / "humaneval" / "HumanEval.jsonl.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == SHA256
    assert HumanEval().data_files() == {"dllmbench:humaneval/HumanEval.jsonl": SHA256}
    assert (PACKAGED / "humaneval" / "LICENSE").read_text().startswith("The MIT License")
    assert task.splits() == {"test": 164}


def test_checks_are_judged_outside_where_their_shape_is_known(problems):
    assert [p.id for p in problems[:2]] == ["0", "1"] and len(problems) == 164
    first = problems[0]
    assert first.meta["entry_point"] == "has_close_elements"
    assert first.meta["judged_in_process"] == 0
    assert all(c.kind == "eq" and "has_close_elements(" in c.actual for c in first.gold.checks)
    # nothing is judged in the program's process: a check() with statements the judge does not
    # know (loops, helpers) is replayed whole, in a run of its own
    assert sum(p.meta["judged_in_process"] for p in problems) == 0
    replayed = [p.id for p in problems if p.meta["replayed"]]
    assert replayed == ["32", "33", "38", "44", "50", "53", "129", "151"]
    for problem in problems:
        kinds = {c.kind for c in problem.gold.checks}
        assert kinds == {"replay"} if problem.meta["replayed"] else "replay" not in kinds


@pytest.mark.parametrize(
    "text,expected",
    [
        ("    return x + 1\n\ndef other():\n    pass", "    return x + 1"),
        (
            "\n    if x:\n        return 1\n    return 2\nprint(f(1))",
            "    if x:\n        return 1\n    return 2",
        ),
        ("```python\ndef f(x):\n    return x\n```\ntrailing", "def f(x):\n    return x"),
        (
            "def f(x):\n    return x\n\ndef g():\n    pass",
            "def f(x):\n    return x\n\ndef g():\n    pass",
        ),
        ("   \n\n", None),
    ],
)
def test_extract_program(text, expected):
    assert extract_program(text) == expected


def test_an_answer_completes_the_prompt_or_follows_it():
    prompt = 'from typing import List\n\n\ndef f(x: List[int]) -> int:\n    """Doc."""\n'
    assert assemble(prompt, "    return 1") == prompt + "    return 1"
    whole = "def f(x):\n    return 2"
    assert assemble(prompt, whole) == prompt.rstrip("\n") + "\n\n\n" + whole
    assert assemble("", whole) == whole


def test_every_canonical_solution_passes(task, problems):
    grades = task.grade_many([(p, _body(p), "") for p in problems])
    failed = [p.id for p, ok in zip(problems, grades, strict=True) if not ok]
    assert failed == []
    # a whole-function answer (as a chat answer gives it) passes too
    first = problems[0]
    assert task.grade(first, first.gold.reference, "")
    assert not task.grade(first, "    return None", "")


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_the_mbpp_cheats_are_graded_wrong(task, problems, name):
    """Each cheat of the MBPP suite, aimed at problem 0 (every check judged outside) and at a
    problem whose check() is replayed (a loop over seeded random inputs)."""
    mixed = next(p for p in problems if p.id == "32")
    for problem in (problems[0], mixed):
        cheat = CHEATS[name].replace("remove_Occ", problem.meta["entry_point"])
        text = f"```python\n{cheat}\n```"
        answer = task.extract(text)
        assert not task.grade(problem, answer, text), (problem.id, task.run(problem, answer))


def test_a_run_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    argv = ["run", "--task", "humaneval", "--backbone", "tiny", "--limit", "2", "--budget", "16"]
    argv += ["--methods", "vanilla", "--steps", "4", "--gen-length", "16", "--out", out]
    result = cli(*argv)
    assert result.code == 0, result.err
    assert "humaneval" in result.out and (out / "manifest.json").is_file()
    # the tiny model knows arith's words only: the run says so once, in one line
    (said,) = [line for line in result.err.splitlines() if "warning" in line]
    assert said.startswith("dllmbench: warning: ") and "not in the vocabulary" in said
    assert "'def'" in said and "<|endoftext|>" in said


def test_a_replayed_check_runs_where_the_program_cannot_reach_it(task, problems):
    """Problem 53 checks `add` on 100 random pairs in a loop, in a run with no program: the
    program only answers calls. Fixing `random` in its own process changes no question;
    records written beside the answers (on any descriptor) end the conversation."""
    problem = next(p for p in problems if p.id == "53")
    assert problem.meta["replayed"]
    easy = (
        "import random\n"
        "random.randint = lambda a, b: 0\n"
        "random.seed = lambda *a, **k: None\n"
        "def add(x, y):\n"
        "    return {(0, 1): 1, (1, 0): 1, (2, 3): 5, (5, 7): 12, (7, 5): 12}.get((x, y), 0)\n"
    )
    assert not task.grade(problem, easy, "")
    assert task.grade(problem, "def add(x, y):\n    return x + y\n", "")
    forged = (
        "import os\n"
        "def add(x, y):\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        "            os.write(fd, b\"11\\n('i','0x0')\")\n"
        "        except OSError:\n"
        "            pass\n"
        "    return x + y\n"
    )
    assert not task.grade(problem, forged, "")


# Looks for check() from inside the program's function, as a program that solves nothing would:
# up the frames (check's locals hold the expected string of 38 and 50, the sum of 151), through
# the collector (check's code and its constants), and prints what it saw.
PEEK = """
import gc, sys
def ENTRY(*args, **kwargs):
    frame, names = sys._getframe(1), []
    while frame is not None:
        names.append(frame.f_code.co_name)
        for key in ("str", "odd_sum"):
            if frame.f_code.co_name == "check" and key in frame.f_locals:
                return frame.f_locals[key]
        frame = frame.f_back
    codes = [o for o in gc.get_objects() if getattr(o, "__name__", "") == "check"]
    print("frames:", names, "checks:", len(codes))
    if codes:
        return codes[0].__code__.co_consts[-1]
    return args[0] if args else None
"""


def test_no_replayed_check_is_in_the_programs_reach(task, problems):
    """A program that solves nothing and looks for check() in its own process (frames, the
    collector) passes none of the 8 replayed problems: check() runs in a run of its own, and
    the program sees only each call's arguments, as data."""
    replayed = [p for p in problems if p.meta["replayed"]]
    assert len(replayed) == 8
    answers = [PEEK.replace("ENTRY", p.meta["entry_point"]) for p in replayed]
    grades = task.grade_many([(p, a, "") for p, a in zip(replayed, answers, strict=True)])
    assert grades == [False] * 8
    outcome = task.run(replayed[0], answers[0])
    assert "checks: 0" in outcome.stdout and "'check'" not in outcome.stdout, outcome


def test_values_a_check_converts_are_judged_as_python_judges_them(task, problems):
    """HumanEval/33 wraps each answer in `tuple()`: a function that returns an iterator, a
    `map` or a generator passes as a list does; one that raises on a call fails."""
    problem = next(p for p in problems if p.id == "33")
    solve = "def sort_third(l):\n    l = list(l)\n    l[::3] = sorted(l[::3])\n    return WRAP\n"
    for wrap in ("l", "iter(l)", "map(int, l)", "(v for v in l)", "tuple(l)"):
        assert task.grade(problem, solve.replace("WRAP", wrap), ""), wrap
    assert not task.grade(problem, solve.replace("WRAP", "map(int, l[1:])"), "")
    assert not task.grade(problem, solve.replace("WRAP", "1 / 0"), "")


def test_a_judge_that_ends_on_a_limit_is_a_timeout_not_an_error(problems, monkeypatch):
    """A judge's run that ends on its limits (made here to time out) fails the answer, and the
    run goes on."""
    task = HumanEval(data=str(PACKAGED), timeout=2.0)
    problem = next(p for p in problems if p.id == "53")
    monkeypatch.setattr(
        task, "judge_steps", lambda problem: [("blocker", "import time\ntime.sleep(60)")]
    )
    outcome = task.run(problem, "def add(x, y):\n    return x + y\n")
    assert not outcome.passed and outcome.status == "timeout"
