"""Records finish steadily: the oldest problems are served first, so records arrive over the
whole run (not all at its end), an interrupted run keeps the problems it finished, and the
progress lines of a log are spread over the run. Counted in forwards, never in seconds."""

from __future__ import annotations

import io
import json
import re

import pytest

from dllmbench.cli.progress import Progress
from dllmbench.execution.engine import Capacity, Engine, Sampling
from dllmbench.execution.planner import plan
from dllmbench.loading.registry import registry
from dllmbench.running.runner import RunConfig, run
from dllmbench.testing.contracts import comparable
from dllmbench.testing.doubles import ToyBackbone, ToyScorer, ToySum

T, GEN, PROBLEMS = 16, 6, 30
METHODS = [p.method for p in plan(registry(), 8 * T + 8, T, scorers={"prm", "orm"}).methods]


class Admissions(ToySum):
    """The toy task, noting each problem as the engine admits it (formats its prompt)."""

    def __init__(self, events: list[tuple[str, str]], **kw):
        super().__init__(**kw)
        self.events = events

    def prompt(self, problem, style):
        self.events.append(("admit", problem.id))
        return super().prompt(problem, style)


def engine(task, **capacity) -> Engine:
    return Engine(
        backbone=ToyBackbone(),
        scorers={"prm": ToyScorer(), "orm": ToyScorer(partial=False)},
        task=task,
        methods=METHODS,
        sampling=Sampling(T, GEN, "fewshot", 0),
        capacity=Capacity(batch_rows=16, **capacity),
    )


def forwards(eng: Engine) -> int:
    return sum(eng.ledger.physical_forwards.values())


def test_records_of_early_problems_come_before_later_problems_start():
    events: list[tuple[str, str]] = []
    task = Admissions(events, size=PROBLEMS)
    eng = engine(task, problems=8)
    eng.run(task.problems("test"), on_record=lambda r: events.append(("record", r["problem"])))
    kinds = [kind for kind, _ in events]
    first_record = kinds.index("record")
    last_admission = len(kinds) - 1 - kinds[::-1].index("admit")
    assert first_record < last_admission
    # the first problems finish before the last third of the problems is admitted
    before = events[: events.index(("admit", "test-20"))]
    done_before = {p for kind, p in before if kind == "record"}
    assert {"test-0", "test-1", "test-2"} <= done_before


def test_records_arrive_over_the_run_in_admission_order():
    """32 problems in flight, 30 problems: all are admitted at once, yet the oldest finish
    first and the records are spread over the forwards, not bunched at the end."""
    task = ToySum(size=PROBLEMS)
    eng = engine(task)
    seen: list[tuple[int, str]] = []
    records = eng.run(
        task.problems("test"), on_record=lambda r: seen.append((forwards(eng), r["problem"]))
    )
    total = forwards(eng)
    ends = {problem: n for n, problem in seen}  # the forwards done at its last record
    assert min(ends.values()) < total / 4  # the first problem done within a quarter of the run
    tenth = sorted(ends.values())[PROBLEMS // 10]
    assert tenth < total / 3
    order = [int(p.split("-")[1]) for p in sorted(ends, key=ends.get)]
    assert order[: PROBLEMS // 3] == sorted(order[: PROBLEMS // 3])  # oldest first
    assert max(order[: PROBLEMS // 3]) < PROBLEMS // 2
    # and the records are those of the run that served every problem each round
    lockstep = engine(ToySum(size=PROBLEMS), round_batches=10**9)
    together = lockstep.run(task.problems("test"))
    assert sorted(map(str, map(comparable, records))) == sorted(map(str, map(comparable, together)))
    assert lockstep.ledger.passes() == eng.ledger.passes()
    assert lockstep.ledger.physical_rows == eng.ledger.physical_rows  # same rows computed


class Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_progress_lines_of_a_log_are_spread_over_the_run():
    task = ToySum(size=PROBLEMS)
    eng = engine(task)
    at: list[int] = []

    class Noting(Log):
        def write(self, text: str) -> int:
            if text.startswith("dllmbench:"):
                at.append(forwards(eng))
            return super().write(text)

    log = Noting()
    with Progress(log) as progress:
        progress.start("toy × methods", PROBLEMS * len(METHODS))
        eng.run(task.problems("test"), on_record=lambda r: progress.advance())
    done = [int(re.search(r": (\d+)/", line).group(1)) for line in log.getvalue().splitlines()]
    assert len(done) >= 10
    total = forwards(eng)
    middle = [n for n in at if 0 < n < total]
    assert len(middle) >= 5, (at, total)  # lines come during the run, not all at its end
    assert at[2] < total / 2  # the 20% line comes in the first half of the forwards


def config(out) -> RunConfig:
    return RunConfig(
        task="toy_sum",
        task_config={"size": PROBLEMS},
        backbone="toy",
        scorers={"prm": ("toy", {}), "orm": ("toy", {"partial": False})},
        methods=["vanilla", "majority", "orm_rerank", "prm_guided", "smc_vote", "oracle"],
        sampling=Sampling(total_steps=T, gen_length=GEN, prompt_style="fewshot", seed=3),
        capacity=Capacity(batch_rows=16),
        resamples=100,
        out=str(out),
    )


class Interrupt(KeyboardInterrupt):
    pass


def test_an_interrupted_run_keeps_the_problems_it_finished(tmp_path):
    """Ctrl-C as soon as one problem is whole (a record of every method): the run directory
    keeps that problem, and most problems were never finished."""
    seen: dict[str, set[str]] = {}

    def stop(record):
        seen.setdefault(record["problem"], set()).add(record["method"])
        if len(seen[record["problem"]]) == 6:
            raise Interrupt

    with pytest.raises(Interrupt):
        run(config(tmp_path / "run"), on_record=stop)
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    kept: dict[str, set[str]] = {}
    for line in lines:
        record = json.loads(line)
        kept.setdefault(record["problem"], set()).add(record["method"])
    assert any(len(methods) == 6 for methods in kept.values())
    assert len(lines) < PROBLEMS * 6 / 2  # interrupted early in the run
