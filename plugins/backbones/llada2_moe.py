"""LLaDA2.0's architecture (LLaDA2.0-mini, -flash: `model_type` "llada2_moe") on transformers'
own `Glm4MoeForCausalLM`, without remote code.

LLaDA2.0 is a block-diffusion mixture of experts (Ling 2.0's stack): grouped-query attention
with one fused query-key-value projection, per-head RMSNorm of queries and keys, rotary
embedding on the first `partial_rotary_factor` of each head (rotate-half), then in each layer
from `first_k_dense_replace` on a sparse MLP: a sigmoid router whose scores plus a learned
`expert_bias` pick `topk_group` of `n_group` expert groups (each group scored by its two
best) and the top `num_experts_per_tok` experts in them; the chosen experts' outputs are
weighted by their scores without the bias, normalised to sum to one, scaled by
`routed_scaling_factor`, summed in float32, and added to the shared experts' output.

transformers' Glm4Moe is that computation to the operation: the same router in float32, the
same group-limited choice, the same partial rotary and per-head norms. What differs is naming
and layout, which `llada2_state` converts one to one: the fused projection is cut into
`q_proj`, `k_proj`, `v_proj` by rows (queries, then keys, then values), and each expert's
`gate_proj`, `up_proj`, `down_proj` are stacked into the experts' [E, 2I, H] and [E, H, I]
tensors (experts.py). The experts run as `grouped_mm`, which weights and sums the chosen
experts' outputs in float32 and rounds once, as LLaDA2's own `moe_infer` does (transformers'
eager loop would round each expert's share to bfloat16 before adding it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from dllmbench.core.errors import UserError
from dllmbench.plugins.backbones.experts import stack_experts

MODEL_TYPE = "llada2_moe"
EXPERTS_IMPLEMENTATION = "grouped_mm"  # float32 sum of the chosen experts, as LLaDA2's own

# LLaDA2 name → Glm4Moe name within a layer (after "model.layers.N."), one to one; the fused
# projection is QKV's, the experts experts.py's
LAYER_RENAMES = {
    "attention.dense.": "self_attn.o_proj.",
    "attention.query_layernorm.": "self_attn.q_norm.",
    "attention.key_layernorm.": "self_attn.k_norm.",
    "mlp.gate.expert_bias": "mlp.gate.e_score_correction_bias",
}
KEPT = re.compile(
    r"^(model\.embed_tokens|model\.norm|lm_head)\.weight$"
    r"|^model\.layers\.\d+\.(input_layernorm|post_attention_layernorm"
    r"|mlp\.gate|mlp\.shared_experts\.(gate|up|down)_proj|mlp\.(gate|up|down)_proj)\.weight$"
)
LAYER = re.compile(r"^(model\.layers\.\d+\.)(.*)$")
QKV = re.compile(r"^model\.layers\.(\d+)\.attention\.query_key_value\.(weight|bias)$")
# the config.json sizes of the experts, with LLaDA2's defaults (None: required), each >= 1
# (POSITIVE) or >= 0 (no shared experts, no dense layers first)
MOE_SIZES: dict[str, int | None] = {
    "num_experts": None,
    "moe_intermediate_size": None,
    "num_experts_per_tok": 2,
    "n_group": 8,
    "topk_group": 4,
    "num_shared_experts": 0,
    "first_k_dense_replace": 0,
}
POSITIVE = ("num_experts", "moe_intermediate_size", "num_experts_per_tok", "n_group", "topk_group")


def renamed(key: str) -> str | None:
    """A LLaDA2 key's Glm4Moe name (not the fused projection's nor an expert's), or None."""
    key = key.replace("model.word_embeddings.", "model.embed_tokens.", 1)
    if (m := LAYER.match(key)) is not None:
        prefix, rest = m.groups()
        for old, new in LAYER_RENAMES.items():
            if rest.startswith(old):
                return prefix + new + rest[len(old) :]
    return key if KEPT.match(key) else None


