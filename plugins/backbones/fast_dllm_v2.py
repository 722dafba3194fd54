"""Fast-dLLM v2 (Wu et al., arXiv 2509.26328): Qwen2.5 adapted to block diffusion, on
transformers' own `Qwen2ForCausalLM` under a block-causal mask, sampled as the model's own
batch sampler (`batch_sample` in Efficient-Large-Model/Fast_dLLM_v2_7B's
`generation_functions.py`, which the authors' evaluation harness decodes with) does; where it
departs, and why, is in docs/backbones.md.

It differs from SDAR's sampler (block.py) in four ways, all of them here:

- **Token shift.** The logit of position i is read from the hidden state at i − 1, as an
  autoregressive model reads it (the model keeps Qwen2.5's next-token head).
- **A block's first token is autoregressive.** When a block is finished, the forward that
  stores its keys and values also reads, at its last position, the next block's first token:
  the most probable one, whatever the temperature. That forward is a step of its own (it
  commits one token), and the block's denoising steps start from it.
- **Sub-blocks.** A block's masked positions are filled sub-block by sub-block
  (`sub_block`, the reference's `small_block_size`, counted from the block's start; the last
  one shorter where it does not divide the block, as a row's own `block_length` may not): a
  step runs the whole block against the cache and draws only the masked positions of its
  first unfinished sub-block.
- **Threshold commits.** A step commits every drawn token whose probability is above
  `threshold`, and at least the most probable one. There is no schedule: a block takes as
  many steps as its tokens need.

A row's T (its `steps`) only bounds it: when T is at least gen_length (every step commits at
least one token), the sampler is the reference's; below it, a step commits the fewest tokens
per step (above the threshold's) with which the row still ends within T. The KV cache, its
store shared by forked rows, the stopping rule (after the block in which a row wrote an end
token) and what a step is charged are the block backbone's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.core.flops import Work
from dllmbench.plugins.backbones.base import check_seed, check_temperature, top_ranked
from dllmbench.plugins.backbones.block import (
    BlockDiffusion,
    BlockModelConfig,
    Plan,
    block_work,
    draw_in_chunks,
)
from dllmbench.plugins.backbones.dream import categorical, filter_logits
from dllmbench.plugins.backbones.kvstore import Digests, prompt_digest
from dllmbench.plugins.backbones.loading import DType, device_problem


@dataclass(frozen=True)
class FastDLLMv2Config(BlockModelConfig):
    model: str = "Efficient-Large-Model/Fast_dLLM_v2_7B"  # Hub id, local directory, "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: DType | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (|<MASK>|)
    block_length: int = 32  # the model's bd_size
    sub_block: int = 8  # the reference's small_block_size (counted from each block's start)
    temperature: float = 1.0  # 0: the most probable token (the reference's default)
    top_p: float = 0.95
    threshold: float = 0.9  # commit every token above it, and at least the most probable
    stop: bool = True  # end a row after the block in which it wrote an end token
    cache: bool = True  # False: every step recomputes the blocks before its own
    cache_memory: float | None = None  # GiB the KV cache may hold (default: unbounded)
    seed: int = 0  # initialisation of model="random"
    attention: Literal["sdpa"] = field(default="sdpa", repr=False)

    family: ClassVar[str] = "qwen2"  # the architecture of model="random"
    top_k: ClassVar[None] = None  # the reference filters by top-p only

    def __post_init__(self) -> None:
        if (unusable := device_problem(self.device)) is not None:
            raise ValueError(unusable)
        if self.block_length < 1 or self.sub_block < 1:
            raise ValueError(
                f"block_length and sub_block must be >= 1, got {self.block_length} and "
                f"{self.sub_block} (e.g. 32 and 8)"
            )
        check_temperature(self.temperature)
        check_seed(self.seed)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold!r}")
        if self.cache_memory is not None and self.cache_memory <= 0:
            raise ValueError("cache_memory must be > 0 GiB")


@dataclass(frozen=True)
class Spot:
    """Where a row stands: its current block [lo, end), whether this step reads the block's
    first token from the block before (`opens`), and the positions it draws."""

    current: int
    lo: int
    end: int
    opens: bool
    drawn: torch.Tensor  # positions this step draws: the block's first, or a sub-block's masks


def locate(masked: torch.Tensor, prompt_len: int, block: int, sub: int) -> Spot | None:
    """The row's spot from its masked positions [width] (bool); None when none is masked."""
    where = masked[prompt_len:].nonzero().flatten()
    if not len(where):
        return None
    first = int(where[0]) + prompt_len
    current = first // block
    lo, end = current * block, min((current + 1) * block, len(masked))
    if first == lo and lo > 0:
        return Spot(current, lo, end, True, torch.tensor([lo]))
    part = lo + (first - lo) // sub * sub
    span = masked[part : min(part + sub, end)].nonzero().flatten() + part
    return Spot(current, lo, end, False, span)


