"""LLaDA: a Llama-3-style stack with bidirectional attention, and its sampler.

The sampler follows LLaDA's `generate`: optional blocks (block_length divides gen_length;
T/num_blocks steps per block, each block's quota spread as n // steps with the remainder on
the first steps); x0 by argmax of the logits, or at temperature > 0 by Gumbel-max in float64
(exp(logits) / (−log U)^temperature); confidence the float64 softmax probability of x0
(`low_confidence`) or a uniform draw (`random`); positions right of the current block never
commit; the most confident masked positions take x0, equal confidences ordered by a keyed
uniform. With cfg_scale > 0 each step also runs the prompt-masked canvas and uses
un + (cfg + 1)·(cond − un): two passes per row-step. The Instruct model's pure-diffusion
options: `logits_eos_inf` (EOS is never sampled) and `confidence_eos_eot_inf` (EOS and EoT get
confidence 0 under low_confidence, so they commit last). The mask token can be committed, as
in the reference; set suppress_mask=true to forbid it. With Fast-dLLM's `threshold` or `factor`
or EB-Sampler's `entropy_bound` (low_confidence only) a step also commits the eligible
positions its rule accepts, beyond the quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Literal

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.core.errors import UserError
from dllmbench.plugins.backbones.base import (
    ATTENTIONS,
    PROPHET_SETTINGS,
    Attention,
    BlockStep,
    DiffusionBackbone,
    RowRefusals,
    block_schedule,
    check_finite,
    check_parallel,
    check_prophet,
    check_seed,
    check_temperature,
    exit_bar,
    model_entropy,
    parallel_commits,
    purpose_generator,
    rules_set,
    top2_gap,
    top_ranked,
)
from dllmbench.plugins.backbones.fastcache import Cache, check_cache
from dllmbench.plugins.backbones.loading import DType, device_problem, positions_of


@dataclass(frozen=True)
class LLaDAConfig(RowRefusals):
    model: str = "GSAI-ML/LLaDA-8B-Instruct"  # Hub id, local directory, or "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: DType | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (126336)
    temperature: float = 0.5  # the paper's; 0 draws argmax tokens
    remasking: Literal["low_confidence", "random"] = "low_confidence"
    block_length: int | None = None  # default: the whole generated region, one block
    cfg_scale: float = 0.0
    logits_eos_inf: bool = False  # EOS logit −inf before sampling: EOS is never drawn
    confidence_eos_eot_inf: bool = False  # EOS and EoT confidence 0: committed last
    suppress_mask: bool = False  # never sample the mask token (the reference can)
    # Fast-dLLM's parallel decoding on top of the schedule (docs/backbones.md): also commit
    # the eligible positions whose token probability is >= threshold, or the factor rule's
    threshold: float | None = None
    factor: float | None = None
    # EB-Sampler's parallel decoding on top of the schedule: also commit, most confident
    # first, the longest run whose entropies less their largest sum to <= this
    entropy_bound: float | None = None
    # Prophet's early exit (docs/backbones.md): each step, once the mean top-2 logit gap over
    # the answer region (`answer_length` positions from `answer_at`, gen-relative; default 2
    # after the last held token) reaches its phase's bar, every masked position takes its
    # draw and the row ends
    prophet: bool = False
    answer_at: int | None = None
    answer_length: int = 5
    early_gap: float = 7.5  # the bar while (step + 1) / T < 0.33
    mid_gap: float = 5.0  # below 0.67
    late_gap: float = 2.5  # after
    # tokens held in the canvas from the start: "20:The|21:answer|22:is" (gen-relative
    # positions; each word tokenized with a leading space, its tokens from its position on)
    constraints: str = ""
    # "sdpa": rows left-padded to the widest; "packed": rows end to end, no padding
    # (FlexAttention document mask, packing.py)
    attention: Attention = "sdpa"
    seed: int = 0  # initialisation of model="random"
    # Fast-dLLM's approximate KV cache, refreshed once per block (fastcache.py; needs
    # block_length): "prefix" keeps the positions before the block, "dual" also those after
    cache: Cache = "none"

    def __post_init__(self) -> None:
        if (unusable := device_problem(self.device)) is not None:
            raise ValueError(unusable)
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be sdpa or packed, got {self.attention!r}")
        check_cache(self.cache, self.block_length, self.attention, self.cfg_scale)
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking must be low_confidence or random, got {self.remasking!r}")
        check_temperature(self.temperature)
        check_seed(self.seed)
        check_finite("cfg_scale", self.cfg_scale, "0: no classifier-free guidance")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ValueError("temperature and cfg_scale must be >= 0")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError("block_length must be >= 1")
        required = ("remasking", self.remasking, "low_confidence")
        check_parallel(self, required, ("low_confidence",))
        check_prophet(self)

    @property
    def positions(self) -> int | None:
        """Positions of the model (prompt and canvas), from its config.json (`KnowsPositions`)."""
        return positions_of(self.model)

    @property
    def passes_per_step(self) -> int:
        """Forwards per row-step: two with classifier-free guidance (known before loading)."""
        return 2 if self.cfg_scale > 0 else 1

    @property
    def deterministic(self) -> bool:
        """True when different keys cannot give different samples (up to exact ties of float64
        confidences): argmax tokens (temperature 0) committed by confidence (low_confidence)."""
        return self.temperature == 0 and self.remasking == "low_confidence"

    @property
    def ends_early(self) -> bool:
        """A parallel decoding rule (threshold, factor, entropy_bound) or Prophet's early exit
        may fill a row's canvas before its T."""
        return bool(rules_set(self)) or self.prophet

    @property
    def approximate(self) -> bool:
        """True when the sampler reads hidden states from Fast-dLLM's approximate cache."""
        return self.cache != "none"


