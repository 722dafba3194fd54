"""mbpp: programs written to fool the grader, each graded wrong through `extract` and `grade`
in real sandbox runs; and the judge's parsing and decoding of values."""

from __future__ import annotations

import pytest

from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.mbpp import Mbpp
from dllmbench.tasks.mbpp_judge import Undecodable, decode, plan

# finds the boot code's nonce or marker: in the locals of every frame, then through gc
FIND = """
import gc, os, re, sys
def find():
    seen = []
    f = sys._getframe()
    while f is not None:
        seen += list(f.f_locals.values())
        f = f.f_back
    seen += gc.get_objects()
    for obj in list(seen):
        if isinstance(obj, dict):
            seen += list(obj.values())
    for v in seen:
        if isinstance(v, bytes) and re.fullmatch(rb"\\n[0-9a-f]{32}\\n", v):
            return v
        if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v):
            return ("\\n" + v + "\\n").encode()
    return None
"""

CHEATS = {
    "exec_patched": "import builtins\nbuiltins.exec = lambda *a, **k: None",
    "eval_and_exec_patched": "import builtins\nbuiltins.exec = builtins.eval = lambda *a, **k: 0",
    "eq_always_true": (
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "def remove_Occ(*args):\n    return Anything()"
    ),
    "eq_always_true_str_subclass": (
        "class S(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n"
        "def remove_Occ(*args):\n    return S('x')"
    ),
    "steps_emptied_through_frames": (
        "import sys\nf = sys._getframe()\nwhile f is not None:\n"
        "    for v in list(f.f_locals.values()):\n"
        "        if isinstance(v, (list, dict)):\n            v.clear()\n"
        "    f = f.f_back"
    ),
    "nonce_from_frames_or_gc": FIND + "m = find()\nassert m\nos.write(1, m)\nos._exit(0)",
    "os_exit_wrapped": FIND
    + "m = find()\nreal = os._exit\n"
    + "def fake(code):\n    os.write(1, m)\n    real(0)\n"
    + "os._exit = fake\n"
    + "def remove_Occ(s, ch):\n    return s",
    "marker_on_first_call": FIND
    + "def remove_Occ(s, ch):\n    m = find()\n    os.write(1, m or b'')\n    os._exit(0)",
    "values_forged": (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n        os.write(fd, b\"8\\n('s','x')\" * 3)\n"
        "    except OSError:\n        pass\n"
        "def remove_Occ(s, ch):\n    return s"
    ),
}


@pytest.fixture(scope="module")
def task() -> Mbpp:
    return Mbpp(data=str(PACKAGED), timeout=10.0)


@pytest.fixture(scope="module")
def problem(task):
    problem = task.problems("test")[0]
    assert problem.id == "11" and "remove_Occ" in problem.gold.reference
    assert problem.meta["judged_in_process"] == 0
    return problem


def test_the_reference_passes(task, problem):
    text = f"```python\n{problem.gold.reference}\n```"
    assert task.grade(problem, task.extract(text), text)


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_graded_wrong(task, problem, name):
    text = f"```python\n{CHEATS[name]}\n```"
    answer = task.extract(text)
    assert answer == CHEATS[name].strip("\n")
    assert not task.grade(problem, answer, text), task.run(problem, answer)


def test_cheat_with_the_right_function_too_is_graded_wrong(task, problem):
    # the reference, then a patch that would turn every later failure into a pass
    answer = (
        problem.gold.reference
        + "\n"
        + CHEATS["os_exit_wrapped"].replace(
            "def remove_Occ(s, ch):\n    return s", "def remove_Occ(s, ch):\n    return 'wrong'"
        )
    )
    assert not task.grade(problem, answer, answer)


def test_plans():
    assert plan("assert f(1) == 1, 2").kind == "eq"
    assert plan("assert [1] == f(1)").actual == "f(1)"
    assert plan("assert f(1) < 2").kind == "exec"
    assert plan("assert isinstance(f(1), int)").kind == "exec"
    assert plan("assert not f(1)").kind == "false"
    check = plan("assert math.isclose(f(1), 2.5, rel_tol=0.001)")
    assert (check.kind, check.actual, check.rel_tol) == ("isclose", "f(1)", 0.001)
    check = plan("assert f((1,)) == sys.getsizeof((1,))")
    assert check.before and check.expected == "sys.getsizeof((1,))"
    # expected sides of pure builtins and arithmetic: computed in a run with no program
    check = plan("assert tuple(f(1)) == tuple([1, 2])")
    assert check.before and check.actual == "tuple(f(1))" and check.expected == "tuple([1, 2])"
    assert plan("assert f(1) == (3 + 5, 3 * 5)").before
    assert plan("assert f(1) == g(2)").kind == "exec"  # a name the program may define
    assert plan("assert f(1) == len(x)").kind == "exec"  # a name the test defines
    check = plan("assert abs(f(1.5) - 2.0 / 3.0) < 1e-06")
    assert (check.kind, check.actual, check.abs_tol) == ("abs_lt", "f(1.5)", 1e-06)
    assert check.before and check.expected == "2.0 / 3.0"
    assert plan("assert abs(f(1) - 0.5) < t").kind == "exec"  # a tolerance that is no literal


def test_decoder_is_strict():
    assert decode("('l',(('i','0x3'),('f','nan'),('N',),('b',1)))")[0] == 3
    assert decode("('d',((('s','a'),('S',(('i','-0x1'),))),))") == {"a": {-1}}
    twice = "(('i','0x1'),('i','0x1'),)"  # equal members: a program's own __hash__ at work
    merged = (f"('S',{twice})", f"('F',{twice})", f"('K',{twice})")
    merged += ("('d',((('i','0x1'),('N',)),(('f','0x1p+0'),('N',)),))",)
    for bad in (
        "3",
        "('x',)",
        "('i',3)",
        "('S',(('l',()),))",
        "__import__('os')",
        "('s',)",
        *merged,
    ):
        with pytest.raises(Undecodable):
            decode(bad)


def test_a_set_that_holds_its_members_twice_is_graded_wrong(task):
    """Equal members with a hash of their own per instance: Python's set keeps both, so the
    assert fails; the grader refuses the record rather than merge them (task 473)."""
    problem = next(p for p in task.problems("test") if p.id == "473")
    program = (
        "import itertools\n_n = itertools.count()\n"
        "class H(int):\n    def __hash__(self):\n        return next(_n)\n"
        "def tuple_intersection(a, b):\n"
        "    want = {tuple(sorted(x)) for x in a} & {tuple(sorted(x)) for x in b}\n"
        "    return {tuple(H(v) for v in t) for t in want for _ in (0, 1)}\n"
    )
    assert not task.grade(problem, task.extract(f"```python\n{program}\n```"), "")
    honest = program.replace("tuple(H(v) for v in t)", "t")
    assert task.grade(problem, task.extract(f"```python\n{honest}\n```"), "")


def test_in_process_asserts_are_counted(task):
    problems = [p for split in task.splits() for p in task.problems(split)]
    assert sum(p.meta["judged_in_process"] for p in problems) == 0
    outside = sum(len(p.gold.checks) for p in problems)
    assert outside == 2922
