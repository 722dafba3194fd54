"""Self-verification: the backbone judges its own (partial) answer, as Prism does.

Each row's generated text so far (masked positions dropped) is followed by a question, e.g.
"Is the answer above correct? Answer Yes or No.", and one masked position; the score is the
backbone's logit of "Yes" minus its logit of "No" there: one forward of the backbone per row,
charged as a `score:<name>` pass. Nothing is trained; it reads partial states, so Prism-style
search prunes with it (`--scorer self=self`, `prism:scorer=self`). Works on any backbone built
on a transformers model (dream, llada, tiny).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import ScoreBatch, TransformerBackbone, model_shape
from dllmbench.core.errors import PluginError
from dllmbench.core.flops import ModelShape, Work
from dllmbench.core.types import Prompt
from dllmbench.plugins.scorers.batching import by_width, pad_id_of, pad_to


@dataclass(frozen=True)
class SelfVerifyConfig:
    question: str = "\n\nIs the answer above correct? Answer Yes or No.\nAnswer: "
    yes: str = "Yes"
    no: str = "No"


class SelfVerify:
    """The backbone's own yes/no judgement of a partial answer: logit(Yes) − logit(No)."""

    Config = SelfVerifyConfig
    contract_backbone: ClassVar[tuple[str, dict]] = ("dream", {"model": "random"})
    reads_partial = True
    trained = True  # nothing to train

    def __init__(self, backbone: object = None, **config: Any):
        self.config = SelfVerifyConfig(**config)
        if not isinstance(backbone, TransformerBackbone):
            raise PluginError(
                "scorer 'self' needs a backbone built on a transformers model (dream, llada, tiny)"
            )
        self.backbone = backbone
        self._pad_id = pad_id_of(self.backbone)
        self._yes = self._first_token(self.config.yes)
        self._no = self._first_token(self.config.no)
        if self._yes == self._no:
            raise PluginError("scorer 'self': yes and no start with the same token; pick others")

    def _text_ids(self, text: str) -> list[int]:
        """Token ids of raw text, without what the tokenizer puts before any text (BOS)."""
        ids = self.backbone.encode(Prompt(text=text))
        lead = self.backbone.encode(Prompt(text=""))
        return ids[len(lead) :] if ids[: len(lead)] == lead else ids

    def _first_token(self, word: str) -> int:
        ids = self._text_ids(word)
        if not ids:
            raise PluginError(f"scorer 'self': {word!r} encodes to no token")
        return ids[0]

    def _asked(self, batch: ScoreBatch) -> list[torch.Tensor]:
        """Each row as the question asks it: prompt, answer text, question, one mask."""
        bb = self.backbone
        rows = []
        for tokens, plen in zip(batch.tokens, batch.prompt_lens, strict=True):
            text = bb.decode(tokens, plen)
            asked = self._text_ids(text + self.config.question)
            prompt = tokens[:plen].cpu()
            rows.append(torch.cat([prompt, torch.tensor([*asked, bb.mask_id], dtype=torch.long)]))
        return rows

    @property
    def model_shape(self) -> ModelShape | None:
        """The backbone's own model, its LM head included."""
        return model_shape(self.backbone)

    def score_work(self, batch: ScoreBatch) -> list[Work]:
        """A bidirectional forward over each asked row, the LM head at every position (the
        backbone's `logits`, of which the last position is read)."""
        return [Work.full(len(row)) for row in self._asked(batch)]

    @torch.no_grad()
    def score(self, batch: ScoreBatch) -> np.ndarray:
        """Each row asked at its own width (`batching`): its score never depends on the rows
        beside it."""
        bb = self.backbone
        rows = self._asked(batch)
        out = np.empty(len(rows))
        for width, members in by_width(rows):
            ids, attn, _ = pad_to(bb, [rows[i] for i in members], width, self._pad_id)
            logits = bb.logits(ids, attn)[:, -1].double()
            out[members] = (logits[:, self._yes] - logits[:, self._no]).cpu().numpy()
        return out


@hookimpl
def dllmbench_register_scorers(register):
    register("self", SelfVerify)
