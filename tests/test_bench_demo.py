"""benchmarks/bench_demo.py runs with one order or both, and prints what it measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_demo.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_demo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_order_gets_its_column_and_both_their_ratio():
    bench = _bench()
    run = {"end s": 2.0, "records": 3, "_decisions": [1], "_accuracy": {}}
    alone = bench.table({"after": run}).splitlines()
    assert alone[0].split() == ["after"] and alone[1].split() == ["end", "s", "2.0"]
    assert not any("same" in line for line in alone)
    slower = {**run, "end s": 4.0}
    both = bench.table({"before": slower, "after": run}).splitlines()
    assert both[0].split() == ["before", "after", "after/before"]
    assert both[1].split() == ["end", "s", "4.0", "2.0", "0.500"]
    assert both[-2:] == ["same decisions: True", "same accuracies: True"]


@pytest.mark.slow
def test_the_demo_benchmark_runs_one_order(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_demo.py", "--limit", "1", "--order", "after"])
    _bench().main()
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["after"]
    rows = {line.split("  ")[0].strip(): line.split()[-1] for line in out[2:]}
    assert int(rows["records"]) > 0 and float(rows["end s"]) > 0
    monkeypatch.setattr(sys, "argv", ["bench_demo.py", "--order", "sideways"])
    with pytest.raises(SystemExit):
        _bench().main()
