"""Capped strategies: Adaptive-Consistency (its stopping rule by hand, its spend and accuracy
beside Majority@n on the demo backbone) and confidence-threshold decoding; a strategy over
its cap stops the run."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from scipy import integrate

from dllmbench.analysis.stats import bootstrap_ci
from dllmbench.cli.run import DEMO
from dllmbench.demo import TASK_CONFIG
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.method import Method, MethodSpec
from dllmbench.loading.registry import registry
from dllmbench.plugins.strategies.adaptive import (
    DIRICHLET_DRAWS,
    AdaptiveConfig,
    beta_probability,
    dirichlet_probability,
    stop_probability,
    vote_counts,
)
from dllmbench.plugins.strategies.threshold import Threshold, ThresholdConfig
from dllmbench.testing import run_strategy

# -- the stopping rule, by hand ----------------------------------------------------------------


def test_vote_counts_drop_invalid_answers_and_put_the_leader_first():
    assert vote_counts(["7", None, "3", "7", None, "9", "3", "7"]) == [3, 2, 1]
    assert vote_counts([None, None]) == []


def test_beta_rule_by_hand():
    """P(p > 1/2), p ~ Beta(a + 1, b + 1) = ∫_{1/2}^1 x^a (1−x)^b dx / B(a + 1, b + 1)."""
    # 3 to 0: ∫_{1/2}^1 x³ dx / ∫_0^1 x³ dx = (1 − 1/16) = 15/16, short of 0.95
    assert beta_probability(3, 0) == pytest.approx(15 / 16, abs=1e-9)
    # 4 to 0: 31/32, the fewest votes that stop at 0.95
    assert beta_probability(4, 0) == pytest.approx(31 / 32, abs=1e-9)
    # 4 to 1: 30·(∫_{1/2}^1 x⁴ − x⁵ dx) = 30·(1/30 − (1/160 − 1/384)) = 1 − 7/64
    assert beta_probability(4, 1) == pytest.approx(57 / 64, abs=1e-9)
    assert beta_probability(2, 2) == pytest.approx(1 / 2, abs=1e-9)
    # no valid answer: nothing to stop on; one vote: 1 − 1/4
    assert stop_probability([], "beta") == 0.0
    assert stop_probability([1], "beta") == pytest.approx(3 / 4, abs=1e-9)
    # beta reads the two most voted answers only (3 to 1: 13/16), as the reference does
    assert stop_probability([3, 1, 1], "beta") == pytest.approx(13 / 16, abs=1e-9)


def _dirichlet_by_quadrature(a: int, b: int, c: int) -> float:
    """P(p₁ > max(p₂, p₃)) for p ~ Dirichlet(a + 1, b + 1, c + 1), integrating the density
    over the simplex in (x, y) = (p₂, p₃), p₁ = 1 − x − y."""

    def density(y: float, x: float) -> float:
        return (1 - x - y) ** a * x**b * y**c

    norm = math.gamma(a + b + c + 3) / (math.gamma(a + 1) * math.gamma(b + 1) * math.gamma(c + 1))
    # p₁ > x and p₁ > y: x < 1/2 and y < min(1 − 2x, (1 − x)/2)
    inside, _ = integrate.dblquad(
        density, 0, 0.5, 0, lambda x: min(1 - 2 * x, (1 - x) / 2), epsabs=1e-12
    )
    return norm * inside


def test_dirichlet_rule_against_quadrature():
    """Three answers: the Monte Carlo estimate lies within 5 standard errors of the integral;
    fewer than three answers fall back to beta exactly; more than five keep the top five."""
    for counts in ([3, 1, 1], [5, 2, 1], [2, 2, 1]):
        exact = _dirichlet_by_quadrature(*counts)
        estimate = stop_probability(counts, "dirichlet", np.random.default_rng(0))
        error = math.sqrt(exact * (1 - exact) / DIRICHLET_DRAWS)
        assert abs(estimate - exact) < 5 * error, (counts, estimate, exact)
    assert _dirichlet_by_quadrature(3, 1, 1) == pytest.approx(0.6976, abs=1e-3)
    assert stop_probability([4, 1], "dirichlet") == beta_probability(4, 1)
    top_five = dirichlet_probability([4, 2, 2, 2, 2], np.random.default_rng(1))
    assert stop_probability([4, 2, 2, 2, 2, 2], "dirichlet", np.random.default_rng(1)) == top_five


def test_adaptive_options_are_checked():
    assert AdaptiveConfig().confidence == 0.95 and AdaptiveConfig().criterion == "beta"
    for bad in ({"n": 0}, {"round": 0}, {"confidence": 0.0}, {"confidence": 1.5}):
        with pytest.raises(ValueError):
            AdaptiveConfig(**bad)


# -- on the toy task ---------------------------------------------------------------------------


def test_adaptive_draws_rounds_until_settled_and_records_them():
    """Rounds of 2: the rule is checked at 2, 4 and 6 rows, and stops only when settled or at
    n; the pool holds every row drawn, in order (lineage (i,)), each charged its T, and
    `info` the rows drawn and the probability after each round."""
    for record in run_strategy("adaptive:n=6,round=2+majority", steps=6):
        info, drawn = record["info"], len(record["candidates"])
        assert info["drawn"] == list(range(2, drawn + 1, 2))
        assert record["ledger"]["passes"] == {"denoise": drawn * 6}
        assert [c["lineage"] for c in record["candidates"]] == [[i] for i in range(drawn)]
        assert info["settled"] == (info["stop_probability"][-1] >= 0.95)
        assert info["settled"] or drawn == 6


# -- on the demo backbone: spend and accuracy beside Majority@n ------------------------------

PROBLEMS, N = 20, 8


@pytest.fixture(scope="module")
def tiny():
    return registry().backbone("tiny")


def _run_tiny(backbone, specs: list[str], problems: int) -> dict[str, list[dict]]:
    """Records by method of one engine run on arith's first problems at the demo's T and
    canvas."""
    reg = registry()
    task = reg.task("arith", **TASK_CONFIG)
    methods = [Method.build(reg, MethodSpec.parse(spec)) for spec in specs]
    engine = Engine(
        backbone=backbone,
        scorers={},
        task=task,
        methods=methods,
        sampling=Sampling(DEMO["steps"], DEMO["gen_length"], DEMO["prompt"], 0),
        capacity=Capacity(batch_rows=256, problems=problems),
    )
    out: dict[str, list[dict]] = {spec: [] for spec in specs}
    for record in engine.run(task.problems("test")[:problems]):
        out[record["method"]].append(record)
    return out


@pytest.fixture(scope="module")
def beside_majority(tiny):
    majority, adaptive = f"independent:n={N}+majority", f"adaptive:n={N}+majority"
    records = _run_tiny(tiny, [majority, adaptive], PROBLEMS)
    return records[majority], records[adaptive]


@pytest.mark.slow
def test_adaptive_spends_less_than_its_cap_and_never_more(beside_majority):
    majority, adaptive = beside_majority
    cap = N * DEMO["steps"]
    spent = [r["ledger"]["total_passes"] for r in adaptive]
    assert max(spent) <= cap
    assert np.mean(spent) < cap, spent
    assert all(r["ledger"]["total_passes"] == cap for r in majority)


@pytest.mark.slow
def test_adaptive_pools_are_majority_pools_cut_short(beside_majority):
    """Common random numbers: adaptive's m candidates are Majority@n's first m."""
    majority, adaptive = beside_majority
    full = {r["problem"]: r["candidates"] for r in majority}
    for record in adaptive:
        drawn = record["candidates"]
        assert drawn == full[record["problem"]][: len(drawn)]
        assert record["info"]["drawn"][-1] == len(drawn)


@pytest.mark.slow
def test_adaptive_accuracy_lies_within_majoritys_interval(beside_majority):
    majority, adaptive = beside_majority
    interval = bootstrap_ci(np.array([r["correct"] for r in majority], np.float64))
    accuracy = float(np.mean([r["correct"] for r in adaptive]))
    assert interval.low <= accuracy <= interval.high, (accuracy, interval)


# -- over the cap ------------------------------------------------------------------------------

OVERSPENDS = """
from typing import ClassVar

