"""The shipped demo backbone: a 0.7M-parameter Dream-architecture dLLM trained on `arith`.

Weights, tokenizer and config live in `tiny_model/` inside the package and load through the
same code as Dream checkpoints (Qwen2ForCausalLM, is_causal=False, shifted logits).
`python -m dllmbench.plugins.backbones.retrain_demo` rebuilds them, with the demo's PRM and
ORM, from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dllmbench.hookspecs import hookimpl
from dllmbench.plugins.backbones.dream import Dream, DreamConfig

TINY_DIR = Path(__file__).parent / "tiny_model"


@dataclass(frozen=True)
class TinyConfig(DreamConfig):
    model: str = str(TINY_DIR)  # the shipped checkpoint; any Dream-format directory works
    chat: bool | None = False  # trained on raw "Question: …\nAnswer:" prompts
    # The tiny model is sharp (it knows its arithmetic): it samples hot, in random order, so
    # that its samples differ and about a third of them go wrong, leaving room for search.
    temperature: float = 2.0
    alg: str = "origin"

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        """The PRM and ORM trained for the shipped weights, as --scorer would give them
        (known from the configuration, before any weights load)."""
        if Path(self.model) != TINY_DIR:
            return {}
        return {
            kind: (kind, {"checkpoint": str(TINY_DIR / kind)})
            for kind in ("prm", "orm")
            if (TINY_DIR / kind / "config.json").exists()
        }


class Tiny(Dream):
    Config = TinyConfig
    contract_configs: ClassVar[list[dict]] = [{"model": "random"}, {}]

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        return self.config.shipped_scorers


@hookimpl
def dllmbench_register_backbones(register):
    if (TINY_DIR / "model.safetensors").exists():
        register("tiny", Tiny)
