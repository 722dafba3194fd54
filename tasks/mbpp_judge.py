"""Judging MBPP asserts outside the program.

Each assert is parsed with `ast`. When it has a shape this module knows, the sandbox evaluates
only the side that involves the program (the "actual" expression) and returns its value as data
(`_sandbox_boot._encode`: builtin values, recursively); the grader rebuilds the value
here with a strict decoder, obtains the expected side itself and compares, so nothing the
program does to its own interpreter (builtins, frames, `__eq__`, the exit path) can make a wrong
value compare equal. Shapes:

- `assert A == E`, `assert E == A`, `assert A != E` (and `is` / `is not` with None, True, False);
- `assert A` and `assert not A` (the value's truth, taken here);
- `assert math.isclose(A, E[, rel_tol=…, abs_tol=…])` (the tolerances must be literals);
- `assert abs(A - E) < T` (T a literal).

E is a literal (`ast.literal_eval`, evaluated here), or an expression over the modules `math`
and `sys` and a few pure builtins only (e.g. `sys.getsizeof((1, 2))`, `2.0 / 3.0`,
`tuple([1, 2])`): the sandbox evaluates that one in a run of its own, with no program. Any
other assert runs in the program's process (`Check.kind == "exec"`), and is counted.
"""

from __future__ import annotations

import ast
import builtins
import collections
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MODULES = ("math", "sys")  # names an expected side computed in the sandbox may use
# builtins an expected side computed in the sandbox may call (in a run with no program, so they
# are Python's own): the conversions and folds tests write expected values with
PURE_BUILTINS = ("abs", "dict", "float", "frozenset", "int", "len", "list", "max", "min")
PURE_BUILTINS += ("round", "set", "sorted", "str", "sum", "tuple")
SINGLETONS = (None, True, False)


@dataclass(frozen=True)
class Check:
    """How one assert is judged."""

    kind: str  # eq, ne, is, is_not, true, false, isclose, abs_lt; exec: in the program's process
    source: str  # the assert
    actual: str = ""  # the expression the sandbox evaluates after the program
    expected: str = ""  # a literal (evaluated here) or, with `before`, an expression
    before: bool = False  # the expected side is evaluated in the sandbox before the program
    rel_tol: float = 1e-9
    abs_tol: float = 0.0

    @property
    def outside(self) -> bool:
        return self.kind != "exec"


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _module_only(node: ast.AST) -> bool:
    """An expression that uses no name but `math`, `sys` and a few pure builtins (so no name
    the program or the test defines), e.g. `sys.getsizeof((1,))`, `2.0 / 3.0` or
    `tuple([1, 2])`."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    banned = (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)
    comprehension = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    return names <= set(MODULES + PURE_BUILTINS) and not any(
        isinstance(n, banned + comprehension) for n in ast.walk(node)
    )


def _expected(node: ast.AST) -> tuple[str, bool] | None:
    if _literal(node):
        return ast.unparse(node), False
    if _module_only(node):
        return ast.unparse(node), True
    return None


def plan(source: str) -> Check:
    """How the assert `source` is judged."""
    inside = Check("exec", source)
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return inside
    if len(body) != 1 or not isinstance(body[0], ast.Assert):  # a message changes no verdict
        return inside
    test = body[0].test
    close = _abs_lt(source, test)
    if close is not None:
        return close
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not (isinstance(right, ast.Constant) and right.value in SINGLETONS):
                return inside
            if not any(right.value is s for s in SINGLETONS):
                return inside
            kind = "is" if isinstance(op, ast.Is) else "is_not"
            return Check(kind, source, ast.unparse(left), ast.unparse(right))
        kinds = {ast.Eq: "eq", ast.NotEq: "ne"}
        if type(op) not in kinds:
            return inside
        for actual, other in ((left, right), (right, left)):
            expected = _expected(other)
            if expected is not None and not _literal(actual):
                return Check(kinds[type(op)], source, ast.unparse(actual), *expected)
        return inside
    if (
        isinstance(test, ast.Call)
        and ast.unparse(test.func) == "math.isclose"
        and len(test.args) == 2
        and not any(isinstance(a, ast.Starred) for a in test.args)
    ):
        tols = {}
        for keyword in test.keywords:
            if keyword.arg not in ("rel_tol", "abs_tol") or not _literal(keyword.value):
                return inside
            value = ast.literal_eval(keyword.value)
            if type(value) not in (int, float) or not value >= 0:
                return inside
            tols[keyword.arg] = float(value)
        for actual, other in (tuple(test.args), tuple(reversed(test.args))):
            expected = _expected(other)
            if expected is not None and not _literal(actual):
                return Check("isclose", source, ast.unparse(actual), *expected, **tols)
        return inside
    kind = "true"
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        kind, test = "false", test.operand
    # only a call of the program's own function: a builtin's truth (isinstance, all, …) would
    # be computed in the program's process, where the program can patch it to say True
    own = isinstance(test, ast.Call) and isinstance(test.func, ast.Name)
    if own and test.func.id not in dir(builtins):
        return Check(kind, source, ast.unparse(test))
    return inside


def _abs_lt(source: str, test: ast.expr) -> Check | None:
    """`abs(A - E) < T` (either order of A and E), T a non-negative literal number."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Lt)
        and isinstance(test.left, ast.Call)
        and ast.unparse(test.left.func) == "abs"
        and len(test.left.args) == 1
        and not test.left.keywords
        and isinstance(test.left.args[0], ast.BinOp)
        and isinstance(test.left.args[0].op, ast.Sub)
        and _literal(test.comparators[0])
    ):
        return None
    tol = ast.literal_eval(test.comparators[0])
    if type(tol) not in (int, float) or not tol >= 0:
        return None
    difference = test.left.args[0]
    for actual, other in ((difference.left, difference.right), (difference.right, difference.left)):
        expected = _expected(other)
        if expected is not None and not _literal(actual) and not _module_only(actual):
            return Check("abs_lt", source, ast.unparse(actual), *expected, abs_tol=float(tol))
    return None


