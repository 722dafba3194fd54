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

__all__ = ["SCORER_KINDS", "TINY_DIR"]
