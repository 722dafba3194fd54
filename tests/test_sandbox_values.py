"""Values a legitimate program returns are judged as Python's own assert would judge them:
subclasses of the builtin types through their base type, Fraction and Decimal as numbers,
numpy scalars and arrays as numpy values (a one-element array equals its number and is within
a tolerance of it, a float32 is subtracted in float32; `numpy.True_`
is not `True`), dict views as views; a class with its own equality cannot
pass where Python's assert fails. Each case runs twice in the sandbox: as the plain asserts,
and through the judge outside the program."""

from __future__ import annotations

import pytest

from dllmbench.core.types import Problem
from dllmbench.tasks import mbpp
from dllmbench.tasks.mbpp_judge import plan
from dllmbench.tasks.sandbox import Limits, Sandbox

pytestmark = pytest.mark.slow

# name → (program defining f, asserts a correct f passes)
PASSING = {
    "namedtuple for a tuple": (
        "import collections\nP = collections.namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)",
        ["assert f() == (1, 2)", "assert f() != (2, 1)"],
    ),
    "list subclass": (
        "class L(list):\n    pass\ndef f():\n    return L([1, [2]])",
        ["assert f() == [1, [2]]"],
    ),
    "UserList": (
        "import collections\ndef f():\n    return collections.UserList([3])",
        ["assert f() == [3]"],
    ),
    "UserDict": (
        "import collections\ndef f():\n    return collections.UserDict(a=1)",
        ["assert f() == {'a': 1}"],
    ),
    "UserString": (
        "import collections\ndef f():\n    return collections.UserString('ab')",
        ["assert f() == 'ab'"],
    ),
    "str subclass": (
        "class S(str):\n    pass\ndef f():\n    return S('ab')",
        ["assert f() == 'ab'"],
    ),
    "int subclass": (
        "class I(int):\n    pass\ndef f():\n    return I(-7)",
        ["assert f() == -7", "assert math.isclose(f(), -7)"],
    ),
    "IntEnum": (
        "import enum\nclass C(enum.IntEnum):\n    A = 2\ndef f():\n    return C.A",
        ["assert f() == 2"],
    ),
    "float subclass": (
        "class F(float):\n    pass\ndef f():\n    return F(0.5)",
        ["assert f() == 0.5"],
    ),
    "dict subclass and Counter": (
        "import collections\ndef f():\n    return collections.Counter('aab')",
        ["assert f() == {'a': 2, 'b': 1}"],
    ),
    "set subclass": (
        "class Z(set):\n    pass\ndef f():\n    return Z({1, 2})",
        ["assert f() == {1, 2}"],
    ),
    "Fraction": (
        "from fractions import Fraction\ndef f():\n    return Fraction(1, 2)",
        ["assert f() == 0.5", "assert math.isclose(f(), 0.5)", "assert f() != 1"],
    ),
    "Decimal": (
        "from decimal import Decimal\ndef f():\n    return Decimal('2.50')",
        ["assert f() == 2.5", "assert math.isclose(f(), 2.5)"],
    ),
    "numpy scalars": (
        "import numpy as np\ndef f():\n    return np.float64(1.5)\ndef g():\n"
        "    return np.int64(4)\ndef h():\n    return np.bool_(True)",
        ["assert f() == 1.5", "assert g() == 4", "assert h() == True", "assert h()"],
    ),
    "numpy 0-d array": (
        "import numpy as np\ndef f():\n    return np.array(3) * 2",
        ["assert f() == 6", "assert math.isclose(f(), 6.0)"],
    ),
    "numpy one-element array": (
        "import numpy as np\ndef f():\n    return np.array([5])\ndef g():\n"
        "    return np.array([[0.5]])",
        ["assert f() == 5", "assert f() == [5]", "assert g() == 0.5", "assert f() != 4"],
    ),
    "numpy one-element arrays and scalars within a tolerance": (
        "import numpy as np\ndef f():\n    return np.array([0.5000001])\ndef g():\n"
        "    return np.array([[2]])\ndef h():\n    return np.float32(0.1)",
        [
            "assert abs(f() - 0.5) < 1e-06",
            "assert abs(0.5 - f()) < 1e-06",
            "assert abs(g() - 2.0) < 1e-09",
            "assert abs(h() - 0.1) < 1e-09",
            "assert math.isclose(h(), 0.1, rel_tol=1e-06)",
        ],
    ),
    "dict keys and items for sets": (
        "def f():\n    return {1: 'a', 2: 'b'}.keys()\ndef g():\n    return {1: 'a'}.items()",
        ["assert f() == {1, 2}", "assert g() == {(1, 'a')}", "assert f() != {1}"],
    ),
    "numpy with threads off": (
        "import numpy as np\ndef f():\n    a = np.ones((64, 64))\n    return float((a @ a).sum())",
        ["assert f() == 262144.0"],
    ),
}

