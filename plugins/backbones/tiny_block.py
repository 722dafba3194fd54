"""The shipped block-diffusion demo backbone: a 0.7M-parameter Qwen3 trained on `arith` (two-
and three-step problems) with the block-diffusion objective, sampled block by block.

The weights, tokenizer, config and the PRM and ORM trained for them live in the demo's own
room, `dllmbench.demo` (`BLOCK_DIR`), and load through the same code as SDAR checkpoints
(`block`: Qwen3ForCausalLM under a block-causal mask, an exact KV cache). Its demo protocol
is `BLOCK_DEMO`: T=32 over 32 tokens, 8 blocks of 4 with four steps each, as SDAR samples.
`dllmbench demo retrain --backbone tiny-block --out DIR` rebuilds them from a seed;
`--backbone tiny-block:model=DIR` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.demo import BLOCK_DIR, BLOCK_LENGTH
from dllmbench.plugins.backbones.block import BlockConfig, BlockDiffusion
from dllmbench.plugins.backbones.tiny import shipped_scorers

__all__ = ["BLOCK_DIR", "TinyBlock", "TinyBlockConfig"]


@dataclass(frozen=True)
class TinyBlockConfig(BlockConfig):
    model: str = str(BLOCK_DIR)  # the shipped checkpoint; any block-diffusion directory works
    chat: bool | None = False  # trained on raw "Question: …\nAnswer:" prompts
    block_length: int = BLOCK_LENGTH  # what the shipped model was trained with
    # The sampler is SDAR's as BlockConfig's defaults set it: temperature 1, each masked
    # position of the current block drawn, those above the 0.85 threshold committed (at least
    # the step's share of the block, the most confident first)

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        return shipped_scorers(self.model, BLOCK_DIR)


class TinyBlock(BlockDiffusion):
    """The shipped block-diffusion demo model: 0.7M parameters of Qwen3, trained on arith."""

    Config = TinyBlockConfig
    shown_as = "tiny-block"
    contract_configs: ClassVar[list[dict]] = [{}]  # `block` checks model="random" already

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        return self.config.shipped_scorers


@hookimpl
def dllmbench_register_backbones(register):
    if (BLOCK_DIR / "model.safetensors").exists():
        register("tiny-block", TinyBlock)
