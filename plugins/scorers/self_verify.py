"""Self-verification: the backbone judges its own (partial) answer, as Prism does.

Each row's generated text so far (masked positions dropped) is followed by a question, e.g.
"Is the answer above correct? Answer Yes or No.", and one masked position; the score is the
backbone's logit of "Yes" minus its logit of "No" there: one forward of the backbone per row,
charged as a `score:<name>` pass. The difference is read in float64 as one row of the head
(the "Yes" row minus the "No" row) applied to the last hidden state: no [B, L, V] logits, and
no rounding of the two logits to a bfloat16 backbone's 8 bits (0.125 apart at 20).

Nothing is trained; it reads partial states, so Prism-style search prunes with it
(`--scorer self=self`, `prism:scorer=self`). Works on any backbone built on a transformers
model (dream, llada, tiny, the block models).
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
        self._verdict = self._verdict_row()

    def _verdict_row(self) -> tuple[torch.Tensor, float] | None:
        """The head's "Yes" row minus its "No" row [H] and bias difference, in float64, when
        the backbone gives the states its head reads (`read_states`) and a linear `lm_head`;
        None for another backbone, whose full logits are read instead."""
        head = getattr(self.backbone.transformer, "lm_head", None)
        if not callable(getattr(self.backbone, "read_states", None)):
            return None
        if not isinstance(head, torch.nn.Linear):
            return None
        weight = head.weight.detach()
        row = weight[self._yes].double() - weight[self._no].double()
        bias = 0.0
        if head.bias is not None:
            bias = float(head.bias[self._yes].double() - head.bias[self._no].double())
        return row, bias

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
        """The backbone's own model; its head is the one row read (H weights), else the whole
        LM head."""
        shape = model_shape(self.backbone)
        if shape is None or self._verdict is None:
            return shape
        return shape.plus(head=len(self._verdict[0]))

    def score_work(self, batch: ScoreBatch) -> list[Work]:
        """The backbone's forward over each asked row; the head row at its last position, else
        the LM head at every position (the backbone's `logits`, of which the last is read)."""
        head = 1 if self._verdict is not None else None
        return [Work.full(len(row), head=head) for row in self._asked(batch)]

    def verdicts(self, states: torch.Tensor) -> np.ndarray:
        """logit(Yes) − logit(No) [B] of the last hidden states [B, H], in float64."""
        assert self._verdict is not None
        row, bias = self._verdict
        return (states.double() @ row + bias).cpu().numpy()

    @torch.no_grad()
    def score(self, batch: ScoreBatch) -> np.ndarray:
        """Each row asked at its own width (`batching`): its score never depends on the rows
        beside it."""
        bb = self.backbone
        rows = self._asked(batch)
        out = np.empty(len(rows))
        for width, members in by_width(rows):
            ids, attn, _ = pad_to(bb, [rows[i] for i in members], width, self._pad_id)
            if self._verdict is not None:
                states = bb.read_states(ids, attn)  # type: ignore[attr-defined]
                out[members] = self.verdicts(states[:, -1])
                continue
            logits = bb.logits(ids, attn)[:, -1].double()
            out[members] = (logits[:, self._yes] - logits[:, self._no]).cpu().numpy()
        return out


@hookimpl
def dllmbench_register_scorers(register):
    register("self", SelfVerify)
