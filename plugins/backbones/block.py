"""Block diffusion (SDAR, SDAR-MoE, TraDo, LLaDA2.0): transformers' own Qwen3, Qwen3-MoE
(sdar_moe.py), Qwen2 or Glm4Moe class (llada2_moe.py) under a block-causal mask, sampled
block by block with an exact KV cache of the committed blocks.

The canvas (the prompt and gen_length masks) is cut into blocks of `block_length` counted from
position 0, as SDAR's `block_diffusion_generate` does: the prompt's whole blocks are context,
and its tail shares the first block with masks; when the prompt does not end on a boundary,
the last block is as much shorter (SDAR's canvas runs on to the boundary; under block-causal
attention no earlier block sees the difference). When a row's T splits evenly over
gen_length / block_length blocks into S steps that divide the block, each step commits
k = block_length / S tokens (SDAR's schedule; the two partial blocks share one block's
steps); otherwise every block written gets an even share of T and commits its masks over the
steps of its share that are left. The last step takes whatever its block has left.

Each step runs the row's current block (the first holding a mask) against the cache of the
blocks before it, draws a token for each masked position (temperature, top-k, top-p, keyed
uniforms as in Dream), and commits by `remasking`: the k most confident
(`low_confidence_static`), every position above `threshold` when there are at least k of
them, else the k most confident (`low_confidence_dynamic`), or the first k (`sequential`);
with EB-Sampler's `entropy_bound` also the most confident positions while their entropies,
less the largest, sum to at most the bound (base.py: `entropy_bound_count`).
A block once filled is context: the row's next step stores its keys and values in the cache
while it denoises the next block (one forward where the reference spends two). With `stop`,
a row ends after the block in which it wrote an end token, as the reference's stopping
criterion; its remaining positions are filled with that token. With `eos_early_stop` it ends
at the step that commits an end token once every position before the first one is written
(LLaDA2's option): the same text, fewer steps.

The cache (kvstore.py) names entries by their content, so rows forked or repeated from a
parent reuse the parent's blocks instead of recomputing them, and frees them when the problem
ends. A row is charged what it computes as if alone: each step its current block, plus the
block it finished at the step before (at its first step, the prompt's whole blocks); the LM
head only at the masked positions it samples. With `cache=false` every step recomputes
everything before the current block instead, for comparison.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.core.errors import Notice
from dllmbench.core.flops import Work
from dllmbench.plugins.backbones.base import (
    DiffusionBackbone,
    RowRefusals,
    check_entropy_bound,
    check_seed,
    check_temperature,
    entropy_bound_count,
    model_entropy,
    purpose_generator,
    ranked_order,
    top_ranked,
)
from dllmbench.plugins.backbones.dream import CHUNK_ELEMENTS, categorical, filter_logits
from dllmbench.plugins.backbones.kvstore import (
    Digests,
    Entry,
    PrefixStore,
    Root,
    prompt_digest,
)
from dllmbench.plugins.backbones.loading import (
    RANDOM_POSITIONS,
    DType,
    device_problem,
    positions_of,
)

Remasking = Literal["low_confidence_static", "low_confidence_dynamic", "sequential"]
REMASKINGS: tuple[str, ...] = get_args(Remasking)
Family = Literal["qwen3", "qwen2", "qwen3_moe", "llada2"]


class BlockModelConfig(RowRefusals):
    """What a block-diffusion model's Config says of itself (`KnowsPositions`,
    `MaybeDeterministic`, `EndsEarly`), from its `model` and `temperature`."""

    model: str
    temperature: float

    @property
    def positions(self) -> int | None:
        return positions_of(self.model)

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0

    @property
    def ends_early(self) -> bool:
        """Always: a row ends once its blocks are written, or at an end token."""
        return True


@dataclass(frozen=True)
class BlockConfig(BlockModelConfig):
    model: str = "JetLM/SDAR-8B-Chat"  # Hub id, local directory, or "random"
    device: str | None = None  # default: cuda when available, else cpu
    dtype: DType | None = None  # default: bfloat16 on GPU, float32 on CPU
    chat: bool | None = None  # use the chat template; default: when the tokenizer has one
    mask_id: int | None = None  # default: from config.json or the tokenizer (<|MASK|>)
    block_length: int = 4  # SDAR's and TraDo's
    temperature: float = 1.0  # 0: the most probable token
    top_k: int | None = None
    top_p: float = 1.0
    remasking: Remasking = "low_confidence_dynamic"
    threshold: float = 0.85  # low_confidence_dynamic's confidence threshold
    # EB-Sampler's rule on top of `remasking`: also commit the most confident positions while
    # their entropies less the largest sum to <= this (nats)
    entropy_bound: float | None = None
    stop: bool = True  # end a row after the block in which it wrote an end token
    # end it at the step that commits an end token with every position before it written
    # (LLaDA2's `eos_early_stop`): the same text, fewer steps
    eos_early_stop: bool = False
    cache: bool = True  # False: every step recomputes the blocks before its own
    cache_memory: float | None = None  # GiB the KV cache may hold (default: unbounded)
    # the architecture of model="random" (qwen3_moe: SDAR-MoE's; llada2: LLaDA2.0's MoE)
    family: Family = "qwen3"
    seed: int = 0  # initialisation of model="random"
    attention: Literal["sdpa"] = field(default="sdpa", repr=False)

    def __post_init__(self) -> None:
        if (unusable := device_problem(self.device)) is not None:
            raise ValueError(unusable)
        if self.remasking not in REMASKINGS:
            raise ValueError(f"remasking must be one of {', '.join(REMASKINGS)}")
        if self.block_length < 1:
            raise ValueError("block_length must be >= 1")
        check_temperature(self.temperature)
        check_seed(self.seed)
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need temperature >= 0 and 0 < top_p <= 1")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be >= 1")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold!r}")
        check_entropy_bound(self.entropy_bound)
        if self.family not in get_args(Family):
            raise ValueError(f"family must be one of {', '.join(get_args(Family))}")
        if self.cache_memory is not None and self.cache_memory <= 0:
            raise ValueError("cache_memory must be > 0 GiB")


# every family's tiny random model (model="random"): the mixtures of experts add their experts
RANDOM_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": RANDOM_POSITIONS,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Plan:
    """One row's forward at one step: the tokens [start, end) it runs against the cached
    prefix before `start`, the block it denoises, and what its charge counts from."""

    root: Root
    digests: Digests  # names of the row's prefixes up to the current block's start
    start: int  # first query position (a block boundary)
    charged_from: int  # the row alone would run from here (its charge)
    block: int  # the current block's index
    length: int  # block length
    end: int  # the current block's end
    first: int  # the first decoded block (the prompt's whole blocks are before it)
    run_to: int = -1  # the forward's last query + 1 (-1: `end`, the current block's end)

    def __post_init__(self) -> None:
        if self.run_to < 0:
            object.__setattr__(self, "run_to", self.end)


class BlockDiffusion(DiffusionBackbone):
    """A block-diffusion LM (SDAR, SDAR-MoE, TraDo, LLaDA2.0) on Qwen3, Qwen3-MoE, Qwen2 or
    Glm4Moe, with an exact KV cache."""

    Config = BlockConfig
    arch = "block"
    shift = False
    # no predictions of the whole canvas (`ReportsPredictions`): a step's forward covers only
    # the current block (the committed blocks are cached, the later ones not yet computed),
    # and a prediction of the current block alone is not yet reported either
    predicts = False
    mask_names = ("<|MASK|>", "|<MASK>|", "<|mask|>")
    row_settings = frozenset(
        {
            "block_length",
            "temperature",
            "top_k",
            "top_p",
            "remasking",
            "threshold",
            "entropy_bound",
            "steps",
        }
    )
    offered_orders: ClassVar[dict[str, tuple[str, ...]]] = {"remasking": REMASKINGS}
    contract_configs: ClassVar[list[dict]] = [
        {"model": "random"},
        {
            "model": "random",
            "family": "qwen2",
            "remasking": "low_confidence_static",
            "entropy_bound": 2.0,
        },
        {"model": "random", "cache": False, "temperature": 0.0},
        {"model": "random", "family": "qwen3_moe", "block_length": 8},
    ]

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        budget = self.config.cache_memory
        self.store = PrefixStore(None if budget is None else int(budget * 2**30))
        self.computed_queries = 0  # query tokens every forward computed (tests, benchmarks)
        params = inspect.signature(self.transformer.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._ends = torch.tensor(sorted(self.stop_ids), dtype=torch.long)  # `stops_early`

    def random_transformer(self, tokenizer: Any) -> torch.nn.Module:
        from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

        family, seed = self.config.family, self.config.seed
        shape = {**RANDOM_SHAPE, "vocab_size": len(tokenizer)}
        if family == "llada2":
            from dllmbench.plugins.backbones.llada2_moe import random_llada2

            return random_llada2(shape, seed, self.dtype)
        if family == "qwen3_moe":
            from dllmbench.plugins.backbones.sdar_moe import random_sdar_moe

            return random_sdar_moe(shape, seed, self.dtype)
        qwen3 = family == "qwen3"
        config = Qwen3Config(**shape) if qwen3 else Qwen2Config(**shape)
        config._attn_implementation = "sdpa"
        with torch.random.fork_rng():
            torch.manual_seed(self.config.seed)
            net = (Qwen3ForCausalLM if qwen3 else Qwen2ForCausalLM)(config)
        return net.to(self.dtype).eval().requires_grad_(False)

    # -- the state the engine holds per problem (`KeepsState`) --------------------------------
    def hold(self, prompt_ids: Sequence[int]) -> None:
        self.store.hold(prompt_ids)

    def release(self, prompt_ids: Sequence[int]) -> None:
        self.store.release(prompt_ids)

    def cache_bytes(self, tokens: int) -> int:
        """Memory of the cached keys and values of `tokens` tokens (`CountsCacheMemory`),
        twice over: the store's entries, and each row's prefix kept whole between steps."""
        layers, two, heads, _, head_dim = self._kv_shape(1)
        return 2 * layers * two * heads * head_dim * tokens * self.dtype.itemsize

    def limit_cache(self, nbytes: int) -> None:
        """Bound the cache, unless `cache_memory` did."""
        if self.config.cache_memory is None:
            self.store.budget = int(nbytes)

    def finishes_early(self, settings: Mapping[str, Any]) -> bool:
        """Always: a row ends once its blocks are written (or after an end token, `stop`),
        which under a confidence threshold is before its T."""
        return True

    # -- canvases and schedules -----------------------------------------------------------------
    def check_row_settings(
        self, settings: Mapping[str, Any], gen_length: int, total_steps: int
    ) -> None:
        self.row_config(settings)

    @staticmethod
    def quota(
        block: int,
        prompt_len: int,
        width: int,
        total: int,
        step: int,
        current: int,
        masked: int,
        edited: bool = False,
    ) -> int:
        """Tokens a row commits at `step` of its T in its current block, which has `masked`
        masked positions. SDAR's schedule when T splits evenly over gen_length / block_length
        blocks into S steps that divide the block: k = block / S at every step. Otherwise,
        or when canvas edits re-masked positions of the block (`edited`), each block written
        gets an even share of T (as `block_step`) and commits what is masked over the steps of
        its share left, so an edited block still ends with its share. The last step takes
        what is left."""
        if step >= total - 1:
            return masked
        gen = width - prompt_len
        blocks = gen // block
        if not edited and gen % block == 0 and total % blocks == 0:
            per = total // blocks
            if per <= block and block % per == 0:
                return block // per
        first = prompt_len // block
        written = -(-width // block) - first
        end = -(-(current - first + 1) * total // written)
        return -(-masked // max(1, end - step))

    def plan(self, tokens: torch.Tensor, prompt_len: int, block: int) -> Plan | None:
        """Where the row stands: its current block, what its cache holds, what it is charged
        from. None when no position is masked."""
        masked = (tokens == self.mask_id).nonzero().flatten()
        masked = masked[masked >= prompt_len]
        if not len(masked):
            return None
        first = prompt_len // block
        current = int(masked[0]) // block
        lo, end = current * block, min((current + 1) * block, len(tokens))
        fresh = bool((tokens[max(lo, prompt_len) : end] == self.mask_id).all())
        if not self.config.cache:
            charged = 0
        elif fresh:  # the block before was finished at the last step: store it now
            charged = 0 if current == first else lo - block
        else:
            charged = lo
        digests = Digests(tokens, block, current)
        root = (prompt_digest(tokens[:prompt_len]), block)
        start = charged
        if self.config.cache and start:  # from where the cache stops, if it holds less
            start = min(start, self.store.deepest(root, digests, start // block) * block)
        return Plan(root, digests, start, charged, current, block, end, first)

    @staticmethod
    def work(plan: Plan, head: int) -> Work:
        """The row's charge: tokens [charged_from, run_to) under the block-causal mask."""
        return block_work(plan.charged_from, plan.run_to, plan.length, head)

    def reopenable(
        self, tokens: torch.Tensor, prompt_len: int, settings: Mapping[str, Any]
    ) -> torch.Tensor:
        """[gen_length] the committed generated positions a canvas edit may re-mask
        (`ReopensPositions`): those of the current block. Blocks before it are committed for
        good (their keys and values are cached, exact), and a row with nothing masked has
        ended."""
        open_ = torch.zeros(len(tokens) - prompt_len, dtype=torch.bool)
        plan = self.plan(tokens.cpu(), prompt_len, self.row_config(settings).block_length)
        if plan is not None:
            lo = max(plan.end - plan.length, prompt_len)
            open_[lo - prompt_len : plan.end - prompt_len] = True
            open_ &= tokens[prompt_len:].cpu() != self.mask_id
        return open_

    def step_work(self, batch: StepBatch) -> list[Work]:
        works = []
        for i, tokens in enumerate(batch.tokens):
            block = self.row_config(batch.setting(i)).block_length
            plan = self.plan(tokens, batch.prompt_lens[i], block)
            if plan is None:
                works.append(Work(0, 0, 0))
                continue
            head = int(
                (
                    tokens[max(plan.end - block, batch.prompt_lens[i]) : plan.end] == self.mask_id
                ).sum()
            )
            works.append(self.work(plan, head))
        return works

    def row_works(self, canvas: torch.Tensor, prompt_len: int, total_steps: int) -> list[Work]:
        """Each step of a row that commits exactly its quota per step and never stops early
        (`PricesSteps`): the planner's price of a pass is their mean."""
        block, width = self.config.block_length, len(canvas)
        first = prompt_len // block
        left = {
            c: min((c + 1) * block, width) - max(c * block, prompt_len)
            for c in range(first, -(-width // block))
        }
        works, fresh = [], True
        for step in range(total_steps):
            current = next((c for c, n in left.items() if n), None)
            if current is None:
                break
            if not self.config.cache:
                start = 0
            elif fresh:
                start = 0 if current == first else (current - 1) * block
            else:
                start = current * block
            end = min((current + 1) * block, width)
            works.append(block_work(start, end, block, left[current]))
            k = self.quota(block, prompt_len, width, total_steps, step, current, left[current])
            left[current] -= min(k, left[current])
            fresh = not left[current]
        return works

    # -- the forward ---------------------------------------------------------------------------
    @torch.no_grad()
    def run(
        self, rows: Sequence[torch.Tensor], plans: Sequence[Plan]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """One forward of every row's tokens [start, run_to) against its cached prefix: the last
        hidden states [n, Q, H] (row i's query q at position start_i + q), and the new keys
        and values [n, layers, 2, kv heads, Q, head dim]."""
        from transformers import DynamicCache

        n = len(rows)
        prefixes = [
            self.store.prefix(p.root, p.digests[p.start // p.length]) if p.start else None
            for p in plans
        ]
        widths = [p.run_to - p.start for p in plans]
        q, k = max(widths), max(p.start for p in plans)
        dev, dtype = self.device, self.dtype
        ids = torch.full((n, q), self.pad_id, dtype=torch.long)
        positions = torch.zeros((n, q), dtype=torch.long)
        allowed = torch.zeros((n, q, k + q), dtype=torch.bool)
        for i, (tokens, p) in enumerate(zip(rows, plans, strict=True)):
            ids[i, : widths[i]] = tokens[p.start : p.run_to]
            pos = torch.arange(p.start, p.start + q)
            positions[i] = pos
            allowed[i, :, k - p.start : k] = True  # the cached prefix: earlier blocks
            own = pos[: widths[i]] // p.length
            allowed[i, :, k : k + widths[i]] = own[None, :] <= (pos // p.length)[:, None]
            allowed[i, widths[i] :, k + widths[i] :] = True  # padding queries see padding
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )[:, None]
        cache = DynamicCache()
        if k:
            for p, prefix in zip(plans, prefixes, strict=True):
                if p.start and (prefix is None or prefix.shape[3] != p.start):
                    raise RuntimeError(f"the cache lacks [0, {p.start}) of a row")
            if all(p.start == k for p in plans):  # one length: stacked, no padding
                kv = torch.stack(prefixes, dim=2)  # type: ignore[arg-type]
            else:
                layers, two, heads, _, head_dim = self._kv_shape(k)
                kv = torch.zeros((layers, two, n, heads, k, head_dim), dtype=dtype, device=dev)
                for i, (p, prefix) in enumerate(zip(plans, prefixes, strict=True)):
                    if prefix is not None:
                        kv[:, :, i, :, k - p.start :] = prefix
            for layer in range(kv.shape[0]):  # [layers, 2, rows, kv heads, tokens, head dim]
                cache.update(kv[layer, 0], kv[layer, 1], layer)
        out = self.transformer.model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
            **{self._cache_arg: cache},
        )
        self.computed_queries += sum(widths)
        self.store.settle()
        layers = cache.layers if hasattr(cache, "layers") else None
        if layers is not None:
            pairs = [(lay.keys, lay.values) for lay in layers]
        else:  # transformers before the layered cache
            pairs = [(cache.key_cache[i], cache.value_cache[i]) for i in range(len(cache))]
        # only the queries' own entries are new: the prefix is cut before stacking, not copied
        # twice to be dropped (on a 7B model, gigabytes of traffic a step)
        new = torch.stack(
            [torch.stack([key[..., k:, :], value[..., k:, :]]) for key, value in pairs]
        )
        new = new.permute(2, 0, 1, 3, 4, 5)  # [n, layers, 2, kv heads, Q, d]
        return out.last_hidden_state, new, prefixes

    def _kv_shape(self, tokens: int) -> tuple[int, ...]:
        config = self.transformer.config
        heads = int(config.num_key_value_heads)
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        return (int(config.num_hidden_layers), 2, heads, tokens, int(head_dim))

    def _store(self, plan: Plan, new: torch.Tensor) -> None:
        """Keep what the forward computed of the finished blocks before the current one: the
        prompt's whole blocks as one entry, then one entry per block."""
        if not self.config.cache:
            return
        bounds = [plan.start]
        first = plan.first * plan.length
        if plan.start < first:
            bounds.append(first)
        bounds += range(
            max(plan.start, first) + plan.length, plan.block * plan.length + 1, plan.length
        )
        for lo, hi in itertools.pairwise(bounds):
            if hi <= lo:
                continue
            digest = plan.digests[hi // plan.length]
            if (plan.root, digest) in self.store:
                continue
            parent = plan.digests[lo // plan.length] if lo else None
            kv = new[:, :, :, lo - plan.start : hi - plan.start].clone()
            self.store.put(plan.root, digest, Entry(parent, lo, hi, kv))

    def computed_rows(self, batch: StepBatch) -> list[int]:
        """Every row: a block step computes each row's own queries against its own cache."""
        return list(range(len(batch.tokens)))

    def read_states(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, L, H] of a left-padded batch under the block-causal mask (each
        row's blocks counted from its first real token), no cache; `logits` is their head."""
        width = ids.shape[1]
        block = self.config.block_length
        attn = attn.cpu()  # the mask is built on the CPU, whichever device the batch is on
        real = attn.bool()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        blocks = pos // block
        allowed = (blocks[:, None, :] <= blocks[:, :, None]) & real[:, None, :]
        allowed |= torch.eye(width, dtype=torch.bool)[None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill(
            ~allowed, torch.finfo(self.dtype).min
        )[:, None]
        with torch.no_grad():
            out = self.transformer.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=pos.to(self.device),
                use_cache=False,
            ).last_hidden_state
        return out

    # -- one step --------------------------------------------------------------------------------
    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        return [tokens for tokens, _ in self.denoise_step_with_confidence(batch)]

    def rows_of(self, batch: StepBatch) -> tuple[list[torch.Tensor], list[Any], list[Plan | None]]:
        """A batch's rows on the CPU, each row's own Config, and its plan for this step."""
        rows = [t.cpu() for t in batch.tokens]
        configs = [self.row_config(batch.setting(i)) for i in range(len(rows))]
        plans = [
            self.plan(row, plen, c.block_length)
            for row, plen, c in zip(rows, batch.prompt_lens, configs, strict=True)
        ]
        return rows, configs, plans

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = len(batch.tokens)
        rows, configs, plans = self.rows_of(batch)
        out = [(r.clone(), torch.full(r.shape, float("nan"))) for r in rows]
        live = [i for i in range(n) if plans[i] is not None]
        if not live:
            return out
        hidden, new, _ = self.run([rows[i] for i in live], [plans[i] for i in live])  # type: ignore[misc]
        # each row's masked positions in its current block, and their uniforms
        where, uniforms = {}, {}
        for j, i in enumerate(live):
            plan = plans[i]
            assert plan is not None
            self._store(plan, new[j])
            lo = max(plan.end - plan.length, batch.prompt_lens[i])
            where[i] = (rows[i][lo : plan.end] == self.mask_id).nonzero().flatten() + lo
            uniforms[i] = self.noise_at(batch.keys[i], batch.steps[i], "token", len(rows[i]))
        # the head and the draw once per sampler setting, over every row that shares it
        drawn: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        for c in dict.fromkeys(configs[i] for i in live):
            group = [(j, i) for j, i in enumerate(live) if configs[i] == c]
            picks = torch.cat([(where[i] - plans[i].start) + j * hidden.shape[1] for j, i in group])
            states = hidden.reshape(-1, hidden.shape[-1])[picks.to(hidden.device)]
            u = torch.cat([uniforms[i][where[i]] for _, i in group]).to(hidden.device)
            x0, conf, entropy = draw_in_chunks(draw, self.head(states), u, c, self.mask_id)
            sizes = [len(where[i]) for _, i in group]
            parts = [t.cpu().split(sizes) for t in (x0, conf)]
            per_row = entropy.cpu().split(sizes) if entropy is not None else [None] * len(sizes)
            for (_, i), a, b, h in zip(group, *parts, per_row, strict=True):
                drawn[i] = (a, b, h)
        for i in live:
            plan, c, (tokens, confidence) = plans[i], configs[i], out[i]
            assert plan is not None
            prompt_len = batch.prompt_lens[i]
            x0, conf, entropy = drawn[i]
            per_step = self.quota(
                c.block_length,
                prompt_len,
                len(tokens),
                batch.total(i),
                batch.steps[i],
                plan.block,
                len(where[i]),
                batch.was_edited(i),
            )
            ties = self.noise_at(batch.keys[i], batch.steps[i], "tie", len(tokens))[where[i]]
            chosen = choose(conf, per_step, c, ties, entropy)
            tokens[where[i][chosen]] = x0[chosen]
            confidence[where[i][chosen]] = conf[chosen].float()
            if self.stops(c, tokens, prompt_len, plan) or self.stops_early(
                c, tokens, prompt_len, x0[chosen]
            ):
                rest = tokens[prompt_len:]
                rest[rest == self.mask_id] = self.eos_id if self.eos_id is not None else self.pad_id
        return out

    @staticmethod
    def noise_at(key: int, step: int, purpose: str, width: int) -> torch.Tensor:
        """A row's float64 uniforms for one purpose at one step, one per canvas position."""
        gen = purpose_generator(key, step, purpose)
        return torch.rand(width, generator=gen, dtype=torch.float64)

    def stops(self, c: BlockConfig, tokens: torch.Tensor, prompt_len: int, plan: Plan) -> bool:
        """The row's blocks are filled up to this one and it wrote an end token: the
        reference's stopping criterion."""
        written = tokens[prompt_len : plan.end]
        if not c.stop or bool((written == self.mask_id).any()):
            return False
        return any(bool((written == s).any()) for s in self.stop_ids)

    def stops_early(
        self, c: BlockConfig, tokens: torch.Tensor, prompt_len: int, committed: torch.Tensor
    ) -> bool:
        """With `eos_early_stop`: this step committed an end token, and every position before
        the first end token of the answer is written (LLaDA2's `eos_early_stop`)."""
        if not c.eos_early_stop or not bool(torch.isin(committed, self._ends).any()):
            return False
        answer = tokens[prompt_len:]
        first = int(torch.isin(answer, self._ends).nonzero()[0, 0])
        return not bool((answer[:first] == self.mask_id).any())

    def say_if_hurried(
        self, batch: StepBatch, rows: Iterable[int], message: Callable[[int, int], str]
    ) -> None:
        """Say once, as a `Notice`, `message(T, gen_length)` of the first of `rows` whose T is
        below its gen_length: its steps then commit more than the reference's would."""
        if self.__dict__.get("_said_hurried"):
            return
        for i in rows:
            gen = len(batch.tokens[i]) - batch.prompt_lens[i]
            if batch.total(i) < gen:
                self._said_hurried = True
                warnings.warn(Notice(message(batch.total(i), gen)), stacklevel=3)
                return

    def commit(self, ids, attn, offsets, batch):  # pragma: no cover - the step is its own
        raise NotImplementedError("BlockDiffusion steps through denoise_step_with_confidence")


def draw_in_chunks(sampler: Any, logits: torch.Tensor, u: torch.Tensor, *args: Any) -> Any:
    """`sampler(logits, u, *args)` over chunks of positions, its outputs (tensors [M], or
    None) joined: its float64 work over [positions, vocabulary] stays a chunk big (as Dream's
    `propose`), and every position's draw is the same as in one piece."""
    size = max(1, CHUNK_ELEMENTS // logits.shape[-1])
    parts = [
        sampler(logits[start : start + size], u[start : start + size], *args)
        for start in range(0, max(1, len(logits)), size)
    ]
    return tuple(
        None if part[0] is None else torch.cat(list(part)) for part in zip(*parts, strict=True)
    )


def draw(
    logits: torch.Tensor, u: torch.Tensor, c: BlockConfig, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A token [M] and its probability [M] (float64) per masked position: SDAR's
    `sample_with_temperature_topk_topp` with keyed uniforms (argmax at temperature 0); with
    `entropy_bound` also the model's entropy [M] at each position (`model_entropy`, else None).
    The mask token is never drawn: the reference can draw it, which leaves the position
    masked and overruns its schedule (an IndexError)."""
    logits = logits.double()
    logits[:, mask_id] = -torch.inf
    entropy = model_entropy(logits) if c.entropy_bound is not None else None
    if c.temperature > 0:
        logits = logits / c.temperature
    # top-k, then top-p of what top-k left: SDAR's order and LLaDA2's `generate`'s (Dream's
    # `filter_logits` applies top-p first)
    logits = filter_logits(filter_logits(logits, 1.0, c.top_k), c.top_p, None)
    probs = torch.softmax(logits, dim=-1)
    if c.temperature == 0:
        conf, x0 = probs.max(-1)
        return x0, conf, entropy
    x0 = categorical(probs, u[:, None])[:, 0]
    return x0, probs.gather(-1, x0[:, None])[:, 0], entropy


def choose(
    conf: torch.Tensor,
    k: int,
    c: BlockConfig,
    ties: torch.Tensor,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """[M] which masked positions of the block commit at this step: k per step (at most all)
    by `remasking`, and with `entropy_bound` also EB-Sampler's most confident run."""
    m = conf.numel()
    take = min(k, m)
    if c.remasking == "sequential":
        chosen = torch.arange(m) < take
    elif c.remasking == "low_confidence_dynamic" and int((conf > c.threshold).sum()) >= k:
        chosen = conf > c.threshold
    else:
        chosen = top_ranked(conf[None], torch.tensor([take]), ties[None])[0]
    if c.entropy_bound is not None and m:
        assert entropy is not None, "entropy_bound needs the positions' entropies"
        order = ranked_order(conf[None], ties[None])[0]
        chosen[order[: entropy_bound_count(entropy[order], c.entropy_bound)]] = True
    return chosen


def block_work(start: int, end: int, block: int, head: int) -> Work:
    """Tokens [start, end) (start on a block boundary) under the block-causal mask: a query
    attends every key up to its block's end (the canvas's end in a last, shorter block)."""
    attended = sum(
        (min((b + 1) * block, end) - b * block) * min((b + 1) * block, end)
        for b in range(start // block, -(-end // block))
    )
    return Work(end - start, attended, head)


@hookimpl
def dllmbench_register_backbones(register):
    register("block", BlockDiffusion)
