"""Dream: Qwen2 with bidirectional attention and shifted logits, and its sampler.

The sampler follows Dream's `diffusion_generate`: logits shifted one position right;
temperature, top-p and top-k; a token drawn for every masked position; a confidence per
position by `alg` (origin, maskgit_plus, topk_margin, entropy); and a per-step quota
int(n_masked · (1 − s/t)) with (t, s) consecutive values of linspace(1, eps, T+1) in float32,
the last step taking the rest. The draw and the confidences are computed in float64 from the
logits whatever the model dtype, so a bf16 model samples from its own distribution. With
`alg_temp` > 0 the positions are drawn without replacement with probability
softmax(confidence / alg_temp) (as Gumbel-top-k), else the top-k most confident, equal
confidences ordered by a keyed uniform. The mask token can be committed, as in the reference;
set suppress_mask=true to forbid it. With Fast-dLLM's `threshold` or `factor` (maskgit_plus
only), or EB-Sampler's `entropy_bound` (any alg but origin), a step also commits the eligible
positions its rule accepts, beyond the quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.plugins.backbones.base import (
    ATTENTIONS,
    PROPHET_SETTINGS,
    Attention,
    BlockStep,
    DiffusionBackbone,
    RowRefusals,
    check_finite,
    check_parallel,
    check_prophet,
    check_seed,
    check_temperature,
    exit_bar,
    model_entropy,
    parallel_commits,
    rules_set,
    top2_gap,
    top_ranked,
)
from dllmbench.plugins.backbones.fastcache import Cache, check_cache
from dllmbench.plugins.backbones.loading import DType, device_problem, positions_of

Alg = Literal["origin", "maskgit_plus", "topk_margin", "entropy"]
ALGS: tuple[str, ...] = get_args(Alg)
RANKED_ALGS = ("maskgit_plus", "topk_margin", "entropy")  # commit by a confidence, not at random


@dataclass(frozen=True)
class DreamConfig(RowRefusals):
    model: str = "Dream-org/Dream-v0-Instruct-7B"  # Hub id, local directory, or "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: DType | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (151666)
    temperature: float = 0.5
    top_p: float = 1.0
    top_k: int | None = None
    alg: Alg = "maskgit_plus"
    alg_temp: float | None = 0.5
    eps: float = 1e-3
    # semi-autoregressive commit order: blocks of this many positions left to right, T spread
    # evenly over them, each block on Dream's schedule (None: one block, the reference)
    block_length: int | None = None
    suppress_mask: bool = False  # never sample the mask token (the reference can)
    # Fast-dLLM's parallel decoding on top of the schedule (docs/backbones.md): also commit
    # the eligible positions whose token probability is >= threshold, or the factor rule's
    threshold: float | None = None
    factor: float | None = None
    # EB-Sampler's parallel decoding on top of the schedule: also commit, in the order of
    # `alg`'s confidence, the longest run whose entropies less their largest sum to <= this
    entropy_bound: float | None = None
    # Prophet's early exit and held tokens, as LLaDA's (docs/backbones.md): once the mean
    # top-2 logit gap over the answer region reaches its phase's bar, every masked position
    # takes its draw and the row ends
    prophet: bool = False
    answer_at: int | None = None
    answer_length: int = 5
    early_gap: float = 7.5
    mid_gap: float = 5.0
    late_gap: float = 2.5
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
        check_cache(self.cache, self.block_length, self.attention)
        if self.alg not in ALGS:
            raise ValueError(f"alg must be one of {', '.join(ALGS)}, got {self.alg!r}")
        check_temperature(self.temperature)
        check_seed(self.seed)
        if self.alg_temp is not None:
            works = "0 or None: the most confident positions, no draw; e.g. 0.5"
            check_finite("alg_temp", self.alg_temp, works)
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 < self.eps < 1:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and 0 < eps < 1")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError("block_length must be >= 1")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be >= 1")
        check_parallel(self, ("alg", self.alg, "maskgit_plus"), RANKED_ALGS)
        check_prophet(self)

    @property
    def positions(self) -> int | None:
        """Positions of the model (prompt and canvas), from its config.json (`KnowsPositions`)."""
        return positions_of(self.model)

    @property
    def deterministic(self) -> bool:
        """True when different keys cannot give different samples (up to exact ties of float64
        confidences): argmax tokens (temperature 0), committed by confidence (not `origin`'s
        random order) without a position draw (alg_temp None or 0)."""
        return self.temperature == 0 and self.alg != "origin" and not self.alg_temp

    @property
    def ends_early(self) -> bool:
        """A parallel decoding rule (threshold, factor, entropy_bound) may fill a row's canvas
        before its T."""
        return bool(rules_set(self)) or self.prophet

    @property
    def approximate(self) -> bool:
        """True when the sampler reads hidden states from Fast-dLLM's approximate cache."""
        return self.cache != "none"


