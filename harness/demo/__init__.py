"""The shipped demo: a tiny Dream-architecture dLLM trained on `arith`, with its PRM and ORM.

`tiny_model/` holds the weights, tokenizer and config (loaded by the `tiny` backbone plugin)
and the scorer checkpoints `prm/` and `orm/`. `pretrain` trains such a model from scratch;
`retrain` rebuilds all of it from a seed (`dllmbench demo retrain --out DIR`).
This module is light: the `tiny` plugin imports it when plugins load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

TINY_DIR = Path(__file__).parent / "tiny_model"
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


@dataclass(frozen=True)
class RetrainConfig:
    out: Path
    seed: int = 0
    pretrain_steps: int = 3000
    problems: int = 600  # train problems to collect trajectories on
    samples: int = 8  # trajectories per problem
    scorer_steps: int = 600  # PRM training steps
    orm_steps: int = 2500
    negatives: int = 4000  # train problems the ORM also sees written right and with a slip
    # which problems' final states the ORM learns from: all, or those whose answers differ
    orm_groups: Literal["all", "mixed", "balanced"] = "all"

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
    "CONTROL_SCORERS",
    "DEMO_TASK",
    "SCORER_KINDS",
    "TASK_CONFIG",
    "TINY_DIR",
    "RetrainConfig",
]
