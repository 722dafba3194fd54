"""A toy backbone that takes its time (`delay` seconds per forward), so that a test can kill a
share of a launched run while it runs; with `until=PATH` only while PATH exists, so that what
runs after the kill runs at the toy's own speed. Registered in child processes only, through
DLLMBENCH_PLUGIN_MODULES (with this folder on PYTHONPATH).

With DLLMBENCH_LEDGER_LOG=FILE set, every charge of the ledger appends a line to FILE: the
time and the passes charged so far in all, the true total a killed process's compute entry is
checked against."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.core.ledger import Ledger
from dllmbench.testing.doubles import ToyBackbone, ToyBackboneConfig


@dataclass(frozen=True)
class SlowToyConfig(ToyBackboneConfig):
    delay: float = 0.1  # seconds per denoising forward
    load_delay: float = 0.0  # seconds the backbone takes to load
    until: str = ""  # a file: the delay only while it exists ("": always)


class SlowToy(ToyBackbone):
    Config = SlowToyConfig

    def __init__(self, **config):
        self.config = SlowToyConfig(**config)
        time.sleep(self.config.load_delay)

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        if not self.config.until or os.path.exists(self.config.until):
            time.sleep(self.config.delay)
        return super().denoise_step(batch)


@hookimpl
def dllmbench_register_backbones(register):
    register("toy_slow", SlowToy)


def _log_charges(path: str) -> None:
    charge = Ledger.charge

    def logged(self, *args, **kwargs):
        charge(self, *args, **kwargs)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{time.time()} {sum(self.charged.values())}\n")

    Ledger.charge = logged  # type: ignore[method-assign]


if os.environ.get("DLLMBENCH_LEDGER_LOG"):
    _log_charges(os.environ["DLLMBENCH_LEDGER_LOG"])