# -- values -----------------------------------------------------------------------------------

MAX_DEPTH = 64
_SEQUENCES = {"l": list, "t": tuple, "S": set, "F": frozenset}


class Undecodable(ValueError):
    """A record of the values pipe that is not a value the encoder could have written."""


def decode(text: str):
    """The value of one record (see `_sandbox_boot._encode`), rebuilt strictly here."""
    try:
        tree = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise Undecodable(f"not a literal: {exc}") from None
    return _build(tree, 0)


def _build(node, depth: int):
    if depth > MAX_DEPTH:
        raise Undecodable("nested too deeply")
    if type(node) is not tuple or not node or type(node[0]) is not str:
        raise Undecodable("not a tagged value")
    tag, args = node[0], node[1:]
    try:
        if tag == "N" and not args:
            return None
        if tag == "b" and len(args) == 1 and args[0] in (0, 1) and type(args[0]) is int:
            return bool(args[0])
        if tag == "i" and len(args) == 1 and type(args[0]) is str:
            return int(args[0], 16)
        if tag == "f" and len(args) == 1 and type(args[0]) is str:
            return float.fromhex(args[0])
        if tag == "c" and len(args) == 2 and all(type(a) is str for a in args):
            return complex(float.fromhex(args[0]), float.fromhex(args[1]))
        if tag == "s" and len(args) == 1 and type(args[0]) is str:
            return args[0]
        if tag == "y" and len(args) == 1 and type(args[0]) is bytes:
            return args[0]
        if tag in _SEQUENCES and len(args) == 1 and type(args[0]) is tuple:
            return _unique(
                tag, _SEQUENCES[tag](_build(item, depth + 1) for item in args[0]), args[0]
            )
        if tag == "q" and len(args) == 2 and all(type(a) is str for a in args):
            return Fraction(int(args[0], 16), int(args[1], 16))
        if tag == "D" and len(args) == 1 and type(args[0]) is str and len(args[0]) < 10_000:
            return Decimal(args[0])
        if tag == "Q" and len(args) == 1 and type(args[0]) is tuple:
            return collections.deque(_build(item, depth + 1) for item in args[0])
        if tag == "it" and len(args) == 1 and type(args[0]) is tuple:  # an iterator's items
            return iter([_build(item, depth + 1) for item in args[0]])
        if tag in _VIEWS and len(args) == 1 and type(args[0]) is tuple:
            view = _VIEWS[tag]([_build(item, depth + 1) for item in args[0]])
            return view if tag == "V" else _unique(tag, view, args[0])
        if tag == "n" and len(args) == 2 and type(args[0]) is str:
            return _numpy_dtype(args[0]).type(_build(args[1], depth + 1))
        if tag == "A" and len(args) == 3 and type(args[0]) is str and type(args[2]) is tuple:
            shape = _build(args[1], depth + 1)
            if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
                raise Undecodable("not an array's shape")
            items = [_build(item, depth + 1) for item in args[2]]
            return _numpy().array(items, dtype=_numpy_dtype(args[0])).reshape(shape)
        if tag == "d" and len(args) == 1 and type(args[0]) is tuple:
            out = {}
            for pair in args[0]:
                if type(pair) is not tuple or len(pair) != 2:
                    raise Undecodable("not a key-value pair")
                out[_build(pair[0], depth + 1)] = _build(pair[1], depth + 1)
            return _unique(tag, out, args[0])
    except (ValueError, TypeError, ArithmeticError, InvalidOperation) as exc:  # bad hex, 1/0
        raise Undecodable(str(exc)) from None
    raise Undecodable(f"unknown tag {tag!r}")


