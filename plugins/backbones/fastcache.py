"""Fast-dLLM's approximate KV caches for Dream and LLaDA (`cache=prefix` or `cache=dual`).

Fast-dLLM (NVlabs/Fast-dLLM, arXiv 2505.22618) decodes semi-autoregressively and refreshes a
key/value cache once per block. At a block's first step the row runs one full forward over its
canvas, exactly as without a cache; the keys and values it computed are kept. At the block's
later steps:

- `prefix`: the row feeds only its positions from the block's start to the canvas's end (the
  block and the masked suffix), as queries against the kept keys and values of the positions
  before the block;
- `dual`: the row feeds only the block, against the kept keys and values of the positions
  before it and after it.

The kept keys and values are those of the canvas at the block's start; the tokens the block
commits afterwards never reach them. That staleness is the approximation. Dream reads the
logit of position i from the hidden state at i − 1, which for the block's first position lies
in the prefix: it is taken from the refresh's forward too (kept beside the keys and values).

At a block's start a row's canvas from the block on is all masks, so the refresh is fixed by
the tokens before the block and the canvas width: an entry is named by those (`Name`), and any
row with that prefix at a later step of the block finds it, forked children included. A missing
entry (freed with its problem, superseded, evicted, or a row whose prefix was edited) is
recomputed from "prefix + all masks", so a row's tokens never depend on what the store held.
Entries belong to their prompt and are freed when the engine releases it (`KeepsState`); a row
that refreshes a block drops the entry of the block before it, and a byte budget (the engine's
`limit_cache`) evicts the least recently used.

A row is charged what its step computes alone with its entry present (`step_work`): at a
block's first step a full forward over the canvas; at a later step, queries from the block's
start to the canvas's end (`prefix`) or to the block's end (`dual`), each attending every
position of the canvas; the LM head at the eligible positions. When a masked position before
the block may still commit (a re-masked one, or one whose drawn token was the mask token), the
queries start there instead, so every position the sampler reads is computed.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from dllmbench.api.interfaces import StepBatch
from dllmbench.core.flops import Work
from dllmbench.plugins.backbones.base import BlockStep, block_step

if TYPE_CHECKING:
    from dllmbench.plugins.backbones.base import DiffusionBackbone

Cache = Literal["none", "prefix", "dual"]
CACHES: tuple[str, ...] = get_args(Cache)

Name = tuple[bytes, int]  # (digest of the tokens before the block, canvas width)


def check_cache(
    cache: str, block_length: int | None, attention: str, cfg_scale: float = 0.0
) -> None:
    """Refuse a cache setting that cannot be, in one line (a Config's `__post_init__`)."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if cache == "none":
        return
    if block_length is None:
        raise ValueError(
            f"cache={cache} needs block_length: Fast-dLLM's cache is refreshed once per block"
        )
    if attention != "sdpa":
        raise ValueError(f"cache={cache} runs padded rows; use attention=sdpa")
    if cfg_scale > 0:
        raise ValueError(f"cache={cache} has no classifier-free guidance; use cfg_scale=0")


def digest(tokens: torch.Tensor) -> bytes:
    data = tokens.to(torch.int64).cpu().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True)
class Span:
    """Where one row stands under the cache at one step (canvas coordinates)."""

    refresh: bool  # the block's first step: a full forward over the canvas
    lo: int  # the block's first position
    end: int  # the block's end: positions from here on do not commit
    start: int  # a later step's first query: lo, or an earlier position that may commit
    stop: int  # a later step's queries end: the canvas's end (prefix) or the block's (dual)
    width: int  # the canvas
    head: int  # positions that may commit: the LM head runs there

    def work(self) -> Work:
        """What the row's forward computes: the module docstring's charge."""
        if self.refresh:
            return Work.full(self.width, self.head)
        queries = self.stop - self.start
        return Work(queries, queries * self.width, self.head)


def locate(
    tokens: torch.Tensor, prompt_len: int, at: BlockStep, block: int, mask_id: int, dual: bool
) -> Span:
    """Row `tokens`' span at the step whose block schedule stands at `at`."""
    width = len(tokens)
    lo = prompt_len + max(0, at.end - 1) // block * block
    end = prompt_len + at.end
    eligible = (tokens[:end] == mask_id).nonzero().flatten()
    start = min(lo, int(eligible[0])) if len(eligible) else lo
    return Span(at.j == 0, lo, end, start, end if dual else width, width, len(eligible))