def is_llada2(raw: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a block-diffusion checkpoint is LLaDA2's: its config says so, or its keys do."""
    return raw.get("model_type") == MODEL_TYPE or "model.word_embeddings.weight" in state


def llada2_config(raw: Mapping[str, Any]) -> Any:
    """LLaDA2's config.json as a Glm4MoeConfig (bidirectional under the sampler's block mask).
    What Glm4Moe cannot compute is refused: a bias on the attention's output projection
    (`use_bias`), a normalised head (`norm_head`), a router other than sigmoid, rotary
    scaling."""
    from transformers import Glm4MoeConfig

    where = "LLaDA2 config.json"
    if raw.get("use_bias"):
        raise UserError(f"{where}: use_bias=true (a biased output projection) is not supported")
    if raw.get("norm_head"):
        raise UserError(f"{where}: norm_head=true is not supported")
    if raw.get("score_function", "sigmoid") != "sigmoid":
        raise UserError(f"{where}: score_function {raw['score_function']!r} is not sigmoid")
    if raw.get("rope_scaling"):
        raise UserError(f"{where}: rope_scaling {raw['rope_scaling']!r} is not supported")
    sizes = {key: raw.get(key, default) for key, default in MOE_SIZES.items()}
    if sizes["num_shared_experts"] is None:  # LLaDA2 builds no shared experts: none of width
        sizes["num_shared_experts"] = 0
    factor = raw.get("partial_rotary_factor", 0.5)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 <= factor <= 1:
        raise UserError(
            f"{where}: partial_rotary_factor is {factor!r}, not a number in [0, 1]; restore it"
        )
    for key, value in sizes.items():
        least = 1 if key in POSITIVE else 0
        if value is None:
            raise UserError(f"{where} lacks {key}; is it a LLaDA2 checkpoint's config.json?")
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UserError(f"{where}: {key} is {value!r}, not an integer >= {least}; restore it")
    experts, groups, top_k = sizes["num_experts"], sizes["n_group"], sizes["num_experts_per_tok"]
    chosen = sizes["topk_group"]
    if experts % groups or experts // groups < 2 or chosen > groups:
        raise UserError(
            f"{where}: {experts} experts in n_group={groups} groups, topk_group={chosen}, cannot "
            "be routed (each group needs at least two experts, and topk_group <= n_group)"
        )
    if top_k > chosen * (experts // groups):
        raise UserError(
            f"{where}: num_experts_per_tok={top_k} is more than the {chosen} chosen groups hold"
        )
    heads = raw["num_attention_heads"]
    config = Glm4MoeConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        hidden_act=raw.get("hidden_act", "silu"),
        max_position_embeddings=raw.get("max_position_embeddings", 16384),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": raw.get("rope_theta", 10000.0),
            "partial_rotary_factor": factor,
        },
        attention_bias=bool(raw.get("use_qkv_bias", False)),
        use_qk_norm=bool(raw.get("use_qk_norm", True)),
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_shared_experts=sizes["num_shared_experts"],
        moe_intermediate_size=sizes["moe_intermediate_size"],
        n_group=groups,
        topk_group=chosen,
        routed_scaling_factor=raw.get("routed_scaling_factor", 2.5),
        first_k_dense_replace=sizes["first_k_dense_replace"],
        norm_topk_prob=top_k > 1,  # LLaDA2 normalises the chosen scores when it picks several
    )
    return prepared(config)


def prepared(config: Any) -> Any:
    """A Glm4MoeConfig as the sampler runs it: SDPA under its own mask, experts as LLaDA2's."""
    config._attn_implementation = "sdpa"
    config._experts_implementation = EXPERTS_IMPLEMENTATION
    return config


def llada2_state(state: MutableMapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """LLaDA2's state dict in Glm4Moe's names and layout (the experts stacked and taken out of
    `state`, experts.py). A
    key no rule covers, or an expert missing from a layer or of another shape than expert
    0's, is an error naming it."""
    head_dim = config.head_dim
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    count = config.n_routed_experts
    rest, out = stack_experts(state, count, "LLaDA2 checkpoint")
    for key, value in rest.items():
        if (m := QKV.match(key)) is not None:
            if value.shape[0] != q + 2 * kv:
                raise UserError(
                    f"LLaDA2 checkpoint: {key} has {value.shape[0]} rows, the config makes "
                    f"{q + 2 * kv} (queries, keys and values); restore the config"
                )
            layer, kind = m.groups()
            for name, part in zip(
                ("q_proj", "k_proj", "v_proj"), value.split([q, kv, kv]), strict=True
            ):
                out[f"model.layers.{layer}.self_attn.{name}.{kind}"] = part
            continue
        if key.endswith(".attention.dense.bias"):
            raise UserError(
                f"LLaDA2 checkpoint has {key}: a biased output projection (use_bias) is not "
                "supported"
            )
        if (name := renamed(key)) is None:
            raise UserError(f"LLaDA2 checkpoint has an unexpected key {key!r}")
        out[name] = value
    hidden = config.hidden_size
    for layer in range(config.first_k_dense_replace, config.num_hidden_layers):
        p = f"model.layers.{layer}.mlp."
        if p + "gate.weight" not in out:
            continue  # load_strict names what is missing
        if p + "gate.e_score_correction_bias" not in out:
            out[p + "gate.e_score_correction_bias"] = torch.zeros(count)  # LLaDA2 starts at 0
        shared = p + "shared_experts."
        if config.n_shared_experts == 0 and not any(k.startswith(shared) for k in out):
            # no shared experts (num_shared_experts 0 or null): Glm4Moe's have no width
            out[shared + "gate_proj.weight"] = torch.zeros(0, hidden)
            out[shared + "up_proj.weight"] = torch.zeros(0, hidden)
            out[shared + "down_proj.weight"] = torch.zeros(hidden, 0)
    return out


def random_llada2(shape: Mapping[str, Any], seed: int, dtype: torch.dtype) -> torch.nn.Module:
    """A tiny random LLaDA2 of `shape` (block.py's `RANDOM_SHAPE` and a vocabulary): its first
    layer dense, its second of 8 experts in 4 groups, 2 chosen from 2 groups, one shared;
    partial rotary, per-head norms; its routing bias random too, so that choosing by biased
    scores and weighting by plain ones differ."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    config = Glm4MoeConfig(
        **shape,
        rope_parameters={"rope_type": "default", "rope_theta": 6e5, "partial_rotary_factor": 0.5},
        use_qk_norm=True,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        norm_topk_prob=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = Glm4MoeForCausalLM(prepared(config))
        for layer in net.model.layers[config.first_k_dense_replace :]:
            # a trained router is far from uniform: spread its scores and bias
            layer.mlp.gate.weight.data.normal_(0.0, 0.5)
            layer.mlp.gate.e_score_correction_bias.data.normal_(0.0, 0.3)
    return net.to(dtype).eval().requires_grad_(False)