# name → (program, asserts Python's own assert fails): the judge must fail them too
FAILING = {
    "always-False __eq__": (
        "class D(dict):\n    def __eq__(self, other):\n        return False\n"
        "    __hash__ = None\ndef f():\n    return D(a=1)",
        ["assert f() == {'a': 1}"],
    ),
    "always-False __eq__ on a tuple": (
        "class T(tuple):\n    def __eq__(self, other):\n        return False\n"
        "    __hash__ = tuple.__hash__\ndef f():\n    return T((1,))",
        ["assert f() == (1,)"],
    ),
    "falsy by __bool__": (
        "class L(list):\n    def __bool__(self):\n        return False\ndef f():\n"
        "    return L([1])",
        ["assert f()"],
    ),
    "numpy.True_ is not True": (
        "import numpy as np\ndef f():\n    return np.bool_(True)",
        ["assert f() is True"],
    ),
    "a longer array is asserted equal to nothing": (
        "import numpy as np\ndef f():\n    return np.array([1, 2])",
        ["assert f() == [1, 2]"],
    ),
    "a longer array within a tolerance is no truth": (
        "import numpy as np\ndef f():\n    return np.array([0.5, 0.5])",
        ["assert abs(f() - 0.5) < 1e-06"],
    ),
    "an empty array within a tolerance is no truth": (
        "import numpy as np\ndef f():\n    return np.array([])",
        ["assert abs(f() - 0.5) < 1e-06"],
    ),
    "a one-element array outside the tolerance": (
        "import numpy as np\ndef f():\n    return np.array([0.51])",
        ["assert abs(f() - 0.5) < 1e-06"],
    ),
    "dict values are no list": (
        "def f():\n    return {1: 'a'}.values()",
        ["assert f() == ['a']"],
    ),
    "deque is no list": (
        "import collections\ndef f():\n    return collections.deque([1])",
        ["assert f() == [1]"],
    ),
}


def _plain(program: str, asserts: list[str], isolation: str) -> bool:
    steps = [("program", "import math\n" + program), *[("t", a) for a in asserts]]
    return Sandbox(Limits(timeout=20), isolation).run(steps).passed


def _judged(program: str, asserts: list[str], isolation: str) -> bool:
    checks = tuple(plan(a) for a in asserts)
    assert all(c.outside for c in checks), checks
    problem = Problem("t", "", mbpp.Tests(tuple(asserts), "", "", checks), {})
    sandbox = Sandbox(Limits(timeout=20), isolation)
    outcome = sandbox.run(mbpp.Mbpp.steps(problem, "import math\n" + program))
    return mbpp.Mbpp.judge(problem, outcome).passed


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
@pytest.mark.parametrize("name", PASSING)
def test_a_legitimate_value_passes(name, isolation):
    program, asserts = PASSING[name]
    assert _plain(program, asserts, isolation)
    assert _judged(program, asserts, isolation)


@pytest.mark.parametrize("name", FAILING)
def test_a_value_pythons_assert_fails_fails(name):
    program, asserts = FAILING[name]
    assert not _plain(program, asserts, "namespaces")
    assert not _judged(program, asserts, "namespaces")
