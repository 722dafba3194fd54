"""The shipped demo: a tiny Dream-architecture dLLM trained on `arith`, with its PRM and ORM.

`tiny_model/` holds the weights, tokenizer and config (loaded by the `tiny` backbone plugin)
and the scorer checkpoints `prm/` and `orm/`. `pretrain` trains such a model from scratch;
`retrain` rebuilds all of it from a seed (`dllmbench demo retrain --out DIR`).
This module is light: the `tiny` plugin imports it when plugins load.
"""

from __future__ import annotations

from pathlib import Path

TINY_DIR = Path(__file__).parent / "tiny_model"
SCORER_KINDS = ("prm", "orm")
# The demo's problems, options of `arith`: two or three steps, the first number up to 10, terms
# added or taken away up to 5. The model learns them, its scorers learn from its samples of
# them, and `dllmbench run` asks them.
TASK_CONFIG: dict[str, int] = {"min_steps": 2, "max_steps": 3}
DEMO_TASK = "arith:" + ",".join(f"{key}={value}" for key, value in TASK_CONFIG.items())

__all__ = ["DEMO_TASK", "SCORER_KINDS", "TASK_CONFIG", "TINY_DIR"]
