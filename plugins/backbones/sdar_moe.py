"""SDAR's mixture of experts (JetLM's SDAR-30B-A3B-Chat and -Sci: `model_type` "sdar_moe") on
transformers' own `Qwen3MoeForCausalLM`, without remote code.

SDAR-MoE is Qwen3-MoE trained for block diffusion, as SDAR's dense models are Qwen3: the same
attention (grouped-query, per-head RMSNorm of queries and keys, rotary embedding on the whole
head), and in each sparse layer a router whose float32 softmax over `num_experts` picks the
`num_experts_per_tok` most probable experts, their probabilities renormalised to sum to one
when `norm_topk_prob`; each chosen expert's output is weighted and added to the layer's output
in the model's dtype, expert by expert. A layer listed in `mlp_only_layers`, or off the
`decoder_sparse_step` grid, keeps a dense MLP. The names are Qwen3-MoE's; only the layout
differs: each expert's `gate_proj`, `up_proj` and `down_proj` are stacked into transformers'
experts tensors (experts.py).

The experts run as transformers' `eager` loop, which is SDAR-MoE's own: each chosen expert's
weighted output is rounded to the model's dtype and added in expert order, as its modeling
code does (a fused or grouped kernel that sums in float32 rounds differently). The sampler is
`block`'s: SDAR's own, with the exact KV cache.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from dllmbench.core.errors import UserError
from dllmbench.plugins.backbones.experts import has_experts, stack_experts

MODEL_TYPE = "sdar_moe"
EXPERTS_IMPLEMENTATION = "eager"  # SDAR-MoE's own: the experts' shares added in the dtype

# the config.json fields a Qwen3-MoE model is built from, beside Qwen3's
MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)
POSITIVE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step")


def is_sdar_moe(raw: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a block-diffusion checkpoint (not LLaDA2's) is SDAR-MoE's: its config says so,
    or it holds experts."""
    return raw.get("model_type") == MODEL_TYPE or has_experts(state)


def sdar_moe_config(raw: Mapping[str, Any], fields: tuple[str, ...]) -> Any:
    """SDAR-MoE's config.json as a Qwen3MoeConfig: Qwen3's `fields`, and the experts' (a key
    left out takes Qwen3-MoE's default, as SDAR-MoE's own config class does). Sizes that
    cannot route are refused, one line naming them."""
    from transformers import Qwen3MoeConfig

    where = "SDAR-MoE config.json"
    for key in (k for k in POSITIVE if raw.get(k) is not None):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: {key} is {value!r}, not an integer >= 1; restore it")
    defaults = Qwen3MoeConfig()
    experts = raw.get("num_experts") or defaults.num_experts
    top_k = raw.get("num_experts_per_tok") or defaults.num_experts_per_tok
    if top_k > experts:
        raise UserError(
            f"{where}: num_experts_per_tok={top_k} is more than num_experts={experts}; restore it"
        )
    layers = raw.get("mlp_only_layers", [])
    if not isinstance(layers, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in layers
    ):
        raise UserError(f"{where}: mlp_only_layers is {layers!r}, not a list of layer numbers")
    if not isinstance(raw.get("norm_topk_prob", False), bool):
        raise UserError(f"{where}: norm_topk_prob is {raw['norm_topk_prob']!r}, not true or false")
    values = {k: raw[k] for k in (*fields, *MOE_FIELDS) if raw.get(k) is not None}
    return prepared(Qwen3MoeConfig(**values, use_sliding_window=False))


def prepared(config: Any) -> Any:
    """A Qwen3MoeConfig as the sampler runs it: SDPA under its own mask, the experts as
    SDAR-MoE's own code runs them."""
    config._attn_implementation = "sdpa"
    config._experts_implementation = EXPERTS_IMPLEMENTATION
    return config


def sdar_moe_state(
    state: MutableMapping[str, torch.Tensor], config: Any
) -> dict[str, torch.Tensor]:
    """SDAR-MoE's state dict in transformers' layout: the experts stacked (and taken out of
    `state`), every other key as it is (a key Qwen3-MoE does not have is `load_strict`'s to
    name)."""
    rest, stacked = stack_experts(state, config.num_experts, "SDAR-MoE checkpoint")
    return {**rest, **stacked}


def random_sdar_moe(shape: Mapping[str, Any], seed: int, dtype: torch.dtype) -> torch.nn.Module:
    """A tiny random SDAR-MoE of `shape` (block.py's `RANDOM_SHAPE` and a vocabulary): every
    layer sparse, 8 experts, 2 routed and renormalised; its router spread, so that tokens
    choose different experts."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **shape,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        use_sliding_window=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = Qwen3MoeForCausalLM(prepared(config))
        for layer in net.model.layers:
            layer.mlp.gate.weight.data.normal_(0.0, 0.5)  # a trained router is far from uniform
    return net.to(dtype).eval().requires_grad_(False)
