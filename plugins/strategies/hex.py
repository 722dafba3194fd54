"""HEX: majority over hidden semi-autoregressive experts (Lee et al., "Test-Time Scaling in
Diffusion LLMs via Hidden Semi-Autoregressive Experts", arXiv 2510.05040; code
junos-ai-org/hex).

n samples from fully masked canvases, sample i committed under block length
blocks[i mod |blocks|]: the same model run as several semi-autoregressive "experts". The
paper's set is gen_length/32, /16, /8, /4 and /2 ([8, 16, 32, 64, 128] at its gen_length of
256), one sample each, then a majority vote. All rows share one forward per step whatever
their block length, so HEX costs what Majority costs: n·T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.plugins.strategies.independent import Independent

PAPER_DIVISORS = (32, 16, 8, 4, 2)  # the paper's block lengths: gen_length / these


@dataclass(frozen=True)
class HexConfig:
    n: int = 5  # samples; sample i uses the i-th block length, cycling
    # block lengths separated by "/", e.g. "8/16/32/64/128"; "paper": gen_length/32 … /2
    blocks: str = "paper"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.blocks != "paper":
            parse_blocks(self.blocks)


def parse_blocks(text: str) -> tuple[int, ...]:
    try:
        blocks = tuple(int(b) for b in str(text).split("/"))
    except ValueError:
        raise ValueError(f"blocks must be 'paper' or lengths like 8/16/32, got {text!r}") from None
    if not blocks or min(blocks) < 1:
        raise ValueError(f"block lengths must be >= 1, got {text!r}")
    return blocks


def paper_blocks(gen_length: int) -> tuple[int, ...]:
    """The paper's set scaled to the canvas: gen_length/32, /16, /8, /4 and /2 (at least 1,
    each once). A length that does not divide the canvas, or whose blocks T does not split
    evenly over, takes the backbone's general schedule (a shorter last block, T spread)."""
    return tuple(dict.fromkeys(max(1, gen_length // d) for d in PAPER_DIVISORS))


class Hex(Independent):
    """n samples spread over several semi-autoregressive block lengths (HEX)."""

    Config = HexConfig
    contract_configs: ClassVar[list[dict]] = [{"n": 1, "blocks": "2"}, {"n": 5, "blocks": "1/2/5"}]

    def evidence(self) -> Evidence:
        return Evidence(nested="n")  # nested, but not the plain samples

    def sets_per_row(self) -> frozenset[str]:
        return frozenset({"block_length"})

    def settings(self, ops: Ops) -> list[dict[str, Any]]:
        blocks = self.block_lengths(ops)
        return [{"block_length": blocks[i % len(blocks)]} for i in range(self.config.n)]

    def block_lengths(self, ops: Ops) -> tuple[int, ...]:
        if self.config.blocks == "paper":
            return paper_blocks(ops.gen_length)
        return parse_blocks(self.config.blocks)


@hookimpl
def dllmbench_register_strategies(register):
    register("hex", Hex)
