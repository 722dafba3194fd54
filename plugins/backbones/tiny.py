"""The shipped demo backbone: a 0.7M-parameter Dream-architecture dLLM trained on `arith`
(two- and three-step problems), sampled with Dream's sampler at the paper's settings.

The weights, tokenizer, config and the scorers trained for them live in the demo's own room,
`dllmbench.demo` (`TINY_DIR`), and load through the same code as Dream checkpoints
(Qwen2ForCausalLM, is_causal=False, shifted logits). `dllmbench demo retrain --out DIR`
rebuilds them, with the demo's PRM and ORM, from a seed; `--backbone tiny:model=DIR` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.demo import SCORER_KINDS, TINY_DIR
from dllmbench.plugins.backbones.dream import Dream, DreamConfig

__all__ = ["TINY_DIR", "Tiny", "TinyConfig", "shipped_scorers"]


TINY_SELF_VERIFY = {"question": "\nQuestion: equal?\nAnswer: ", "yes": "1", "no": "0"}


@dataclass(frozen=True)
class TinyConfig(DreamConfig):
    model: str = str(TINY_DIR)  # the shipped checkpoint; any Dream-format directory works
    chat: bool | None = False  # trained on raw "Question: …\nAnswer:" prompts
    # The sampler is Dream's as the paper runs it (DreamConfig's defaults): temperature 0.5,
    # `maskgit_plus` (the most confident positions first), `alg_temp` 0.5.

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        return shipped_scorers(self.model, TINY_DIR)


def shipped_scorers(model: str, shipped: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """The PRM and ORM trained for the shipped weights in `shipped`, and the model's
    self-verification, as --scorer would give them (known from the configuration, before any
    weights load); none where `model` is another checkpoint."""
    if Path(model) != shipped:
        return {}
    scorers = {
        kind: (kind, {"checkpoint": str(shipped / kind)})
        for kind in SCORER_KINDS
        if (shipped / kind / "config.json").exists()
    }
    # Prism-style self-verification, nothing trained: asked in the words the demo models
    # know, whose judgement they were never taught (a stand-in that exercises the search)
    scorers["self"] = ("self", TINY_SELF_VERIFY)
    return scorers


class Tiny(Dream):
    """The shipped demo model: 0.7M parameters of Dream's architecture, trained on arith."""

    Config = TinyConfig
    shown_as = "tiny"
    contract_configs: ClassVar[list[dict]] = [{"model": "random"}, {}]

    @property
    def shipped_scorers(self) -> dict[str, tuple[str, dict[str, str]]]:
        return self.config.shipped_scorers


@hookimpl
def dllmbench_register_backbones(register):
    if (TINY_DIR / "model.safetensors").exists():
        register("tiny", Tiny)
