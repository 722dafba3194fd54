"""The shipped demo: a tiny Dream-architecture dLLM trained on `arith`, with its PRM and ORM;
and its block-diffusion twin.

`tiny_model/` holds the weights, tokenizer and config (loaded by the `tiny` backbone plugin)
and the scorer checkpoints `prm/` and `orm/`. `pretrain` trains such a model from scratch;
`retrain` rebuilds all of it from a seed (`dllmbench demo retrain --out DIR`).
`tiny_block/` is the same for a block-diffusion (SDAR-style) Qwen3 trained on the same
problems (`pretrain_block`; the `tiny-block` backbone; `demo retrain --backbone tiny-block`).
This module is light: the `tiny` and `tiny-block` plugins import it when plugins load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

TINY_DIR = Path(__file__).parent / "tiny_model"
BLOCK_DIR = Path(__file__).parent / "tiny_block"
# the block model's block length (its config.json's `block_length`, tiny-block's default) and
# its demo protocol: T steps over gen_length tokens, the T spread evenly over the blocks
BLOCK_LENGTH = 4
BLOCK_DEMO: dict[str, int] = {"steps": 32, "gen_length": 32}
SCORER_KINDS = ("prm", "orm")
# Causal PRMs trained as the PRM is, differing only in attention and readout: the scorer
# controls' readout and reversed-input comparisons (`dllmbench diagnose`); runs do not use them
CONTROL_SCORERS: dict[str, dict[str, str]] = {
    "prm_causal": {"attention": "causal", "pooling": "mean"},
    "prm_causal_last": {"attention": "causal", "pooling": "last"},
}
# The demo's problems, options of `arith`: two or three steps, the first number up to 10, terms
# added or taken away up to 5. The model learns them, its scorers learn from its samples of
# them, and `dllmbench run` asks them.
TASK_CONFIG: dict[str, int] = {"min_steps": 2, "max_steps": 3}
DEMO_TASK = "arith:" + ",".join(f"{key}={value}" for key, value in TASK_CONFIG.items())


# the demo's models: the Dream-architecture `tiny` and the block-diffusion `tiny-block`
DemoBackbone = Literal["tiny", "tiny-block"]
# each one's pretraining steps (batches of 64): the block model learns the problems in far
# fewer, and at 500 it still slips often enough for search and its scorers to matter
PRETRAIN_STEPS: dict[str, int] = {"tiny": 3000, "tiny-block": 500}


@dataclass(frozen=True)
class RetrainConfig:
    out: Path
    seed: int = 0
    pretrain_steps: int | None = None  # None: the model's own (PRETRAIN_STEPS)
    problems: int = 600  # train problems to collect trajectories on
    samples: int = 8  # trajectories per problem
    scorer_steps: int = 600  # PRM training steps
    orm_steps: int = 2500
    negatives: int = 4000  # train problems the ORM also sees written right and with a slip
    # which problems' final states the ORM learns from: all, or those whose answers differ
    orm_groups: Literal["all", "mixed", "balanced"] = "all"
    backbone: DemoBackbone = "tiny"  # which demo model to rebuild, with its scorers

    def resolved(self) -> RetrainConfig:
        """With the model's own pretraining steps where none were given."""
        if self.pretrain_steps is not None:
            return self
        return replace(self, pretrain_steps=PRETRAIN_STEPS[self.backbone])

    @property
    def work(self) -> Path:
        """Scratch state of every stage (pretraining, trajectories, scorer training)."""
        return self.out / "build"

    def quick(self) -> RetrainConfig:
        """A few steps of everything: checks the pipeline end to end in seconds on a CPU.
        A 2-step model gets every answer wrong, so no problem is mixed: the ORM takes all."""
        return replace(
            self,
            pretrain_steps=2,
            problems=4,
            samples=4,
            scorer_steps=2,
            orm_steps=2,
            negatives=4,
            orm_groups="all",
        )


__all__ = [
    "BLOCK_DEMO",
    "BLOCK_DIR",
    "BLOCK_LENGTH",
    "CONTROL_SCORERS",
    "DEMO_TASK",
    "PRETRAIN_STEPS",
    "SCORER_KINDS",
    "TASK_CONFIG",
    "TINY_DIR",
    "DemoBackbone",
    "RetrainConfig",
]
