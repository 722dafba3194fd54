"""LLaDA: a Llama-3-style stack with bidirectional attention, and its sampler.

The sampler follows LLaDA's `generate`: optional blocks (block_length divides gen_length;
T/num_blocks steps per block, each block's quota spread as n // steps with the remainder on
the first steps); x0 by argmax of the logits, or at temperature > 0 by Gumbel-max in float64
(exp(logits) / (−log U)^temperature); confidence the softmax probability of x0
(`low_confidence`) or a uniform draw (`random`); positions right of the current block never
commit; the most confident masked positions take x0. With cfg_scale > 0 each step also runs
the prompt-masked canvas and uses un + (cfg + 1)·(cond − un): two passes per row-step. The
mask token can be committed, as in the reference; set suppress_mask=true to forbid it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllmbench.errors import UserError
from dllmbench.hookspecs import hookimpl
from dllmbench.interfaces import StepBatch
from dllmbench.keys import torch_generator
from dllmbench.plugins.backbones.base import DiffusionBackbone


@dataclass(frozen=True)
class LLaDAConfig:
    model: str = "GSAI-ML/LLaDA-8B-Instruct"  # Hub id, local directory, or "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: str | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (126336)
    temperature: float = 0.0
    remasking: str = "low_confidence"  # or "random"
    block_length: int | None = None  # default: the whole generated region, one block
    cfg_scale: float = 0.0
    suppress_mask: bool = False  # never sample the mask token (the reference can)
    seed: int = 0  # initialisation of model="random"

    def __post_init__(self) -> None:
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking must be low_confidence or random, got {self.remasking!r}")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ValueError("temperature and cfg_scale must be >= 0")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError("block_length must be >= 1")


def block_quota(
    block_length: int, steps_per_block: int, step_in_block: torch.Tensor
) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens for a fully masked block: n // s, +1 on the first n % s."""
    base, rest = divmod(block_length, steps_per_block)
    return base + (step_in_block < rest).long()


class LLaDA(DiffusionBackbone):
    Config = LLaDAConfig
    arch = "llada"
    shift = False
    mask_names = ("<|mdm_mask|>", "<|mask|>")
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {"model": "random", "temperature": 0.7, "remasking": "random"},
        {"model": "random", "cfg_scale": 1.0, "block_length": 5},
    ]

    @property
    def passes_per_step(self) -> int:
        return 2 if self.config.cfg_scale > 0 else 1

    def schedule(self, gen_length: int, total_steps: int) -> tuple[int, int]:
        """(block_length, steps per block), checked as the reference asserts."""
        block = self.config.block_length or gen_length
        if gen_length % block:
            raise UserError(
                f"llada: gen_length {gen_length} is not a multiple of block_length {block}"
            )
        blocks = gen_length // block
        if total_steps % blocks:
            raise UserError(
                f"llada: {total_steps} steps do not split over {blocks} blocks; "
                "choose steps divisible by gen_length / block_length"
            )
        return block, total_steps // blocks

    def commit(self, ids, attn, offsets, batch: StepBatch) -> torch.Tensor:
        c = self.config
        device = self.device
        ids, attn = ids.to(device), attn.to(device)
        logits = self.logits(ids, attn)
        if c.cfg_scale > 0:
            unprompted = ids.clone()
            for i, (off, plen) in enumerate(zip(offsets, batch.prompt_lens, strict=True)):
                unprompted[i, off : off + plen] = self.mask_id
            un = self.logits(unprompted, attn)
            logits = un + (c.cfg_scale + 1) * (logits - un)
        if c.suppress_mask:
            logits[..., self.mask_id] = -torch.inf
        masked = ids == self.mask_id
        width = ids.shape[1]
        positions = torch.arange(width, device=device)
        steps = torch.tensor(list(batch.steps), device=device)
        eligible = torch.zeros_like(masked)
        quotas = torch.zeros(len(offsets), dtype=torch.long, device=device)
        for i, (off, plen) in enumerate(zip(offsets, batch.prompt_lens, strict=True)):
            gen_length = width - off - plen
            block, per_block = self.schedule(gen_length, batch.total_steps)
            b, j = divmod(int(steps[i]), per_block)
            end = off + plen + (b + 1) * block
            eligible[i] = masked[i] & (positions < end)
            quotas[i] = block_quota(block, per_block, torch.tensor(j))

        x0 = logits.argmax(-1)
        if c.temperature > 0:  # Gumbel-max in float64 on the positions that can commit
            for i in range(len(offsets)):
                where = eligible[i].nonzero().flatten()
                if len(where) == 0:
                    continue
                gen = torch_generator(batch.keys[i], batch.steps[i], device)
                u = torch.rand(
                    (len(where), logits.shape[-1]),
                    generator=gen,
                    dtype=torch.float64,
                    device=device,
                )
                noisy = logits[i, where].double().exp() / (-torch.log(u)) ** c.temperature
                x0[i, where] = noisy.argmax(-1)
        if c.remasking == "low_confidence":
            probs = torch.softmax(logits.float(), dim=-1)
            confidence = probs.gather(-1, x0[..., None]).squeeze(-1).double()
        else:
            confidence = self.noise(batch, offsets, width, 1)[:, 0].to(device)
        confidence = torch.where(eligible, confidence, torch.full_like(confidence, -torch.inf))
        rank = torch.argsort(torch.argsort(confidence, dim=-1, descending=True, stable=True), -1)
        chosen = eligible & (rank < quotas[:, None])
        return torch.where(chosen, x0, ids)


@hookimpl
def dllmbench_register_backbones(register):
    register("llada", LLaDA)