@dataclass
class Entry:
    """What a refresh keeps: keys and values [layers, 2, kv heads, tokens, head dim] of the
    positions before the block (prefix) or of the whole canvas (dual), and for a shifted model
    the last hidden states [lo, hidden] of the positions before the block."""

    kv: torch.Tensor
    hidden: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        extra = 0 if self.hidden is None else self.hidden.numel() * self.hidden.element_size()
        return self.kv.numel() * self.kv.element_size() + extra


class RefreshStore:
    """Refresh entries by (prompt, name), least recently used first, freed per prompt."""

    def __init__(self, budget_bytes: int | None = None):
        self.budget = budget_bytes
        self._entries: OrderedDict[tuple[bytes, Name], Entry] = OrderedDict()
        self._holds: dict[bytes, int] = {}
        self.nbytes = 0
        self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def hold(self, prompt_ids: Sequence[int]) -> None:
        key = digest(torch.as_tensor(list(prompt_ids), dtype=torch.long))
        self._holds[key] = self._holds.get(key, 0) + 1

    def release(self, prompt_ids: Sequence[int]) -> None:
        key = digest(torch.as_tensor(list(prompt_ids), dtype=torch.long))
        left = self._holds.get(key, 0) - 1
        if left > 0:
            self._holds[key] = left
            return
        self._holds.pop(key, None)
        for item in [k for k in self._entries if k[0] == key]:
            self._drop(item)

    def get(self, root: bytes, name: Name) -> Entry | None:
        entry = self._entries.get((root, name))
        if entry is not None:
            self._entries.move_to_end((root, name))
        return entry

    def put(self, root: bytes, name: Name, entry: Entry) -> None:
        if (root, name) in self._entries:
            return
        self._entries[(root, name)] = entry
        self.nbytes += entry.nbytes
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        while self.budget is not None and self.nbytes > self.budget and len(self._entries) > 1:
            self._drop(next(iter(self._entries)))  # a miss only recomputes

    def drop(self, root: bytes, name: Name) -> None:
        if (root, name) in self._entries:
            self._drop((root, name))

    def _drop(self, item: tuple[bytes, Name]) -> None:
        self.nbytes -= self._entries.pop(item).nbytes


