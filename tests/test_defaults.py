"""One source for each default: every command-line option whose setting a configuration
dataclass also holds takes its default from that dataclass, and every other option with a
default is listed here as the command line's own."""

from __future__ import annotations

import argparse

import pytest

from dllmbench.analysis import stats
from dllmbench.cli import build_parser
from dllmbench.cli.common import field_default
from dllmbench.demo import RetrainConfig
from dllmbench.execution.engine import Capacity, Sampling
from dllmbench.running.runner import RunConfig
from dllmbench.scoring.collect import CollectConfig
from dllmbench.scoring.controls import ControlsConfig
from dllmbench.scoring.training import TrainConfig

# (command, option dest) → (dataclass, field) holding the same setting
SOURCES = {
    ("run", "split"): (RunConfig, "split"),
    ("plan", "split"): (RunConfig, "split"),
    ("run", "batch_rows"): (Capacity, "batch_rows"),
    ("run", "max_problems"): (Capacity, "problems"),
    ("run", "resamples"): (RunConfig, "resamples"),
    ("run", "seed"): (Sampling, "seed"),
    ("collect", "batch_rows"): (Capacity, "batch_rows"),
    ("collect", "seed"): (Sampling, "seed"),
    ("collect", "steps"): (Sampling, "total_steps"),
    ("collect", "gen_length"): (Sampling, "gen_length"),
    ("collect", "prompt"): (Sampling, "prompt_style"),
    ("collect", "rollouts"): (CollectConfig, "rollouts"),
    ("diagnose", "width"): (ControlsConfig, "width"),
    ("diagnose", "seed"): (ControlsConfig, "seed"),
    ("train-scorer", "steps"): (TrainConfig, "steps"),
    ("train-scorer", "batch"): (TrainConfig, "batch"),
    ("train-scorer", "accum"): (TrainConfig, "accum"),
    ("train-scorer", "lr"): (TrainConfig, "lr"),
    ("train-scorer", "warmup"): (TrainConfig, "warmup"),
    ("train-scorer", "val_fraction"): (TrainConfig, "val_fraction"),
    ("train-scorer", "val_every"): (TrainConfig, "val_every"),
    ("train-scorer", "groups"): (TrainConfig, "groups"),
    ("train-scorer", "labels"): (TrainConfig, "labels"),
    ("train-scorer", "seed"): (TrainConfig, "seed"),
    ("demo retrain", "seed"): (RetrainConfig, "seed"),
    ("demo retrain", "pretrain_steps"): (RetrainConfig, "pretrain_steps"),
    ("demo retrain", "problems"): (RetrainConfig, "problems"),
    ("demo retrain", "samples"): (RetrainConfig, "samples"),
    ("demo retrain", "scorer_steps"): (RetrainConfig, "scorer_steps"),
    ("demo retrain", "orm_steps"): (RetrainConfig, "orm_steps"),
    ("demo retrain", "negatives"): (RetrainConfig, "negatives"),
    ("demo retrain", "orm_groups"): (RetrainConfig, "orm_groups"),
}
# Options whose default no configuration dataclass holds: the command line's own.
OWN = {
    ("collect", "split"): "train",  # trajectories are collected on training problems
    ("collect", "n"): 4,  # trajectories per problem
    ("collect", "snapshots"): 8,  # snapshot steps per trajectory
    ("report", "slicing"): "paper",  # the paper's snapshot slicing of the scorer controls
    ("train-scorer", "options"): "",
}


def _commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix}{name}"
                out[full] = sub
                out.update(_commands(sub, f"{full} "))
    return out


COMMANDS = _commands(build_parser())


def _defaults(command: str) -> dict[str, object]:
    """Every option of `command` with a default that is a setting (not None, not a flag)."""
    return {
        a.dest: a.default
        for a in COMMANDS[command]._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and a.default is not None
        and a.default is not argparse.SUPPRESS
        and not isinstance(a.default, bool)
        and not (isinstance(a.default, list) and not a.default)
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_default_has_one_source(command: str):
    for dest, value in _defaults(command).items():
        key = (command, dest)
        if key in SOURCES:
            cls, name = SOURCES[key]
            assert value == field_default(cls, name), (key, value, cls.__name__, name)
        else:
            assert key in OWN, f"{command} --{dest} defaults to {value!r}: name its source"
            assert value == OWN[key], (key, value)


def test_the_table_names_options_that_exist():
    for command, dest in [*SOURCES, *OWN]:
        assert dest in {a.dest for a in COMMANDS[command]._actions}, (command, dest)


def test_run_sampling_defaults_come_from_sampling():
    """`run` leaves --steps/--gen-length/--prompt unset (a preset or the demo may fill them);
    what fills them last is `Sampling`'s defaults."""
    from dllmbench.cli.common import GENERAL

    assert {
        "steps": Sampling().total_steps,
        "gen_length": Sampling().gen_length,
        "prompt": Sampling().prompt_style,
    } == GENERAL


def test_one_confidence_level_and_resample_count():
    import inspect

    from dllmbench.analysis import diagnostics, pooled, results

    for module in (stats, results, pooled, diagnostics):
        for _, fn in inspect.getmembers(module, inspect.isfunction):
            params = inspect.signature(fn).parameters
            if "level" in params and params["level"].default is not inspect.Parameter.empty:
                assert params["level"].default == stats.CONFIDENCE, fn
    assert field_default(RunConfig, "resamples") == stats.RESAMPLES