def filter_logits(logits: torch.Tensor, top_p: float, top_k: int | None) -> torch.Tensor:
    """Dream's top-p (keeps the first token past the threshold) and top-k filters."""
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        drop = torch.zeros_like(remove).scatter(-1, order, remove)
        logits = logits.masked_fill(drop, torch.finfo(logits.dtype).min)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    return logits


def categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws [M, S] from the rows of `probs` [M, V] (float64), one per uniform of
    `u` [M, S]. A token of probability 0 is never drawn."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:].contiguous()
    drawn = torch.searchsorted(cdf, u * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last token the CDF still rises at
    return torch.minimum(drawn, last)


def sample_tokens(
    logits: torch.Tensor, u: torch.Tensor, c: DreamConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's `sample_tokens` in float64 whatever the model dtype: tokens [M, S] drawn from
    softmax(filter(logits / temperature)) with the uniforms `u` [M, S] (argmax at temperature
    0), and their float64 confidence by `alg`: the probability of the token (origin,
    maskgit_plus), top-1 minus top-2 (topk_margin), or the negative entropy (entropy)."""
    x0, confidence, _ = draw(logits, u, c)
    return x0, confidence


def draw(
    logits: torch.Tensor, u: torch.Tensor, c: DreamConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`sample_tokens`, and with `entropy_bound` set the model's entropy [M] at each position
    (`model_entropy`: before temperature and filters; None otherwise)."""
    logits = logits.double()
    entropy = model_entropy(logits) if c.entropy_bound is not None else None
    if c.temperature > 0:
        logits = logits / c.temperature
    probs = torch.softmax(filter_logits(logits, c.top_p, c.top_k), dim=-1)
    if c.temperature > 0:
        x0 = categorical(probs, u)
        confidence = probs.gather(-1, x0)
    else:
        confidence, x0 = (t[:, None].expand_as(u) for t in probs.max(-1))
    if c.alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = (top2[:, 0] - top2[:, 1])[:, None].expand_as(u)
    elif c.alg == "entropy":
        confidence = (probs * torch.log(probs + 1e-10)).sum(-1)[:, None].expand_as(u)
    return x0, confidence, entropy


# float64 elements of one chunk of [positions, vocabulary] (512 MB): bounds the sampler's memory
CHUNK_ELEMENTS = 1 << 26


def quota(n_masked: torch.Tensor, steps: torch.Tensor, total: int, eps: float) -> torch.Tensor:
    """Tokens to commit per row: int(n · (1 − s/t)) in float32; the last step takes all."""
    grid = torch.linspace(1, eps, total + 1)
    t, s = grid[steps], grid[steps + 1]
    k = (n_masked.float() * (1 - s / t)).long()
    return torch.where(steps == total - 1, n_masked, k)


class Dream(DiffusionBackbone):
    """Dream-7B (Dream-org/Dream-v0-Instruct-7B): its own sampler, maskgit_plus by default."""

    Config = DreamConfig
    arch = "dream"
    shift = True
    mask_names = ("<|mask|>",)
    row_settings = frozenset(
        {
            "temperature",
            "top_p",
            "top_k",
            "alg",
            "alg_temp",
            "block_length",
            "threshold",
            "factor",
            "entropy_bound",
            "steps",
            *PROPHET_SETTINGS,
        }
    )
    # the confidence rules (`origin` is a random order, not a rule to mix)
    offered_orders: ClassVar[dict[str, tuple[str, ...]]] = {"alg": RANKED_ALGS}
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {"model": "random", "alg": "entropy", "alg_temp": 0.0, "temperature": 0.0},
        {"model": "random", "alg": "topk_margin", "entropy_bound": 0.5},
        {"model": "random", "alg": "origin", "top_p": 0.9},
        {"model": "random", "factor": 1.0},
        {"model": "random", "block_length": 2, "cache": "prefix"},
    ]

    def propose(
        self, hidden: torch.Tensor, u: torch.Tensor, c: DreamConfig | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`propose_with_gaps` without Prophet's gaps."""
        return self.propose_with_gaps(hidden, u, c)[:3]

    def propose_with_gaps(
        self, hidden: torch.Tensor, u: torch.Tensor, c: DreamConfig | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A token [M], its float64 confidence [M] and its distribution's float64 entropy [M]
        (NaN unless `entropy_bound` is set) for each masked position's hidden state [M, H],
        drawn with its uniform `u` [M] under the sampler settings `c` (default: the
        backbone's); the head runs in chunks of positions."""
        c = c or self.config
        vocab = self.transformer.lm_head.weight.shape[0]
        size = max(1, CHUNK_ELEMENTS // vocab)
        tokens, confidences, entropies, gaps = [], [], [], []
        for start in range(0, hidden.shape[0], size):
            logits = self.head(hidden[start : start + size])
            if c.suppress_mask:
                logits[:, self.mask_id] = -torch.inf
            if c.prophet:  # Prophet's gap, of the logits before temperature and filters
                gaps.append(top2_gap(logits))
            x0, confidence, entropy = draw(logits, u[start : start + size, None], c)
            tokens.append(x0[:, 0])
            confidences.append(confidence[:, 0])
            unknown = torch.full_like(confidence[:, 0], torch.nan)
            entropies.append(unknown if entropy is None else entropy)
        if not tokens:
            none = hidden.new_zeros(0, dtype=torch.float64)
            return hidden.new_zeros(0, dtype=torch.long), none, none, none
        entropy = torch.cat(entropies)
        gap = torch.cat(gaps) if gaps else torch.full_like(entropy, torch.nan)
        return torch.cat(tokens), torch.cat(confidences), entropy, gap

    def planned_quota(self, eligible: int, at: BlockStep, gen_length: int, total: int) -> int:
        """Positions an unedited row commits at a step with `eligible` positions that may
        (the quota; `origin` commits that many in expectation): a cached row's price."""
        steps = torch.tensor([at.j])
        return int(quota(torch.tensor([eligible]), steps, at.per, self.config.eps)[0])

    def commit(self, ids, attn, offsets, batch: StepBatch):
        hidden = self.step_hidden(ids, attn, offsets, batch)
        device = hidden.device
        n, width = ids.shape
        ids = ids.to(device)
        configs = [self.row_config(batch.setting(i)) for i in range(n)]

        drawn: dict[str, torch.Tensor] = {}

        def noise(purpose: str) -> torch.Tensor:
            if purpose not in drawn:
                drawn[purpose] = self.noise(batch, offsets, width, purpose).to(device)
            return drawn[purpose]

        # each row's current block: masked positions right of it wait for a later step
        eligible, at = self.eligible(ids, offsets, batch)
        in_block = [(a.j, a.per) for a in at]  # (step within the block, steps per block)

        # one draw per eligible position, under its row's sampler settings
        token_u = noise("token")
        proposal = ids.clone()
        confidence = torch.full(ids.shape, -torch.inf, dtype=torch.float64, device=device)
        entropy = torch.full(ids.shape, torch.nan, dtype=torch.float64, device=device)
        gap = torch.full(ids.shape, torch.nan, dtype=torch.float64, device=device)
        for c in dict.fromkeys(configs):
            rows = torch.tensor([cfg == c for cfg in configs], device=device)
            where = eligible & rows[:, None]
            proposal[where], confidence[where], entropy[where], gap[where] = self.propose_with_gaps(
                hidden[where], token_u[where], c
            )

        # which positions commit: rows with one sampler and block schedule at a time
        chosen = torch.zeros_like(eligible)
        groups: dict[tuple[DreamConfig, int], list[int]] = {}
        for i, c in enumerate(configs):
            groups.setdefault((c, in_block[i][1]), []).append(i)
        for (c, per), members in groups.items():
            idx = torch.tensor(members, device=device)
            j = torch.tensor([in_block[i][0] for i in members])
            if c.alg == "origin":
                grid = torch.linspace(1, c.eps, per + 1)
                p = torch.where(j == per - 1, torch.ones(len(members)), 1 - grid[j + 1] / grid[j])
                order = noise("order")[idx]
                chosen[idx] = eligible[idx] & (order < p.to(device)[:, None])
                continue
            score = confidence[idx]
            if c.alg_temp:
                u = noise("position")[idx]
                score = score / c.alg_temp - torch.log(-torch.log(u.clamp(1e-300, 1 - 1e-16)))
            k = quota(eligible[idx].sum(-1).cpu(), j, per, c.eps).to(device)
            chosen[idx] = eligible[idx] & top_ranked(score, k, noise("tie")[idx])
        # Fast-dLLM or EB-Sampler: beyond the quota, the proposals the row's rule accepts
        for i, c in enumerate(configs):
            if c.ends_early:
                ties = noise("tie")[i]
                chosen[i] |= parallel_commits(confidence[i], eligible[i], ties, c, entropy[i])
        new = torch.where(chosen, proposal, ids)
        committed = torch.where(chosen, confidence, torch.full_like(confidence, torch.nan))
        # a row's prediction beyond its block (`ReportsPredictions`), and a row's under
        # Prophet's rule (`beside`): its other masked positions drawn as the eligible ones
        # are, each with its own position's uniform (a Prophet row's committed answer
        # positions are read for their gap, not drawn)
        extra = self.beside(ids, offsets, eligible, batch)
        masked = ids == self.mask_id
        if bool(extra.any()):
            for c in dict.fromkeys(configs):
                rows = torch.tensor([cfg == c for cfg in configs], device=device)
                where = extra & rows[:, None]
                if bool(where.any()):
                    x0, sure, _, gaps = self.propose_with_gaps(hidden[where], token_u[where], c)
                    drawn = masked[where]
                    proposal[where & masked] = x0[drawn]
                    confidence[where & masked] = sure[drawn]
                    gap[where] = gaps
        # Prophet: a row whose answer region's mean gap reaches its phase's bar commits its
        # draw at every masked position, beyond its block too, and ends
        for i, c in enumerate(configs):
            if not c.prophet:
                continue
            off, plen = offsets[i], batch.prompt_lens[i]
            region = self.answer_region(c, width - off - plen)
            gaps = gap[i, [off + plen + p for p in region]].tolist()
            if gaps and sum(gaps) / len(gaps) >= exit_bar(c, batch.steps[i], batch.total(i)):
                new[i] = torch.where(masked[i], proposal[i], ids[i])
                committed[i] = torch.where(masked[i], confidence[i], torch.nan)
        return new, committed, proposal


@hookimpl
def dllmbench_register_backbones(register):
    register("dream", Dream)