def _unique(tag: str, built, items: tuple):
    """A set, dict or keys/items view as rebuilt, refused when members merged: Python's own set
    never holds two equal members, so more items than members means a program's set (or dict)
    of members whose `__hash__` differs between equal values, which Python's assert compares
    with its duplicates (a set of six never equals one of three) and the rebuilt one without."""
    if tag in ("S", "F", "d", "K", "I") and len(built) != len(items):
        raise Undecodable("a set or dict with equal members")
    return built


# dict views, rebuilt from their items: keys and items compare as sets, values with nothing
_VIEWS = {
    "K": lambda items: dict.fromkeys(items).keys(),
    "V": lambda items: dict(enumerate(items)).values(),
    "I": lambda items: dict(_pairs(items)).items(),
}


def _pairs(items: list) -> list:
    if not all(type(p) is tuple and len(p) == 2 for p in items):
        raise Undecodable("a dict's items that are not pairs")
    return items


def _numpy():
    import numpy

    return numpy


def _numpy_dtype(text: str):
    """A numpy dtype of numbers or booleans, from its `dtype.str`; anything else is refused."""
    try:
        dtype = _numpy().dtype(text)
    except (TypeError, ValueError) as exc:
        raise Undecodable(f"not a dtype: {exc}") from None
    if dtype.kind not in "biufc" or dtype.str != text:
        raise Undecodable(f"not a numeric dtype: {text!r}")
    return dtype


def _number(value):
    """A numpy scalar or 0-d array as the Python number it holds (what `math.isclose` and
    `abs` take from it); anything else as it is."""
    numpy = __import__("sys").modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic | numpy.ndarray):
        if isinstance(value, numpy.ndarray) and value.ndim != 0:
            return value
        return value.item()
    return value


def _is_numpy(value) -> bool:
    numpy = __import__("sys").modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic | numpy.ndarray)


def _within(actual, expected, tolerance: float) -> bool:
    """`abs(A - E) < T` with a numpy side, computed by numpy as the assert computes it: a
    one-element result (a scalar, a 0-d or a one-element array) is its truth; a result of any
    other size makes the assert raise, so it fails."""
    numpy = __import__("sys").modules["numpy"]
    if numpy.size(actual) != 1 or numpy.size(expected) != 1:
        return False
    return bool(abs(actual - expected) < tolerance)


def holds(check: Check, actual, expected) -> bool:
    """Whether the assert holds for these values: builtin values here, compared here."""
    if check.kind == "abs_lt" and (_is_numpy(actual) or _is_numpy(expected)):
        try:
            return _within(actual, expected, check.abs_tol)
        except (ValueError, TypeError, ArithmeticError, RecursionError):
            return False
    if check.kind in ("isclose", "abs_lt"):
        actual, expected = _number(actual), _number(expected)
    try:
        if check.kind == "eq":
            return bool(actual == expected)
        if check.kind == "ne":
            return bool(actual != expected)
        if check.kind == "is":
            return actual is expected
        if check.kind == "is_not":
            return actual is not expected
        if check.kind == "true":
            return bool(actual)
        if check.kind == "false":
            return not actual
        if check.kind == "isclose":
            numbers = (int, float, bool, Fraction, Decimal)
            if type(actual) not in numbers or type(expected) not in numbers:
                return False
            return math.isclose(actual, expected, rel_tol=check.rel_tol, abs_tol=check.abs_tol)
        if check.kind == "abs_lt":
            numbers = (int, float, bool, Fraction, Decimal)
            if type(actual) not in numbers or type(expected) not in numbers:
                return False
            return bool(abs(actual - expected) < check.abs_tol)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return False
    raise ValueError(f"no verdict for a check of kind {check.kind!r}")