class FastCache:
    """The cache of one backbone: its `step_hidden` and `step_work` under `cache=prefix|dual`."""

    def __init__(self, backbone: DiffusionBackbone):
        self.bb = backbone
        self.dual = backbone.config.cache == "dual"
        self.store = RefreshStore()
        # what the forwards computed (tests, benchmarks): model calls, query tokens, and the
        # refreshes a later step had to recompute because its entry was missing
        self.forwards = 0
        self.computed_queries = 0
        self.recomputed = 0
        params = inspect.signature(backbone.transformer.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    # -- where rows stand and what they are charged ---------------------------------------------
    def spans(self, batch: StepBatch) -> list[Span]:
        bb, out = self.bb, []
        for i, tokens in enumerate(batch.tokens):
            plen = batch.prompt_lens[i]
            block = bb.row_config(batch.setting(i)).block_length
            at = block_step(len(tokens) - plen, block, batch.total(i), batch.steps[i])
            out.append(locate(tokens.cpu(), plen, at, block, bb.mask_id, self.dual))
        return out

    def step_work(self, batch: StepBatch) -> list[Work]:
        return [s.work() for s in self.spans(batch)]

    def row_works(self, canvas: torch.Tensor, prompt_len: int, total_steps: int) -> list[Work]:
        """Each step of an unedited row that commits its sampler's quota and no more, from the
        fully masked canvas (`PricesSteps`)."""
        bb = self.bb
        block = bb.config.block_length
        gen = len(canvas) - prompt_len
        committed = 0  # generated positions committed so far, left to right
        works = []
        for step in range(total_steps):
            at = block_step(gen, block, total_steps, step)
            lo = prompt_len + max(0, at.end - 1) // block * block
            start = prompt_len + committed
            eligible = at.end - committed
            span = Span(
                at.j == 0,
                lo,
                prompt_len + at.end,
                min(lo, start),
                prompt_len + at.end if self.dual else len(canvas),
                len(canvas),
                eligible,
            )
            works.append(span.work())
            committed += min(eligible, bb.planned_quota(eligible, at, gen, total_steps))
        return works

    def cache_bytes(self, tokens: int) -> int:
        """Memory of the kept keys and values (and Dream's hidden states) of `tokens` tokens."""
        config = self.bb.transformer.config
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        per = 2 * int(config.num_hidden_layers) * heads * int(head_dim)
        if self.bb.shift:
            per += int(config.hidden_size)
        return per * tokens * self.bb.dtype.itemsize

    def limit_cache(self, nbytes: int) -> None:
        self.store.budget = int(nbytes)

    # -- the forwards ---------------------------------------------------------------------------
    @torch.no_grad()
    def hidden(
        self, ids: torch.Tensor, attn: torch.Tensor, offsets: list[int], batch: StepBatch
    ) -> torch.Tensor:
        """Hidden states [B, L, H] of the padded batch as the sampler reads them (shifted for
        Dream), computed under the cache: exact at a block's first step, from the kept keys and
        values at its later steps. Positions no step reads hold zeros."""
        bb = self.bb
        rows = [t.cpu() for t in batch.tokens]
        spans = self.spans(batch)
        roots = [digest(r[:p]) for r, p in zip(rows, batch.prompt_lens, strict=True)]
        names: list[Name] = [(digest(r[: s.lo]), s.width) for r, s in zip(rows, spans, strict=True)]
        entries: dict[int, Entry] = {}
        missing = []
        for i, s in enumerate(spans):
            if not s.refresh:
                entry = self.store.get(roots[i], names[i])
                if entry is None:
                    missing.append(i)
                else:
                    entries[i] = entry
        hidden_size = int(bb.transformer.config.hidden_size)
        out = torch.zeros((*ids.shape, hidden_size), dtype=bb.dtype, device=bb.device)

        # full forwards: the rows at a block's first step, and the refreshes missing entries
        # need (one per name: rows of one prefix share it)
        fresh = [i for i, s in enumerate(spans) if s.refresh]
        canvases = [rows[i] for i in fresh]
        first = {}
        for i in missing:
            first.setdefault((roots[i], names[i]), i)
        recompute = list(first.values())
        for i in recompute:
            canvas = rows[i].clone()
            canvas[spans[i].lo :] = bb.mask_id
            canvases.append(canvas)
        kept: dict[int, Entry] = {}
        if canvases:
            raw, kv = self.full(canvases)
            for n, i in enumerate(fresh):
                out[i, offsets[i] :] = self.shifted(raw[n], None, 0)
            for n, i in enumerate(fresh + recompute):
                lo = spans[i].lo
                if i in fresh and not bool((rows[i][lo:] == bb.mask_id).all()):
                    continue  # not the refresh canvas: nothing to keep under its name
                hidden = raw[n][:lo].clone() if bb.shift else None
                kept[i] = Entry(kv(n, None if self.dual else lo), hidden)
            self.recomputed += len(recompute)
            entries.update({i: kept[first[roots[i], names[i]]] for i in missing})

        # the later steps: each row's queries against its kept keys and values
        later = [i for i, s in enumerate(spans) if not s.refresh]
        if later:
            raw_w = self.window([rows[i] for i in later], [spans[i] for i in later], entries, later)
            for n, i in enumerate(later):
                s, entry = spans[i], entries[i]
                at = offsets[i] + s.start
                out[i, at : at + s.stop - s.start] = self.shifted(
                    raw_w[n, : s.stop - s.start], entry.hidden, s.start
                )

        for i, entry in kept.items():
            self.store.put(roots[i], names[i], entry)
            if spans[i].refresh:  # the row has left the block before: its entry is spent
                block = bb.row_config(batch.setting(i)).block_length
                before = spans[i].lo - block
                if before >= batch.prompt_lens[i]:
                    self.store.drop(roots[i], (digest(rows[i][:before]), spans[i].width))
        return out

    def shifted(self, raw: torch.Tensor, before: torch.Tensor | None, start: int) -> torch.Tensor:
        """Hidden states of positions start, start + 1, … as the sampler reads them: `raw`
        itself, or for a shifted model (Dream) the state one position earlier, the first from
        `before` (the refresh's states of the positions before the block) when start > 0."""
        if not self.bb.shift:
            return raw
        first = raw[:1] if start == 0 or before is None else before[start - 1 : start]
        return torch.cat([first, raw[:-1]])

    def full(
        self, canvases: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], Callable[[int, int | None], torch.Tensor]]:
        """One bidirectional forward over the canvases, left-padded as `DiffusionBackbone.hidden`
        runs them: each canvas's last hidden states [L, H] (unshifted), and `kv(n, upto)`, a
        copy of canvas n's keys and values [layers, 2, kv heads, upto, head dim] (upto None:
        the whole canvas)."""
        from transformers import DynamicCache

        bb = self.bb
        ids, attn, offsets = bb.pad(canvases)
        ids, attn = ids.to(bb.device), attn.to(bb.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = bb.transformer.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
        ).last_hidden_state
        self.forwards += 1
        self.computed_queries += sum(len(c) for c in canvases)
        pairs = self._layers(cache)  # each layer's keys and values [B, kv heads, L, d]

        def kv(n: int, upto: int | None) -> torch.Tensor:
            lo = offsets[n]
            hi = ids.shape[1] if upto is None else lo + upto
            return torch.stack([torch.stack([k[n, :, lo:hi], v[n, :, lo:hi]]) for k, v in pairs])

        return [out[n, off:] for n, off in enumerate(offsets)], kv

    def window(
        self,
        rows: list[torch.Tensor],
        spans: list[Span],
        entries: dict[int, Entry],
        index: list[int],
    ) -> torch.Tensor:
        """One forward of each row's queries [start, stop) against its entry's keys and values
        of the other positions: the last hidden states [n, Q, H] (unshifted), row n's query q at
        position start + q."""
        from transformers import DynamicCache

        bb = self.bb
        n = len(rows)
        kept = []
        for i, s in zip(index, spans, strict=True):
            kv = entries[i].kv
            if self.dual:
                kept.append(torch.cat([kv[..., : s.start, :], kv[..., s.stop :, :]], dim=3))
            else:
                kept.append(kv[..., : s.start, :])
        widths = [s.stop - s.start for s in spans]
        q, k = max(widths), max(t.shape[3] for t in kept)
        ids = torch.full((n, q), bb.pad_id, dtype=torch.long)
        positions = torch.zeros((n, q), dtype=torch.long)
        allowed = torch.zeros((n, k + q), dtype=torch.bool)
        for m, (tokens, s) in enumerate(zip(rows, spans, strict=True)):
            ids[m, : widths[m]] = tokens[s.start : s.stop]
            positions[m] = torch.arange(s.start, s.start + q)
            allowed[m, : kept[m].shape[3]] = True
            allowed[m, k : k + widths[m]] = True
        # every query of a row sees the row's kept positions and its own queries, no padding
        mask = torch.zeros((n, 1, q, k + q), dtype=bb.dtype)
        mask.masked_fill_(~allowed[:, None, None, :], torch.finfo(bb.dtype).min)
        cache = DynamicCache()
        if k:
            layers = kept[0].shape[0]
            shape = (n, *kept[0].shape[:3], k, kept[0].shape[4])
            kv = torch.zeros(shape, dtype=kept[0].dtype, device=kept[0].device)
            for m, t in enumerate(kept):
                kv[m, :, :, :, : t.shape[3]] = t
            for layer in range(layers):
                cache.update(kv[:, layer, 0], kv[:, layer, 1], layer)
        out = bb.transformer.model(
            input_ids=ids.to(bb.device),
            attention_mask=mask.to(bb.device),
            position_ids=positions.to(bb.device),
            use_cache=True,
            **{self._cache_arg: cache},
        ).last_hidden_state
        self.forwards += 1
        self.computed_queries += sum(widths)
        return out

    @staticmethod
    def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A DynamicCache's keys and values per layer, each [B, kv heads, L, d]."""
        layers = cache.layers if hasattr(cache, "layers") else None
        if layers is not None:
            return [(lay.keys, lay.values) for lay in layers]
        # transformers before the layered cache
        return [(cache.key_cache[i], cache.value_cache[i]) for i in range(len(cache))]
