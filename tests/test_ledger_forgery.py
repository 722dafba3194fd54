"""Strategies that try to get answers the ledger did not pay for, as a ledger red team wrote
them: a Pool built by hand, a forged state laundered through `ops.remask` or advanced by one
charged step, tokens changed after `ops.pool`, free forwards posted under another problem,
made-up pool scores, a nested pool whose cheap member gets a row only the large member paid
for, rows taken from another method, and a selector whose index runs a model when it is read.
Each finished with exit status 0 and an accuracy nobody paid for; each now stops the run in
one line, exit status 3, naming the plugin. This module registers the strategies."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.ops import DenoiseRequest, Posted
from dllmbench.core.types import Pool, Problem
from dllmbench.testing.doubles import EOS, encode_text

SHARED: dict[str, object] = {}  # what one method leaves for another (module state)


def written(problem: Problem, rows, gen: int) -> torch.Tensor:
    """The right answer written into every row, in Python: no forward."""
    a, b = map(int, problem.question.rstrip("=").split("+"))
    tokens = rows.tokens.clone()
    tokens[:, rows.prompt_len :] = torch.tensor((encode_text(str(a + b)) + [EOS] * gen)[:gen])
    return tokens


def majority(keys: list) -> int:
    counts = Counter(k for k in keys if k is not None)
    return keys.index(counts.most_common(1)[0][0]) if counts else 0


@dataclass(frozen=True)
class CheatConfig:
    how: str = "pool"
    n: int = 1


class Cheat:
    Config = CheatConfig
    prefix_field = None
    scorers = ()

    def __init__(self, **config):
        self.config = CheatConfig(**config)

    def cost(self, total_steps):
        return {"denoise": self.config.n * total_steps}

    def pool_size(self):
        return 1

    def pool_scores(self):
        return frozenset({"orm"}) if self.config.how == "scores" else frozenset()

    async def search(self, problem, ops):
        how, n = self.config.how, self.config.n
        rows = ops.start(problem, copies=n)
        forged = dataclasses.replace(
            rows, tokens=written(problem, rows, ops.gen_length), steps=(ops.T,) * n
        )
        if how == "pool":  # never through ops.pool
            return Pool(forged.take([0]))
        if how == "remask":  # a no-op edit as a laundry
            return ops.pool(ops.remask(forged.take([0]), sigma=0.0))
        if how == "last_step":  # one charged step from a state written by hand
            near = dataclasses.replace(forged, steps=(ops.T - 1,) * n)
            return ops.pool(await ops.denoise(near.take([0])))
        done = await ops.denoise(rows)
        if how == "after":  # the checked tokens, overwritten once ops.pool has looked
            pool = ops.pool(done.take([0]))
            pool.rows.tokens[:] = written(problem, pool.rows, ops.gen_length)
            return pool
        if how == "scores":  # the pool's "orm" scores made up: no score pass charged
            return ops.pool(done.take([0]), scores={"orm": np.array([9.0])})
        if how == "give":  # leave the rows for another method
            SHARED[problem.id] = done
            return ops.pool(done.take([0]))
        if how == "take":  # vote on another method's rows
            theirs = SHARED[problem.id]
            return ops.pool(theirs.take([majority(ops.answers(theirs))]))
        raise ValueError(how)


class Ghost(Cheat):
    """Eight free forwards posted under another problem's id, then the vote's winner."""

    def cost(self, total_steps):
        return {}

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=8)
        elsewhere = dataclasses.replace(rows, problem=Problem("ghost", problem.question, None))
        out = await Posted(DenoiseRequest(elsewhere, (ops.T,) * 8))
        back = dataclasses.replace(out, problem=ops.problem)
        return ops.pool(back.take([majority(ops.answers(back))]))


@dataclass(frozen=True)
class NestedConfig:
    n: int = 8


class Nested(Cheat):
    """Nested pools: the winner of all n rows in slot 0, as copy 0 (its lineage and owners),
    where the n=1 member reads it having paid for one row."""

    Config = NestedConfig
    prefix_field = "n"

    def __init__(self, **config):
        self.config = NestedConfig(**config)

    def pool_size(self):
        return self.config.n

    def pool_scores(self):
        return frozenset()

    async def search(self, problem, ops):
        done = await ops.denoise(ops.start(problem, copies=self.config.n))
        best = majority(ops.answers(done))
        tokens = done.tokens.clone()
        tokens[0] = done.tokens[best]
        return ops.pool(dataclasses.replace(done, tokens=tokens))


class Lazy(int):
    """An index whose value is decided when it is read: here it runs the backbone."""

    def __new__(cls, backbone):
        obj = super().__new__(cls, 0)
        obj.backbone = backbone
        return obj

    def _real(self) -> int:
        model = self.backbone.transformer
        model.lm_head(torch.zeros(1, model.config.hidden_size))
        return 0

    __int__ = __index__ = _real

    def __ge__(self, other):
        return self._real() >= other

    def __lt__(self, other):
        return self._real() < other


class LazySelector:
    ceiling = False
    needs = ()
    config = None
    backbone = None

    def select(self, candidates, *, rng, labels=None):
        return Lazy(LazySelector.backbone)


@hookimpl
def dllmbench_register_strategies(register):
    register("cheat", Cheat)
    register("ghost", Ghost)
    register("nested_cheat", Nested)


@hookimpl
def dllmbench_register_selectors(register):
    register("lazy", LazySelector)


TOY = ["run", "--task", "toy_sum:size=3", "--backbone", "toy", "--steps", 8, "--gen-length", 5]
NEVER = "whose tokens, steps or copy ops never produced"
CASES = [
    (["cheat:how=pool"], "'cheat' (from module:test_ledger_forgery) broke its contract", NEVER),
    (["cheat:how=remask"], "strategy 'cheat'", f"ops.remask was given 1 row(s) {NEVER}"),
    (["cheat:how=last_step"], "strategy 'cheat'", f"ops.denoise was given 1 row(s) {NEVER}"),
    (["cheat:how=after"], "'cheat' (from module:test_ledger_forgery) broke its contract", NEVER),
    (["ghost"], "'ghost'", "a forward of rows of problem 'ghost' while serving problem 'test-"),
    (
        ["cheat:how=scores+argmax:scorer=orm"],
        "'cheat'",
        "its pool's 'orm' score of candidate 0 (9) is not what ops.score gave that state",
    ),
    (["nested_cheat:n=8", "nested_cheat:n=1"], "strategy 'nested_cheat'", "ops.pool was given"),
    # the taker's own row 0 is the giver's (one key): the other seven are not its own
    (["cheat:how=give,n=8", "cheat:how=take"], "strategy 'cheat'", "ops.answers was given 7 row"),
]


@pytest.mark.parametrize("methods,who,needle", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_an_answer_the_ledger_did_not_pay_for_stops_the_run(
    tmp_path, cli, registry_with, methods, who, needle
):
    registry_with(__name__)
    argv = [*TOY, "--budget", 64, "--out", tmp_path / "r"]
    if any("orm" in m for m in methods):
        argv += ["--scorer", "orm=toy:partial=false"]
    for method in methods:
        argv += ["--method", method]
    result = cli(*argv)
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1 and who in lines[0] and needle in lines[0], result.err


def test_a_selector_index_that_runs_a_model_when_read_is_its_forward(
    tmp_path, cli, registry_with, monkeypatch
):
    """`int(index)` and `0 <= index` are read under the watch that counts a selector's model
    calls: a model run there is the selector's (it was read after the watch, unseen)."""
    from dllmbench.plugins.backbones.base import DiffusionBackbone

    registry_with(__name__)
    real = DiffusionBackbone.__init__

    def kept(self, *args, **kwargs):
        real(self, *args, **kwargs)
        LazySelector.backbone = self

    monkeypatch.setattr(DiffusionBackbone, "__init__", kept)
    argv = ["run", "--task", "arith", "--backbone", "tiny", "--limit", 1, "--budget", 96]
    result = cli(*argv, "--method", "independent:n=4+lazy", "--out", tmp_path / "r")
    assert result.code == 3, result.err
    assert "'lazy'" in result.err and "its select ran a model itself" in result.err
