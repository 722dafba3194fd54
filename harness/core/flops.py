"""FLOPs: the one formula that turns what a forward computed into floating-point operations.

A forward of one row charges

    2·P·queries + 2·P_head·head + 4·layers·width·attended

where P is the model's matmul parameters applied at every query token (attention and MLP
projections, an adapter's low-rank matrices; of a mixture of experts the router and the
experts each token is routed to; no embedding lookup), P_head those of the output
head (an LM head, a scorer's readout), applied only at the `head` positions that read it,
`attended` the sum over query tokens of the keys each attends to (L² for a bidirectional
forward over L tokens, L(L+1)/2 causal, queries × (cache + queries) for a cached block), and
width the attention's query width (heads × head dim). The attention term counts QKᵀ and the
weighted sum of V, two multiply-adds per (query, key, channel). Padding is not work: a row's
`Work` holds its own tokens only.

`ModelShape` holds (P, P_head, layers, width), read from a model (`shape_of`) or written by
hand; `flops(shape, work)` is the formula, used by the ledger, the planner and
`benchmarks/bench_gpu.py` alike.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP formula needs of a model."""

    params: int  # matmul parameters applied at every query token (the output head apart)
    head: int  # matmul parameters of the output head, applied where it is read
    layers: int
    width: int  # attention query width: heads × head dim

    def __post_init__(self) -> None:
        if min(self.params, self.head, self.layers, self.width) < 0:
            raise ValueError(f"a model shape has no negative part: {self}")

    def plus(self, params: int = 0, head: int = 0) -> ModelShape:
        """This shape with more matmul parameters (an adapter) or another head (a readout)."""
        return ModelShape(self.params + params, head, self.layers, self.width)


@dataclass(frozen=True)
class Work:
    """What one forward of one row computed: its query tokens, the keys they attended
    (summed over queries) and the positions the output head was applied to."""

    queries: int
    attended: int
    head: int

    def __post_init__(self) -> None:
        for name in ("queries", "attended", "head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"Work.{name} is {value!r}: a count, an int >= 0")
            object.__setattr__(self, name, int(value))

    @classmethod
    def full(cls, length: int, head: int | None = None) -> Work:
        """A bidirectional forward over `length` tokens, the head at `head` positions
        (default: every position)."""
        return cls(length, length * length, length if head is None else head)

    @classmethod
    def causal(cls, length: int, head: int | None = None) -> Work:
        """A causal forward over `length` tokens: query i attends keys 0..i."""
        return cls(length, length * (length + 1) // 2, length if head is None else head)


def flops(shape: ModelShape, work: Work) -> int:
    """FLOPs of one forward of one row (the module docstring's formula)."""
    return (
        2 * shape.params * work.queries
        + 2 * shape.head * work.head
        + 4 * shape.layers * shape.width * work.attended
    )


def total_flops(shape: ModelShape, works: Iterable[Work]) -> int:
    return sum(flops(shape, w) for w in works)


def _linear_params(module: Any, skip: set[int], top_k: int | None = None) -> int:
    """Weights of every linear map in `module` (torch.nn.Linear, transformers' Conv1D) that a
    token passes through, not counting the modules whose id is in `skip` nor anything below
    them, nor injected LoRA adapters (children named `lora_*`, peft's convention): an adapter
    computes only while its scorer scores, and that scorer adds its own (`ModelShape.plus`).

    A mixture of experts (transformers' experts modules: `num_experts` experts stacked in
    3-D weights) counts the `top_k` experts each token is routed through, `top_k` of
    `num_experts` of their weights; its router (a 2-D `weight` of `num_experts` rows on a
    module that is not a Linear) counts whole, as every token is scored for every expert."""
    import torch

    total = 0
    stack = [module]
    while stack:
        m = stack.pop()
        if id(m) in skip:
            continue
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D":
            total += int(m.weight.numel())
            continue
        experts = getattr(m, "num_experts", None)
        own = dict(m.named_parameters(recurse=False))
        stacked = [p for p in own.values() if p.dim() == 3 and p.shape[0] == experts]
        if isinstance(experts, int) and stacked:
            if top_k is None:
                raise ValueError(f"{type(m).__name__} routes to experts: its config names no top_k")
            total += sum(int(p.numel()) for p in stacked) // experts * top_k
            continue
        weight = own.get("weight")
        if isinstance(experts, int) and weight is not None and weight.dim() == 2:
            total += int(weight.numel())  # a router
        stack.extend(c for name, c in m.named_children() if not name.startswith("lora_"))
    return total


def shape_of(model: Any, head: Any = None, extra: Iterable[Any] = ()) -> ModelShape:
    """The shape of a transformers model: every linear weight under `model` a token passes
    through except the head's (and any injected adapter's) is P (of a mixture of experts, the
    router and the `num_experts_per_tok` experts a token is routed to), `head` (default:
    `model.lm_head` when it has one) is P_head, and `extra` modules (a scorer's readout)
    join the head. Layers and width come from the config (`num_hidden_layers`, heads ×
    `head_dim`, else `hidden_size`). Works on a model on the meta device: no weights
    needed."""
    if head is None:
        head = getattr(model, "lm_head", None)
    heads = [h for h in (head, *extra) if h is not None]
    skip = {id(h) for h in heads}
    config = model.config
    hidden = int(config.hidden_size)
    n_heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    width = int(n_heads) * int(head_dim) if n_heads and head_dim else hidden
    return ModelShape(
        params=_linear_params(model, skip, getattr(config, "num_experts_per_tok", None)),
        head=sum(_linear_params(h, set()) for h in heads),
        layers=int(config.num_hidden_layers),
        width=width,
    )


def format_flops(value: float | None) -> str:
    """A FLOP count for a person: 3.1e12 → "3.10 TFLOP"."""
    if value is None:
        return "–"
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}FLOP"
    return f"{value:.3g} FLOP"


class Flops(int):
    """A budget in FLOPs per problem (`--budget 2.1e15flops`), told apart from a budget in
    passes (a plain int) by its type."""

    def __repr__(self) -> str:
        return f"Flops({int(self)})"

    def typed(self) -> str:
        """As `--budget` takes it, exactly: `2.1e15flops`, `1e9flops`, `123flops`."""
        digits = str(int(self))
        kept = digits.rstrip("0") or "0"
        exponent = len(digits) - 1
        if exponent < 3:
            return f"{digits}flops"
        mantissa = kept[0] + (f".{kept[1:]}" if len(kept) > 1 else "")
        return f"{mantissa}e{exponent}flops"


UNITS = ("passes", "flops")


def unit_of(budgets: Iterable[int]) -> str:
    """ "flops" when the budgets are `Flops`, else "passes"; a mix is a ValueError."""
    kinds = {isinstance(b, Flops) for b in budgets}
    if len(kinds) > 1:
        raise ValueError("budgets mix passes and FLOPs; give every budget in one unit")
    return "flops" if kinds == {True} else "passes"