def block_quota(
    block_length: int, steps_per_block: int, step_in_block: torch.Tensor
) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens for a fully masked block: n // s, +1 on the first n % s."""
    base, rest = divmod(block_length, steps_per_block)
    return base + (step_in_block < rest).long()


def gumbel_max(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """LLaDA's add_gumbel_noise then argmax: exp(logits) / (−log U)^temperature in float64,
    one uniform per (position, token) from `gen`; plain argmax at temperature 0."""
    if temperature == 0:
        return logits.argmax(-1)
    u = torch.rand(logits.shape, generator=gen, dtype=torch.float64, device=logits.device)
    return (logits.double().exp() / (-torch.log(u)) ** temperature).argmax(-1)


def low_confidence(logits: torch.Tensor, x0: torch.Tensor, zeroed: list[int]) -> torch.Tensor:
    """The float64 softmax probability of x0 [M] under `logits` [M, V], with the `zeroed`
    tokens' logits at −inf first (confidence_eos_eot_inf)."""
    logits = logits.double()
    if zeroed:
        logits = logits.index_fill(-1, torch.tensor(zeroed, device=logits.device), -torch.inf)
    return torch.softmax(logits, dim=-1).gather(-1, x0[:, None]).squeeze(-1)


class LLaDA(DiffusionBackbone):
    """LLaDA-8B (GSAI-ML/LLaDA-8B-Instruct): Gumbel argmax, low-confidence remasking."""

    Config = LLaDAConfig
    arch = "llada"
    shift = False
    mask_names = ("<|mdm_mask|>", "<|mask|>")
    row_settings = frozenset(
        {
            "temperature",
            "remasking",
            "block_length",
            "threshold",
            "factor",
            "entropy_bound",
            "steps",
            *PROPHET_SETTINGS,
        }
    )
    offered_orders: ClassVar[dict[str, tuple[str, ...]]] = {
        "remasking": ("low_confidence", "random")
    }
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {"model": "random", "temperature": 0.7, "remasking": "random"},
        {"model": "random", "cfg_scale": 1.0, "block_length": 5},
        {"model": "random", "temperature": 0.0, "logits_eos_inf": True},
        {"model": "random", "confidence_eos_eot_inf": True, "entropy_bound": 0.5},
        {"model": "random", "factor": 1.0},
        {"model": "random", "block_length": 5, "cache": "dual"},
    ]

    @property
    def passes_per_step(self) -> int:
        return self.config.passes_per_step

    def forward_extra_bytes(self, tokens: int) -> int:
        """Beside the activations (and a packed forward's mask), a step's logits: the head
        runs at once over every eligible position, at most each of the `tokens`, into
        [positions, vocabulary] of the model's dtype, twice with classifier-free guidance
        (253 KB a position on LLaDA-8B in bfloat16, as much as its activations)."""
        head = self.transformer.lm_head.weight
        per_position = head.shape[0] * head.element_size() * self.passes_per_step
        return super().forward_extra_bytes(tokens) + tokens * per_position

    def schedule(
        self, gen_length: int, total_steps: int, block_length: int | None = None
    ) -> tuple[int, int]:
        """(block_length, steps per block), checked as the reference asserts."""
        try:
            return block_schedule(gen_length, block_length or self.config.block_length, total_steps)
        except UserError as exc:
            raise UserError(f"llada: {exc}") from None

    @cached_property
    def end_ids(self) -> tuple[int | None, int | None]:
        """(EOS, EoT): `<|endoftext|>` (else the tokenizer's EOS) and `<|eot_id|>`, the ids
        the reference hard-codes as 126081 and 126348."""
        vocab = self.tokenizer.get_vocab()
        return vocab.get("<|endoftext|>", self.tokenizer.eos_token_id), vocab.get("<|eot_id|>")

    def planned_quota(self, eligible: int, at: BlockStep, gen_length: int, total: int) -> int:
        """Positions an unedited row commits at a step with `eligible` positions that may
        (`commit`'s quota): a cached row's price."""
        if at.even:
            return int(block_quota(gen_length * at.per // total, at.per, torch.tensor(at.j)))
        return -(-eligible // (at.per - at.j))

    def commit(self, ids, attn, offsets, batch: StepBatch):
        c = self.config
        device = self.device
        ids, attn = ids.to(device), attn.to(device)
        n, width = ids.shape
        configs = [self.row_config(batch.setting(i)) for i in range(n)]
        eligible, blocks = self.eligible(ids, offsets, batch)  # masked, not right of the block
        quotas = torch.zeros(n, dtype=torch.long, device=device)
        for i, (off, plen, at) in enumerate(zip(offsets, batch.prompt_lens, blocks, strict=True)):
            gen_length, total = width - off - plen, batch.total(i)
            if "block_length" not in batch.setting(i):
                self.schedule(gen_length, total)  # the configured blocks: as the reference
            if at.even:
                # the block's masked positions when it began (the reference's quota): all but
                # the tokens the row holds there (`constraints`)
                size = gen_length * at.per // total
                size -= sum(at.end - size <= p < at.end for p in self.held(configs[i]))
                quotas[i] = block_quota(size, at.per, torch.tensor(at.j))
            else:  # a row's own blocks that do not divide: even over the steps left
                quotas[i] = -(-int(eligible[i].sum()) // (at.per - at.j))
            if at.last and (batch.was_edited(i) or not at.even):
                # re-masked positions the reference's quota does not count: fill the block
                quotas[i] = int(eligible[i].sum())

        hidden = self.step_hidden(ids, attn, offsets, batch)
        unhidden = None
        if c.cfg_scale > 0:
            unprompted = ids.clone()
            for i, (off, plen) in enumerate(zip(offsets, batch.prompt_lens, strict=True)):
                unprompted[i, off : off + plen] = self.mask_id
                # the reference masks every token it placed before decoding, held ones too
                held = [off + plen + p for p in self.held(configs[i]) if p < width - off - plen]
                unprompted[i, held] = self.mask_id
            unhidden = self.hidden(unprompted, attn)
        # the states the head reads: at the positions a step may commit and, for a row's
        # prediction beyond its block (`ReportsPredictions`) or under Prophet's rule, at its
        # other masked positions (and the rule's answer region: `beside`); the whole
        # [B, L, H] is freed before the head runs
        extra = self.beside(ids, offsets, eligible, batch)
        at = (hidden[eligible], None if unhidden is None else unhidden[eligible])
        aside = None
        if bool(extra.any()):
            aside = (hidden[extra], None if unhidden is None else unhidden[extra])
        del hidden, unhidden
        logits = self.step_logits(*at)  # [M, V]
        del at
        # Prophet's rows: the top-2 logit gap at each position of their answer region
        prophets = [i for i, config in enumerate(configs) if config.prophet]
        answer = torch.zeros_like(eligible)
        for i in prophets:
            off, plen = offsets[i], batch.prompt_lens[i]
            answer[
                i, [off + plen + p for p in self.answer_region(configs[i], width - off - plen)]
            ] = True
        gap = torch.full(ids.shape, torch.nan, dtype=torch.float64, device=device)
        if prophets:
            gap[eligible & answer] = top2_gap(logits[answer[eligible]])
        eos, eot = self.end_ids
        zeroed = [t for t in (eos, eot) if t is not None] if c.confidence_eos_eot_inf else []

        # row by row: each row's Gumbel noise from its own key; float64 work stays one row big
        x0 = torch.zeros(logits.shape[0], dtype=torch.long, device=device)
        picked = torch.zeros(logits.shape[0], dtype=torch.float64, device=device)
        probability = torch.zeros(logits.shape[0], dtype=torch.float64, device=device)
        entropies = torch.full_like(probability, torch.nan)
        order = None
        start = 0
        for i, count in enumerate(eligible.sum(-1).tolist()):
            if count:
                span = slice(start, start + count)
                rows = logits[span]
                gen = purpose_generator(batch.keys[i], batch.steps[i], "token", device)
                x0[span] = gumbel_max(rows, configs[i].temperature, gen)
                probability[span] = low_confidence(rows, x0[span], zeroed)
                if configs[i].entropy_bound is not None:  # EB-Sampler's costs
                    entropies[span] = model_entropy(rows)
                if configs[i].remasking == "low_confidence":
                    picked[span] = probability[span]
                else:
                    if order is None:
                        order = self.noise(batch, offsets, width, "order").to(device)
                    picked[span] = order[i][eligible[i]]
            start += count
        del logits
        confidence = torch.full(ids.shape, -torch.inf, dtype=torch.float64, device=device)
        confidence[eligible] = picked
        proposal = ids.clone()
        proposal[eligible] = x0
        # the prediction beyond the block: the head at the row's other masked positions,
        # drawn as above from noise of their own ("predict")
        # (a Prophet row's committed answer positions are read for their gap, not drawn)
        masked = ids == self.mask_id
        beyond = extra & masked
        beyond_p = torch.full((int(beyond.sum()),), torch.nan, dtype=torch.float64, device=device)
        if aside is not None:
            logits = self.step_logits(*aside)
            if prophets:
                gap[extra & answer] = top2_gap(logits[answer[extra]])
            need = masked[extra]
            drawn = torch.zeros(beyond_p.shape[0], dtype=torch.long, device=device)
            start = done = 0
            for i, count in enumerate(extra.sum(-1).tolist()):
                span = slice(start, start + count)
                rows = logits[span][need[span]]
                if rows.shape[0]:
                    gen = purpose_generator(batch.keys[i], batch.steps[i], "predict", device)
                    mine = slice(done, done + rows.shape[0])
                    drawn[mine] = gumbel_max(rows, configs[i].temperature, gen)
                    if configs[i].prophet:  # the confidence of what its exit may commit
                        beyond_p[mine] = low_confidence(rows, drawn[mine], zeroed)
                    done += rows.shape[0]
                start += count
            proposal[beyond] = drawn
            del logits
        ties = self.noise(batch, offsets, width, "tie").to(device)
        chosen = eligible & top_ranked(confidence, quotas, ties)
        # Fast-dLLM or EB-Sampler: beyond the quota, the proposals the row's rule accepts
        # (low_confidence only)
        entropy = torch.full_like(confidence, torch.nan)
        entropy[eligible] = entropies
        for i, c in enumerate(configs):
            if c.ends_early:
                chosen[i] |= parallel_commits(confidence[i], eligible[i], ties[i], c, entropy[i])
        every = torch.full(ids.shape, torch.nan, dtype=torch.float64, device=device)
        every[eligible] = probability
        every[beyond] = beyond_p
        committed = torch.where(chosen, every, torch.full_like(every, torch.nan))
        new = torch.where(chosen & eligible, proposal, ids)
        # Prophet: a row whose answer region's mean gap reaches its phase's bar commits its
        # draw at every masked position, beyond its block too, and ends
        for i in prophets:
            gaps = gap[i, answer[i]].tolist()
            if gaps and sum(gaps) / len(gaps) >= exit_bar(
                configs[i], batch.steps[i], batch.total(i)
            ):
                new[i] = torch.where(masked[i], proposal[i], ids[i])
                committed[i] = torch.where(masked[i], every[i], torch.nan)
        return new, committed, proposal

    def step_logits(self, hidden: torch.Tensor, unhidden: torch.Tensor | None) -> torch.Tensor:
        """The logits [M, V] the sampler reads from the hidden states [M, H] of M positions:
        the head, with classifier-free guidance from the prompt-masked canvas's states there
        (`unhidden`), and the configured tokens at −inf."""
        c = self.config
        logits = self.head(hidden)
        if unhidden is not None:
            un = self.head(unhidden)
            # the reference's un + (s + 1)(logits - un), in place: the same values (each
            # operation commutes exactly), without three more [M, V] temporaries (on LLaDA-8B,
            # 253 KB each per position)
            logits.sub_(un).mul_(c.cfg_scale + 1).add_(un)
            del un
        if c.suppress_mask:
            logits[:, self.mask_id] = -torch.inf
        eos, _ = self.end_ids
        if c.logits_eos_inf and eos is not None:
            logits[:, eos] = -torch.inf
        return logits


@hookimpl
def dllmbench_register_backbones(register):
    register("llada", LLaDA)
