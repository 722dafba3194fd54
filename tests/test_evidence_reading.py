"""Evidence the report cannot read: the contract kit fails the strategy in one line, and
`dllmbench report` leaves the method out of its pooled curves and diagnostics with one line
naming it, writing the rest. This module is itself a plugin (`registry_with`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import toy_argv

from dllmbench.analysis import evidence
from dllmbench.api.hookspecs import hookimpl
from dllmbench.plugins.strategies.prm_guided import PRMGuided, PRMGuidedConfig, SegmentLog
from dllmbench.plugins.strategies.ranking import top
from dllmbench.testing import contracts

FLAWS = {
    # the last cut's `kept` written best first; its pool in row order
    "best_first": {"k": 4, "every": 4, "final": "keep", "flaw": "best_first"},
    # the kept rows continued without `repeat(1)`: children keep their parents' lineages
    "no_repeat": {"k": 4, "every": 4, "keep": 4, "final": "keep", "flaw": "no_repeat"},
}


@dataclass(frozen=True)
class InconsistentConfig(PRMGuidedConfig):
    flaw: str = "best_first"


class Inconsistent(PRMGuided):
    """PRM Hybrid (`final="keep"`) whose `info` disagrees with its pool in the way `flaw`
    says (`FLAWS`); it spends and returns what PRM Guided does."""

    Config = InconsistentConfig  # type: ignore[assignment]

    def __init__(self, **config):
        self.config = InconsistentConfig(**config)
        self.scorers = (self.config.scorer,)

    async def search(self, problem, ops):
        c = self.config
        segments = ops.segments(c.every)
        log = SegmentLog(ops)
        children = ops.start(problem, copies=c.k)
        parents = np.full(c.k, -1)
        for i, steps in enumerate(segments):
            children = await ops.denoise(children, steps)
            scores = await ops.score(children, c.scorer)
            if i == len(segments) - 1:
                every = np.arange(c.k)
                written = top(scores, c.k) if c.flaw == "best_first" else every
                log.segment(children, scores, parents, written)
                return ops.pool(children, scores={c.scorer: scores}, info=log.info)
            kept = top(scores, c.keep)
            log.segment(children, scores, parents, kept)
            children = children.take(kept)
            if c.flaw != "no_repeat":
                children = children.repeat(c.k // c.keep)
            parents = np.repeat(kept, c.k // c.keep)
        raise AssertionError("unreachable")


@hookimpl
def dllmbench_register_strategies(register):
    register("inconsistent", Inconsistent)


def spec(flaw: str) -> str:
    return "inconsistent:" + ",".join(f"{k}={v}" for k, v in FLAWS[flaw].items())


# -- the contract kit --------------------------------------------------------------------------


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_the_kit_fails_a_strategy_whose_evidence_the_report_cannot_read(registry_with, flaw):
    registry_with(__name__)
    plugin = ("inconsistent", FLAWS[flaw])
    contracts.test_strategy_spends_what_it_declares(plugin)  # otherwise an honest strategy
    with pytest.raises(AssertionError) as failed:
        contracts.test_strategy_evidence_reads_as_the_report_reads_it(plugin)
    message = str(failed.value)
    assert "\n" not in message, message
    assert message.startswith("strategy 'inconsistent' at T=")
    assert "does not match its candidates' lineages" in message
    assert "Evidence(" in message and "cuts='prm'" in message


@pytest.mark.parametrize("config", PRMGuided.contract_configs)
def test_the_kit_passes_the_honest_guided_strategy(config):
    contracts.test_strategy_evidence_reads_as_the_report_reads_it(("prm_guided", config))


# -- the report --------------------------------------------------------------------------------

HONEST = [
    "independent:n=4+majority",
    "independent:n=2+argmax:scorer=orm",
    "prm_guided:k=4,every=4,final=keep+majority",
]


def run_argv(out: Path, methods: list[str]) -> list[str]:
    argv = [*toy_argv(4), "--budget", 40, "--resamples", 100, "--out", out]
    for method in methods:
        argv += ["--method", method]
    return argv


@pytest.fixture(scope="module")
def honest_report(tmp_path_factory) -> dict:
    """report.json of a run of the honest methods alone."""
    from dllmbench.analysis.report import build_report
    from dllmbench.cli import main

    out = tmp_path_factory.mktemp("honest") / "run"
    assert main([str(a) for a in run_argv(out, HONEST)]) == 0
    return json.loads(json.dumps(build_report([out])))


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_the_report_leaves_out_a_method_it_cannot_read_and_writes_the_rest(
    tmp_path, cli, registry_with, honest_report, flaw
):
    registry_with(__name__)
    bad = f"{spec(flaw)}+majority"
    ran = cli(*run_argv(tmp_path / "run", [*HONEST, bad]))
    assert ran.code == 0, ran.err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    [bad_id] = [m["id"] for m in manifest["methods"] if m["spec"] == bad]

    result = cli("report", tmp_path / "run")
    assert result.code == 0, result.err
    assert "Traceback" not in result.err, result.err
    report = json.loads((tmp_path / "run" / "report" / "report.json").read_text())
    [skipped] = report["skipped"]
    reason = skipped["reason"]
    assert skipped == {"run": 0, "method": bad_id, "strategy": spec(flaw), "reason": reason}
    assert reason.startswith(f"the info of {bad_id!r} on problem test-")
    assert "does not match its candidates' lineages" in reason and "\n" not in reason
    stages = [x for x in result.err.splitlines() if x.endswith(" elapsed)")]  # its progress
    assert [x for x in result.err.strip().splitlines() if x not in stages] == [
        f"dllmbench: report: method {bad_id!r} (strategy {spec(flaw)!r}) left out of the pooled "
        f"curves and diagnostics: {reason}"
    ]
    assert bad_id in {m["id"] for m in report["methods"]}  # its accuracy stays
    assert bad_id not in json.dumps([report["pooled"], report["diagnostics"]])
    # the honest methods' sections are those of a run without the bad method
    assert report["pooled"] == honest_report["pooled"]
    assert report["diagnostics"] == honest_report["diagnostics"]
    assert report["diagnostics"]["removal_risk"] and report["diagnostics"]["discrimination"]
    assert (
        f"`{bad_id}` (strategy `{spec(flaw)}`, run 0): {reason}"
        in (tmp_path / "run" / "report" / "report.md").read_text()
    )
    # the library says the same
    assert evidence.unreadable(evidence.load_run(tmp_path / "run")) == {bad_id: reason}


def test_a_report_of_readable_runs_skips_nothing(honest_report):
    assert honest_report["skipped"] == []


# -- what the reader refuses -------------------------------------------------------------------


def _entry(mid: str, strategy: str, config: dict, declared: dict) -> dict:
    return {
        "id": mid,
        "spec": f"{mid}+first",
        "strategy": {"name": strategy, "config": config},
        "selector": {"name": "first", "config": {}},
        "evidence": {"nested": None, "plain": False, "cuts": None, "particles": None, **declared},
    }


def _record(mid: str, lineages: list[list[int]], info: dict) -> dict:
    candidates = [
        {"text": "t", "key": "1", "correct": True, "scores": {}, "weight": None, "lineage": lin}
        for lin in lineages
    ]
    return {"problem": "p-0", "method": mid, "candidates": candidates, "info": info}


def _cuts(**changed) -> dict:
    """Two segments of 4 children, the first cut keeping child 0, every final child kept."""
    info = {
        "step": [4, 8],
        "mask": [[0.5] * 4, [0.0] * 4],
        "scores": [[0.4, 0.3, 0.2, 0.1], [1.0, 2.0, 3.0, 4.0]],
        "parent": [[-1] * 4, [0] * 4],
        "kept": [[0], [0, 1, 2, 3]],
    }
    return {**info, **changed}


def _particles(**changed) -> dict:
    info = {
        "beta": [0.5, 1.0],
        "ess": [1.8, 2.0],
        "resampled": [True],
        "weights": [[0.8, 0.1, 0.1], [0.2, 0.3, 0.5]],
        "ancestors": [[0, 0, 2]],
    }
    return {**info, **changed}


CUT_FINALS = [[0, j] for j in range(4)]
REFUSED = {
    "a cut keeping a child it does not have": (
        _cuts(kept=[[7], [0, 1, 2, 3]]),
        "segment 0's kept [7] names a child it does not have (0 to 3)",
    ),
    "children continuing a child the cut did not keep": (
        _cuts(parent=[[-1] * 4, [1] * 4]),
        "segment 1's parent [1, 1, 1, 1] names a child the cut before did not keep",
    ),
    "a score short": (
        _cuts(scores=[[0.4, 0.3], [1.0, 2.0, 3.0, 4.0]]),
        "segment 0's scores [0.4, 0.3] are not one finite number per child (4)",
    ),
    "a segment field short": (
        _cuts(mask=[[0.5] * 4]),
        "its step, mask, scores, parent, kept are not lists of 2 each (one per segment)",
    ),
    "siblings apart": (
        _cuts(parent=[[-1] * 4, [0, 1, 0, 1]], kept=[[0, 1], [0, 1, 2, 3]]),
        "segment 1's children of one parent are not consecutive",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_cuts_out_of_their_layout_are_refused_in_one_line(case):
    info, needle = REFUSED[case]
    entry = _entry("Guided", "prm_guided", {"k": 4}, {"cuts": "prm"})
    run = evidence.run_data(
        Path("hand"), {"methods": [entry]}, [_record("Guided", CUT_FINALS, info)]
    )
    [(mid, reason)] = evidence.unreadable(run).items()
    assert mid == "Guided" and "\n" not in reason
    assert reason.startswith("the info of 'Guided' on problem p-0 is not in the segment layout: ")
    assert needle in reason, reason
    assert evidence.unreadable(evidence.leave_out(run, ["Guided"])) == {}


def test_honest_cuts_and_checkpoints_read():
    cuts = _entry("Guided", "prm_guided", {"k": 4}, {"cuts": "prm"})
    smc = _entry("SMC", "smc", {"k": 3}, {"particles": "prm"})
    records = [
        _record("Guided", CUT_FINALS, _cuts()),
        _record("SMC", [[0, 0], [0, 1], [2, 2]], _particles()),
    ]
    run = evidence.run_data(Path("hand"), {"methods": [cuts, smc]}, records)
    assert evidence.unreadable(run) == {}
    assert len(evidence.smc_checkpoints(run)) == 1
    assert len(evidence.scored_states(run, labels="lineage")) == 5  # the cut's kept child, 4 finals


@pytest.mark.parametrize(
    "changed,needle",
    [
        ({"weights": [[0.8, -0.1, 0.1], [0.2, 0.3, 0.5]]}, "checkpoint 0's weights"),
        ({"ancestors": [[0, 0, 5]]}, "checkpoint 0's ancestors [0, 0, 5] name a particle"),
        (
            {"resampled": [True, False]},
            "its resampled, ancestors are not lists of 1 each (one per checkpoint but the last)",
        ),
    ],
)
def test_checkpoints_out_of_their_layout_are_refused_in_one_line(changed, needle):
    entry = _entry("SMC", "smc", {"k": 3}, {"particles": "prm"})
    record = _record("SMC", [[0, 0], [0, 1], [2, 2]], _particles(**changed))
    run = evidence.run_data(Path("hand"), {"methods": [entry]}, [record])
    [(mid, reason)] = evidence.unreadable(run).items()
    assert mid == "SMC" and "\n" not in reason
    assert reason.startswith("the info of 'SMC' on problem p-0 is not in the checkpoint layout: ")
    assert needle in reason, reason
