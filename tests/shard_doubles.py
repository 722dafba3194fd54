"""A toy backbone that takes its time (`delay` seconds per forward), so that a test can kill a
share of a launched run while it runs. Registered in child processes only, through
DLLMBENCH_PLUGIN_MODULES (with this folder on PYTHONPATH)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.testing.doubles import ToyBackbone, ToyBackboneConfig


@dataclass(frozen=True)
class SlowToyConfig(ToyBackboneConfig):
    delay: float = 0.1  # seconds per denoising forward
    load_delay: float = 0.0  # seconds the backbone takes to load


class SlowToy(ToyBackbone):
    Config = SlowToyConfig

    def __init__(self, **config):
        self.config = SlowToyConfig(**config)
        time.sleep(self.config.load_delay)

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        time.sleep(self.config.delay)
        return super().denoise_step(batch)


@hookimpl
def dllmbench_register_backbones(register):
    register("toy_slow", SlowToy)
