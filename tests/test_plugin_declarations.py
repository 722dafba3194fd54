"""What a plugin declares or returns, of the wrong type: a strategy's `cost(T)`, `pool_size()`,
`pool_scores()`, a `search` that is no coroutine, a config or a pool `info` that is not JSON data,
a scorer's value that is not finite, a task's unhashable answer key or a grade of no answer.
Each is that plugin's broken contract, named in one line with exit status 3, before it reaches
the engine's own code (where each was a TypeError or ValueError, exit status 1, or blamed on a
built-in selector). This module registers the faulty plugins."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dllmbench.api.hookspecs import hookimpl
from dllmbench.plugins.strategies.independent import Independent
from dllmbench.testing.doubles import ToyScorer, ToySum


class IntCost(Independent):
    def cost(self, total_steps):
        return self.config.n * total_steps


class FloatCost(Independent):
    def cost(self, total_steps):
        return {"denoise": float(self.config.n * total_steps)}


class TextSize(Independent):
    def pool_size(self):
        return str(self.config.n)


class ListScores(Independent):
    def pool_scores(self):
        return []


class PlainSearch(Independent):
    def search(self, problem, ops):  # no `async`
        return None


class SetConfig(Independent):
    def __init__(self, **config):
        super().__init__(**config)
        self.config = {"n": self.config.n, "tags": {"a"}}

    def cost(self, total_steps):
        return {"denoise": self.config["n"] * total_steps}

    def pool_size(self):
        return self.config["n"]


class NaNInfo(Independent):
    async def search(self, problem, ops):
        pool = await super().search(problem, ops)
        pool.info["spread"] = math.nan
        return pool


class NaNScorer(ToyScorer):
    def score(self, batch):
        values = super().score(batch)
        values[-1] = np.nan
        return values


class KeepsBackbone(ToyScorer):
    def __init__(self, backbone=None, **config):
        super().__init__(backbone, **config)
        self.config = {"backbone": backbone}


class ListKeys(ToySum):
    def answer_key(self, answer):
        return [int(answer)]


class GradesText(ToySum):
    """Extracts nothing and grades the text: every candidate is "right" without an answer."""

    def extract(self, text):
        return None

    def grade(self, problem, answer, text):
        return True


@hookimpl
def dllmbench_register_strategies(register):
    for name, cls in [
        ("int_cost", IntCost),
        ("float_cost", FloatCost),
        ("text_size", TextSize),
        ("list_scores", ListScores),
        ("plain_search", PlainSearch),
        ("set_config", SetConfig),
        ("nan_info", NaNInfo),
    ]:
        register(name, cls)


@hookimpl
def dllmbench_register_scorers(register):
    register("nan_scorer", NaNScorer)
    register("keeps_backbone", KeepsBackbone)


@hookimpl
def dllmbench_register_tasks(register):
    register("list_keys", ListKeys)
    register("grades_text", GradesText)


ME = "(from module:test_plugin_declarations) broke its contract"
RERANK = "independent:n=2+argmax:scorer=prm"
CASES = [
    ("int_cost:n=2", (), "'int_cost' {me}: cost(8) returned 16, not a dict of pass kinds"),
    ("float_cost:n=2", (), "'float_cost' {me}: cost(8) returned {{'denoise': 16.0}}"),
    ("text_size:n=2", (), "'text_size' {me}: pool_size() returned '2', not a whole number"),
    ("list_scores:n=2", (), "'list_scores' {me}: pool_scores() returned [], not a frozenset"),
    ("plain_search:n=2", (), "'plain_search' {me}: search is not a coroutine function"),
    ("set_config:n=2", (), "'set_config' {me}: its config is not JSON data (Object of type set"),
    ("nan_info:n=2", (), "'nan_info' {me}: its pool's info is not JSON data (Out of range float"),
    (RERANK, ("--scorer", "prm=nan_scorer"), "'nan_scorer' {me}: score() returned nan for row"),
    (RERANK, ("--scorer", "prm=keeps_backbone"), "'keeps_backbone' {me}: its config is not JSON"),
    ("independent:n=2+majority", ("list_keys",), "'list_keys' {me}: answer_key('"),
    ("independent:n=1", ("grades_text",), "'grades_text' {me}: grade() graded a candidate"),
]


@pytest.mark.parametrize("method,extra,needle", CASES, ids=[c[2].split("'")[1] for c in CASES])
def test_a_declaration_or_value_of_the_wrong_type_is_the_plugins_broken_contract(
    tmp_path, cli, registry_with, method, extra, needle
):
    registry_with(__name__)
    task = "toy_sum"
    if extra and not extra[0].startswith("--"):  # a task of this module
        task, extra = extra[0], ()
    argv = ["run", "--task", f"{task}:size=3", "--backbone", "toy", "--steps", 8]
    argv += ["--gen-length", 5, *extra, "--method", method, "--budget", 18]
    result = cli(*argv, "--out", tmp_path / "r")
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1 and needle.format(me=ME) in lines[0], result.err
    assert "Traceback" not in result.err