from dllmbench.hookspecs import hookimpl
from dllmbench.plugins.strategies.independent import Independent


class Overspends(Independent):
    capped: ClassVar[bool] = True
    prefix_field: ClassVar[str | None] = None  # every row it starts is its own

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=self.config.n + 1))
        return ops.pool(rows.take(range(self.config.n)))


@hookimpl
def dllmbench_register_strategies(register):
    register("overspends", Overspends)
"""


def test_a_strategy_over_its_cap_stops_the_run_naming_it(cli, tmp_path, monkeypatch, registry_with):
    (tmp_path / "overspending_plugins.py").write_text(textwrap.dedent(OVERSPENDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_with("overspending_plugins")
    result = cli(
        "run", "--task", "toy_sum:size=2", "--backbone", "toy", "--steps", "4",
        "--gen-length", "5", "--method", "overspends:n=2+first", "--budget", "8",
        "--resamples", "10", "--out", tmp_path / "run",
    )  # fmt: skip
    lines = [line for line in result.err.splitlines() if " records (" not in line]  # progress
    assert result.code == 3, result
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert lines[0].startswith("dllmbench: ledger check failed: method ")
    assert "(strategy 'overspends')" in lines[0] and "over its cap" in lines[0]


# -- confidence-threshold decoding ---------------------------------------------------------


def test_threshold_rows_carry_their_setting():
    assert ThresholdConfig().threshold == 0.9  # none given: Fast-dLLM's 0.9
    assert Threshold(n=3).settings(None) == [{"threshold": 0.9}] * 3  # type: ignore[arg-type]
    assert Threshold(n=2, factor=1.5).settings(None) == [{"factor": 1.5}] * 2  # type: ignore[arg-type]
    mixed = Threshold(n=5, thresholds="0.7/0.9").settings(None)  # type: ignore[arg-type]
    assert [s["threshold"] for s in mixed] == [0.7, 0.9, 0.7, 0.9, 0.7]
    eb = Threshold(n=2, entropy_bound=0.1)
    assert eb.settings(None) == [{"entropy_bound": 0.1}] * 2  # type: ignore[arg-type]
    assert eb.sets_per_row() == {"entropy_bound"}
    bad_configs = (
        {"threshold": 0.9, "factor": 1.0},
        {"threshold": 0.9, "entropy_bound": 0.1},
        {"threshold": 1.5},
        {"factor": 0.0},
        {"entropy_bound": 0.0},
        {"entropy_bound": float("inf")},
        {"entropy_bound": float("nan")},
    )
    for bad in bad_configs:
        with pytest.raises(ValueError):
            ThresholdConfig(**bad)
    with pytest.raises(ValueError, match="thresholds"):
        ThresholdConfig(thresholds="0.7/high")
    assert Threshold(n=4).cost(24) == {"denoise": 96} and Threshold.capped


@pytest.mark.slow
def test_threshold_records_show_the_setting_and_spend_within_the_cap(tiny):
    """On the demo backbone rows end once their canvas fills: every record spends at most
    n·T, and less on average; each candidate's settings show its threshold."""
    specs = ["threshold:n=4+majority", "threshold:n=4,thresholds=0.5/0.9+majority"]
    records = _run_tiny(tiny, specs, problems=3)
    cap = 4 * DEMO["steps"]
    for spec, taus in zip(specs, ([0.9] * 4, [0.5, 0.9] * 2), strict=True):
        spent = [r["ledger"]["total_passes"] for r in records[spec]]
        assert max(spent) <= cap and np.mean(spent) < cap, spent
        for record in records[spec]:
            assert [c["settings"]["threshold"] for c in record["candidates"]] == taus