def units(masked: torch.Tensor, prompt_len: int, block: int, sub: int) -> tuple[int, list[int]]:
    """What is left of a row from its current block on: its opening steps (one per block whose
    first token is still to be read from the block before) and the masks of each sub-block."""
    opening, sizes = 0, []
    width = len(masked)
    for lo in range(prompt_len // block * block, width, block):
        end = min(lo + block, width)
        ar = lo > 0 and lo >= prompt_len and bool(masked[lo])
        opening += ar
        for part in range(lo, end, sub):
            n = int(masked[max(part, prompt_len) : min(part + sub, end)].sum()) - (
                ar and part == lo
            )
            if n > 0:
                sizes.append(n)
    return opening, sizes


def rate(masked: torch.Tensor, prompt_len: int, block: int, sub: int, steps_left: int) -> int:
    """The fewest tokens a denoising step commits (beyond those above the threshold) with which
    the row still ends within `steps_left` steps: 1, the reference's, whenever the steps left
    are at least the masks left; a whole sub-block when not even that ends it in time."""
    if steps_left >= int(masked[prompt_len:].sum()):  # the openings and sub-blocks' masks
        return 1
    opening, sizes = units(masked, prompt_len, block, sub)
    room = steps_left - opening
    if not sizes or room < len(sizes):
        return max(sizes, default=1)
    low, high = 1, max(sizes)
    while low < high:
        mid = (low + high) // 2
        if sum(-(-n // mid) for n in sizes) <= room:
            high = mid
        else:
            low = mid + 1
    return low


class FastDLLMv2(BlockDiffusion):
    """Fast-dLLM v2 on Qwen2, with its token shift, sub-blocks and threshold commits."""

    Config = FastDLLMv2Config
    arch = "fast-dllm-v2"
    layout = "block"  # its checkpoint loads as the block backbone's (Qwen2)
    shift = True
    row_settings = frozenset(
        {"block_length", "sub_block", "temperature", "top_p", "threshold", "steps"}
    )
    offered_orders: ClassVar[dict[str, tuple[str, ...]]] = {}
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random", "block_length": 8, "sub_block": 4},
        {"model": "random", "block_length": 4, "sub_block": 2, "cache": False},
        {"model": "random", "block_length": 8, "sub_block": 8, "temperature": 0.0},
    ]

    def spot(
        self, tokens: torch.Tensor, prompt_len: int, settings: Mapping[str, Any]
    ) -> Spot | None:
        """Where the row stands under its own settings."""
        c = self.row_config(settings)
        return locate(tokens.cpu() == self.mask_id, prompt_len, c.block_length, c.sub_block)

    def plan(self, tokens: torch.Tensor, prompt_len: int, block: int) -> Plan | None:
        """The forward of the row's step: the block before and the prompt's whole blocks when
        it opens a block (storing them, reading the new block's first token at their last
        position), else its current block against the cache (at its first step, after the
        prompt's whole blocks, which it stores)."""
        masked = tokens == self.mask_id
        spot = locate(masked, prompt_len, block, block)
        if spot is None:
            return None
        first = prompt_len // block
        lo = spot.lo
        if spot.opens:
            run_to = lo
            charged = 0 if (not self.config.cache or spot.current == first) else lo - block
        else:
            run_to = spot.end
            fresh = bool(masked[max(lo, prompt_len) : spot.end].all())
            charged = 0 if (not self.config.cache or fresh) else lo
        digests = Digests(tokens, block, spot.current)
        root = (prompt_digest(tokens[:prompt_len]), block)
        start = charged
        if self.config.cache and start:  # from where the cache stops, if it holds less
            start = min(start, self.store.deepest(root, digests, start // block) * block)
        return Plan(root, digests, start, charged, spot.current, block, spot.end, first, run_to)

    def reopenable(
        self, tokens: torch.Tensor, prompt_len: int, settings: Mapping[str, Any]
    ) -> torch.Tensor:
        """The current block's committed positions but its first, which is read from the
        block before (re-masked, it would be read again, the same token)."""
        open_ = super().reopenable(tokens, prompt_len, settings)
        spot = self.spot(tokens, prompt_len, settings)
        if spot is not None and spot.lo >= prompt_len:
            open_[spot.lo - prompt_len] = False
        return open_

    def step_work(self, batch: StepBatch) -> list[Work]:
        works = []
        for i, tokens in enumerate(batch.tokens):
            block = self.row_config(batch.setting(i)).block_length
            plan = self.plan(tokens.cpu(), batch.prompt_lens[i], block)
            spot = self.spot(tokens, batch.prompt_lens[i], batch.setting(i))
            if plan is None or spot is None:
                works.append(Work(0, 0, 0))
                continue
            works.append(self.work(plan, len(spot.drawn)))
        return works

    def row_works(self, canvas: torch.Tensor, prompt_len: int, total_steps: int) -> list[Work]:
        """Each step of a row that commits exactly its rate per step and never stops early
        (`PricesSteps`): the planner's price of a pass is their mean."""
        c = self.config
        block, sub = c.block_length, c.sub_block
        masked = canvas.cpu() == self.mask_id
        first = prompt_len // block
        works = []
        for step in range(total_steps):
            spot = locate(masked, prompt_len, block, sub)
            if spot is None:
                break
            if spot.opens:
                start = 0 if (not c.cache or spot.current == first) else spot.lo - block
                works.append(block_work(start, spot.lo, block, 1))
                masked[spot.lo] = False
                continue
            fresh = bool(masked[max(spot.lo, prompt_len) : spot.end].all())
            start = 0 if (not c.cache or fresh) else spot.lo
            works.append(block_work(start, spot.end, block, len(spot.drawn)))
            k = rate(masked, prompt_len, block, sub, total_steps - step)
            masked[spot.drawn[:k]] = False
        return works

    def read_states(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block-causal hidden states, shifted one position right: position i's logits
        are read from i − 1, as the sampler reads them."""
        out = super().read_states(ids, attn)
        return torch.cat([out[:, :1], out[:, :-1]], dim=1)

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = len(batch.tokens)
        rows, configs, plans = self.rows_of(batch)
        spots = [
            locate(rows[i] == self.mask_id, batch.prompt_lens[i], c.block_length, c.sub_block)
            for i, c in enumerate(configs)
        ]
        out = [(r.clone(), torch.full(r.shape, float("nan"))) for r in rows]
        live = [i for i in range(n) if plans[i] is not None]
        if not live:
            return out
        self.say_if_hurried(batch, live, hurried)
        hidden, new, _ = self.run([rows[i] for i in live], [plans[i] for i in live])  # type: ignore[misc]
        # a position's logits are read from the hidden state before it (the token shift)
        picks: dict[int, torch.Tensor] = {}
        for j, i in enumerate(live):
            plan, spot = plans[i], spots[i]
            assert plan is not None and spot is not None
            self._store(plan, new[j])
            before = (spot.drawn - 1).clamp(min=plan.start) - plan.start
            picks[i] = before + j * hidden.shape[1]
        # the head and the draw once per sampler (the opening token is the most probable)
        flat = hidden.reshape(-1, hidden.shape[-1])
        drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        kinds = {i: None if spots[i].opens else configs[i] for i in live}  # type: ignore[union-attr]
        for kind in dict.fromkeys(kinds.values()):
            group = [i for i in live if kinds[i] == kind]
            states = flat[torch.cat([picks[i] for i in group]).to(hidden.device)]
            if kind is None:
                u = torch.zeros(len(states), dtype=torch.float64)
            else:
                step_u = {
                    i: self.noise_at(batch.keys[i], batch.steps[i], "token", len(rows[i]))
                    for i in group
                }
                u = torch.cat([step_u[i][spots[i].drawn] for i in group])  # type: ignore[union-attr]
            logits = self.head(states)
            x0, conf = (
                t.cpu()
                for t in draw_in_chunks(draw, logits, u.to(states.device), kind, self.mask_id)
            )
            sizes = [len(spots[i].drawn) for i in group]  # type: ignore[union-attr]
            for i, a, b in zip(group, x0.split(sizes), conf.split(sizes), strict=True):
                drawn[i] = (a, b)
        for i in live:
            plan, spot, c, (tokens, confidence) = plans[i], spots[i], configs[i], out[i]
            assert plan is not None and spot is not None
            x0, conf = drawn[i]
            if spot.opens:
                chosen = torch.ones(1, dtype=torch.bool)
            else:
                prompt_len = batch.prompt_lens[i]
                masked = rows[i] == self.mask_id
                left = batch.total(i) - batch.steps[i]
                k = rate(masked, prompt_len, c.block_length, c.sub_block, left)
                ties = self.noise_at(batch.keys[i], batch.steps[i], "tie", len(tokens))
                least = top_ranked(conf[None], torch.tensor([k]), ties[spot.drawn][None])[0]
                chosen = (conf > c.threshold) | least
            tokens[spot.drawn[chosen]] = x0[chosen]
            confidence[spot.drawn[chosen]] = conf[chosen].float()
            if self.stops(c, tokens, batch.prompt_lens[i], plan):
                rest = tokens[plan.end :]
                rest[rest == self.mask_id] = self.eos_id if self.eos_id is not None else self.pad_id
        return out


def hurried(total: int, gen: int) -> str:
    """What a row's T below its gen_length does to Fast-dLLM v2's decoding."""
    return (
        f"fast-dllm-v2: T={total} is below gen_length={gen}, so each step also commits what "
        "ends the row within T, beyond the tokens above the threshold that the reference "
        f"commits; give --steps {gen} for the reference's decoding"
    )


def draw(
    logits: torch.Tensor, u: torch.Tensor, c: FastDLLMv2Config | None, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A token [M] and its probability [M] (float64) per position: the reference's
    `sample_with_top_p` with keyed uniforms. At temperature 0, or for a block's opening token
    (`c` None), the most probable token and its unfiltered probability; else a draw from
    softmax(top-p(logits / temperature)). The mask token is never drawn."""
    logits = logits.double()
    logits[:, mask_id] = -torch.inf
    if c is None or c.temperature == 0:
        conf, x0 = torch.softmax(logits, dim=-1).max(-1)
        return x0, conf
    probs = torch.softmax(filter_logits(logits / c.temperature, c.top_p, None), dim=-1)
    x0 = categorical(probs, u[:, None])[:, 0]
    return x0, probs.gather(-1, x0[:, None])[:, 0]


@hookimpl
def dllmbench_register_backbones(register):
    register("fast-dllm-v2", FastDLLMv2)
