"""LLaDA2.0 (inclusionAI's LLaDA2.0-mini and -flash): a block-diffusion mixture of experts,
sampled as its own `generate` samples.

The model is transformers' Glm4Moe with LLaDA2's weights converted one to one
(llada2_moe.py). The sampler is `block`'s: LLaDA2's `generate` cuts the canvas into blocks
of 32 from position 0, gives each block `steps` steps, draws every masked position of the
current block, and commits every position above `threshold` (0.95) when there are at least
the step's share of them, else the step's share most confident first. That is
`low_confidence_dynamic`, and its stop (the block in which an end token was written is the
last) is `block`'s `stop`; `eos_early_stop`, on as the model card runs `generate`, ends a row
at the step that commits an end token once everything before it is written. Where
`generate` recomputes every block before the current one at every step, the backbone reads
them from its exact KV cache: under the block-causal mask they are the same keys and values,
so the tokens are the same and a step costs a block.

One departure: `generate`'s `temperature=0.0` (its default) does not divide the logits and
then draws, so it samples at temperature 1. Here 0 is the most probable token and the default
is 1, which draws as `generate`'s default does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.plugins.backbones.block import BlockConfig, BlockDiffusion, Family


@dataclass(frozen=True)
class LLaDA2Config(BlockConfig):
    model: str = "inclusionAI/LLaDA2.0-mini"  # or -flash, a local directory, "random"
    block_length: int = 32  # LLaDA2's
    threshold: float = 0.95  # LLaDA2's
    family: Family = "llada2"  # the architecture of model="random"
    eos_early_stop: bool = True  # as LLaDA2's model card runs `generate`


class LLaDA2(BlockDiffusion):
    """LLaDA2.0: a block-diffusion mixture of experts on Glm4Moe, with an exact KV cache."""

    Config = LLaDA2Config
    arch = "llada2"  # its messages name it
    layout = "block"  # its checkpoint loads as the block backbone's (llada2_moe.py)

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.say_if_hurried(batch, range(len(batch.tokens)), hurried)
        return super().denoise_step_with_confidence(batch)

    contract_configs: ClassVar[list[dict]] = [
        {"model": "random", "block_length": 4},
        {"model": "random", "block_length": 8, "temperature": 0.7, "entropy_bound": 1.0},
    ]


def hurried(total: int, gen: int) -> str:
    """What a row's T below its gen_length does to LLaDA2's decoding."""
    return (
        f"llada2: T={total} is below gen_length={gen}, so each step commits about "
        f"{-(-gen // total)} tokens beyond those above the threshold, where generate's default "
        f"(32 steps a block of 32) commits one; give --steps {gen} for generate's schedule"
    )


@hookimpl
def dllmbench_register_backbones(register):
    register("llada2", LLaDA2)
