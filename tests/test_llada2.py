"""LLaDA2.0 (`llada2`): its checkpoints load into transformers' Glm4Moe and compute LLaDA2's
forward, float32 and bfloat16; the sampler is LLaDA2's `generate` token for token; a token is
charged the experts it is routed through."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from test_block import SHARPER, run_rows, stepped

from dllmbench.core.errors import Notice, UserError
from dllmbench.core.flops import Work, flops, shape_of
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.block import RANDOM_SHAPE, BlockDiffusion, draw
from dllmbench.plugins.backbones.llada2 import LLaDA2
from dllmbench.plugins.backbones.llada2_moe import llada2_config, random_llada2
from dllmbench.plugins.backbones.loading import char_tokenizer

# -- a LLaDA2 checkpoint as the Hub holds it (LLaDA2MoeModelLM's names), and its forward --------

SHAPE = {
    "model_type": "llada2_moe",
    "architectures": ["LLaDA2MoeModelLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,  # heads × head_dim is not the hidden size
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_bias": False,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 3,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 16,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "score_function": "sigmoid",
    "tie_word_embeddings": False,
}


def llada2_weights(raw: dict, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in LLaDA2's own names and layout (fused query-key-value projection, one
    module per expert)."""
    g = torch.Generator().manual_seed(seed)
    h, d = raw["hidden_size"], raw["head_dim"]
    heads, kv = raw["num_attention_heads"], raw["num_key_value_heads"]

    def w(*shape, std=0.08):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1 + w(n, std=0.2)

    state = {"model.word_embeddings.weight": w(vocab, h, std=1.0)}
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm(h)
        state[p + "post_attention_layernorm.weight"] = norm(h)
        state[p + "attention.query_key_value.weight"] = w((heads + 2 * kv) * d, h)
        if raw["use_qkv_bias"]:
            state[p + "attention.query_key_value.bias"] = w((heads + 2 * kv) * d)
        state[p + "attention.query_layernorm.weight"] = norm(d)
        state[p + "attention.key_layernorm.weight"] = norm(d)
        state[p + "attention.dense.weight"] = w(h, heads * d)
        if i < raw["first_k_dense_replace"]:
            inter = raw["intermediate_size"]
            state[p + "mlp.gate_proj.weight"] = w(inter, h)
            state[p + "mlp.up_proj.weight"] = w(inter, h)
            state[p + "mlp.down_proj.weight"] = w(h, inter)
            continue
        inter, shared = raw["moe_intermediate_size"], raw["num_shared_experts"]
        state[p + "mlp.gate.weight"] = w(raw["num_experts"], h, std=0.5)
        state[p + "mlp.gate.expert_bias"] = w(raw["num_experts"], std=0.3)
        for e in range(raw["num_experts"]):
            q = f"{p}mlp.experts.{e}."
            state[q + "gate_proj.weight"] = w(inter, h)
            state[q + "up_proj.weight"] = w(inter, h)
            state[q + "down_proj.weight"] = w(h, inter)
        for name, shape in (("gate_proj", (inter * shared, h)), ("up_proj", (inter * shared, h))):
            state[f"{p}mlp.shared_experts.{name}.weight"] = w(*shape)
        state[f"{p}mlp.shared_experts.down_proj.weight"] = w(h, inter * shared)
    state["model.norm.weight"] = norm(h)
    state["lm_head.weight"] = w(vocab, h)
    return state


def save_checkpoint(path, raw: dict, state: dict[str, torch.Tensor]) -> None:
    """A checkpoint folder as the Hub holds it: config.json, the weights, the tokenizer."""
    tok = char_tokenizer()
    (path / "config.json").write_text(json.dumps({**raw, "vocab_size": len(tok)}))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    tok.save_pretrained(str(path))


def rms(x, weight, eps):
    """LLaDA2MoeRMSNorm (and Qwen3-MoE's): in float32, back to the input's dtype, then the
    weight."""
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def llada2_forward(state, raw, ids, allowed, dtype):
    """LLaDA2MoeModelLM's forward, written out from its definition: logits [B, L, V] (float32)
    of `ids` [B, L] at positions 0..L-1, query i seeing key j where `allowed[i, j]`."""
    s = {k: v.to(dtype) for k, v in state.items()}
    eps, d = raw["rms_norm_eps"], raw["head_dim"]
    heads, kv = raw["num_attention_heads"], raw["num_key_value_heads"]
    b, n = ids.shape
    rot = int(d * raw["partial_rotary_factor"])
    inv = 1.0 / raw["rope_theta"] ** (torch.arange(0, rot, 2).float() / rot)
    angles = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))

    def rope(t):  # rotate-half on the first `rot` channels of each head
        a, rest = t[..., :rot], t[..., rot:]
        half = torch.cat([-a[..., rot // 2 :], a[..., : rot // 2]], -1)
        return torch.cat([a * cos + half * sin, rest], -1)

    def mlp(x, p):
        return F.linear(
            F.silu(F.linear(x, s[p + "gate_proj.weight"])) * F.linear(x, s[p + "up_proj.weight"]),
            s[p + "down_proj.weight"],
        )

    additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, -math.inf)
    x = s["model.word_embeddings.weight"][ids]
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms(x, s[p + "input_layernorm.weight"], eps)
        fused = p + "attention.query_key_value."
        qkv = F.linear(y, s[fused + "weight"], s.get(fused + "bias"))
        qkv = qkv.view(b, n, heads + 2 * kv, d).transpose(1, 2)
        q, k, v = qkv.split([heads, kv, kv], dim=1)
        q = rope(rms(q, s[p + "attention.query_layernorm.weight"], eps))
        k = rope(rms(k, s[p + "attention.key_layernorm.weight"], eps))
        k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=d**-0.5)
        x = x + F.linear(att.transpose(1, 2).reshape(b, n, -1), s[p + "attention.dense.weight"])
        y = rms(x, s[p + "post_attention_layernorm.weight"], eps)
        if i < raw["first_k_dense_replace"]:
            x = x + mlp(y, p + "mlp.")
            continue
        # the router: sigmoid scores in float32; groups ranked by their two best biased scores
        flat = y.reshape(b * n, -1)
        scores = torch.sigmoid(flat.float() @ s[p + "mlp.gate.weight"].float().T)
        biased = scores + s[p + "mlp.gate.expert_bias"]
        groups = biased.view(b * n, raw["n_group"], -1)
        best = groups.topk(2, dim=-1).values.sum(-1).topk(raw["topk_group"], dim=-1).indices
        keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter(1, best, True)
        biased = biased.masked_fill(~keep.repeat_interleave(groups.shape[-1], 1), -math.inf)
        chosen = biased.topk(raw["num_experts_per_tok"], dim=-1).indices
        weight = scores.gather(1, chosen)
        if chosen.shape[1] > 1:  # normalised when it chooses several
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        weight = weight * raw["routed_scaling_factor"]
        out = torch.zeros(b * n, flat.shape[-1])  # the chosen experts weighted, in float32
        for t in range(b * n):
            for slot, e in enumerate(chosen[t].tolist()):
                part = mlp(flat[t : t + 1], f"{p}mlp.experts.{e}.")[0]
                out[t] += part.float() * weight[t, slot]
        out = out.to(dtype) + mlp(flat, p + "mlp.shared_experts.")
        x = x + out.view(b, n, -1)
    x = rms(x, s["model.norm.weight"], eps)
    return F.linear(x, s["lm_head.weight"]).float()


def block_causal(n: int, block: int) -> torch.Tensor:
    blocks = torch.arange(n) // block
    return blocks[None, :] <= blocks[:, None]


@pytest.mark.parametrize(
    ("dtype", "tol", "change"),
    [
        ("float32", 2e-5, {}),
        ("float32", 2e-5, {"use_qkv_bias": True, "num_experts_per_tok": 1}),
        ("float32", 2e-5, {"first_k_dense_replace": 0, "num_shared_experts": 2}),
        ("float32", 2e-5, {"num_shared_experts": 0}),  # shared experts of no width
        ("bfloat16", 0.05, {}),
        ("bfloat16", 0.05, {"num_shared_experts": 0}),
    ],
)
def test_a_llada2_checkpoint_computes_llada2s_forward(tmp_path, dtype, tol, change):
    """Saved in LLaDA2's names (fused projection, an expert per module, the router's bias),
    the checkpoint loads into Glm4Moe, unread remote code aside, and its logits under the
    block-causal mask are LLaDA2's: in float32 to rounding, in bfloat16 as bfloat16 rounds.
    Also: one expert chosen (not normalised) with a query-key-value bias; no dense layer
    first and two shared experts; no shared experts (zero-width tensors, as LLaDA2 saves
    them: float32 on the CPU once crashed in oneDNN's linear)."""
    raw = {**SHAPE, **change}
    state = llada2_weights(raw, len(char_tokenizer()), seed=4)
    save_checkpoint(tmp_path, raw, state)
    bb = LLaDA2(model=str(tmp_path), block_length=4, dtype=dtype)
    assert type(bb.transformer).__name__ == "Glm4MoeForCausalLM"
    ids = torch.randint(3, 60, (2, 11), generator=torch.Generator().manual_seed(1))
    ours = bb.logits(ids, torch.ones_like(ids)).float()
    ref = llada2_forward(state, raw, ids, block_causal(11, 4), getattr(torch, dtype))
    scale = float(ref.abs().max())
    assert float((ours - ref).abs().max()) <= tol * scale
    if dtype == "float32":  # the routing matters: another bias chooses other experts
        moved = dict(state)
        for key in [k for k in moved if k.endswith("expert_bias")]:
            moved[key] = -moved[key]
        other = llada2_forward(moved, raw, ids, block_causal(11, 4), torch.float32)
        assert float((other - ref).abs().max()) > 100 * tol * scale


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"use_bias": True}, "use_bias=true"),
        ({"score_function": "softmax"}, "score_function 'softmax' is not sigmoid"),
        ({"rope_scaling": {"type": "yarn", "factor": 4}}, "rope_scaling"),
        ({"num_experts": None}, "lacks num_experts"),
        ({"n_group": 3}, "8 experts in n_group=3 groups"),
        ({"topk_group": 5}, "topk_group <= n_group"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 is more than"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size is 0, not an integer >= 1"),
        ({"norm_head": True}, "norm_head=true is not supported"),
        ({"n_group": 8}, "8 experts in n_group=8 groups"),  # groups of one expert
        ({"first_k_dense_replace": True}, "first_k_dense_replace is True, not an integer"),
        ({"partial_rotary_factor": 1.5}, r"partial_rotary_factor is 1.5, not a number in \[0, 1\]"),
        ({"partial_rotary_factor": "0.5"}, "partial_rotary_factor is '0.5', not a number"),
    ],
)
def test_a_llada2_config_it_cannot_compute_is_one_line(tmp_path, change, needle):
    raw = {k: v for k, v in {**SHAPE, **change}.items() if v is not None}
    save_checkpoint(tmp_path, raw, llada2_weights(SHAPE, len(char_tokenizer())))
    with pytest.raises(UserError, match=needle) as caught:
        LLaDA2(model=str(tmp_path))
    assert "\n" not in str(caught.value)


def test_a_llada2_checkpoint_missing_an_expert_names_it(tmp_path):
    state = llada2_weights(SHAPE, len(char_tokenizer()))
    del state["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_checkpoint(tmp_path, SHAPE, state)
    with pytest.raises(UserError, match=r"layer 2 has 7 of 8 experts' up_proj \(lacks \[5\]\)"):
        LLaDA2(model=str(tmp_path))


def test_a_config_json_without_optional_keys_gets_llada2s_defaults():
    """LLaDA2MoeConfig's defaults (configuration_llada2_moe.py) for every key a config.json
    may leave out."""
    raw = {
        "model_type": "llada2_moe",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_experts": 16,
        "moe_intermediate_size": 16,
    }
    c = llada2_config(raw)
    assert c.head_dim == 16 and c.num_key_value_heads == 4  # hidden // heads; all heads
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert c.rope_parameters["partial_rotary_factor"] == 0.5
    assert (c.rms_norm_eps, c.hidden_act, c.max_position_embeddings) == (1e-5, "silu", 16384)
    assert c.use_qk_norm and not c.attention_bias and not c.tie_word_embeddings
    assert (c.num_experts_per_tok, c.n_group, c.topk_group) == (2, 8, 4)
    assert (c.n_shared_experts, c.first_k_dense_replace) == (0, 0)
    assert c.routed_scaling_factor == 2.5 and c.norm_topk_prob  # two chosen: normalised
    assert llada2_config({**raw, "num_shared_experts": None}).n_shared_experts == 0


def _logits(tmp_path, raw, saved, dtype="float32"):
    save_checkpoint(tmp_path, raw, saved)
    bb = LLaDA2(model=str(tmp_path), block_length=4, dtype=dtype)
    ids = torch.randint(3, 60, (2, 11), generator=torch.Generator().manual_seed(1))
    return bb.logits(ids, torch.ones_like(ids)).float(), ids


def test_a_checkpoint_without_the_routing_bias_routes_as_with_a_zero_one(tmp_path):
    state = llada2_weights(SHAPE, len(char_tokenizer()), seed=4)
    zero = {k: torch.zeros_like(v) if k.endswith("expert_bias") else v for k, v in state.items()}
    saved = {k: v for k, v in state.items() if not k.endswith("expert_bias")}
    ours, ids = _logits(tmp_path, SHAPE, saved)
    ref = llada2_forward(zero, SHAPE, ids, block_causal(11, 4), torch.float32)
    assert float((ours - ref).abs().max()) <= 2e-5 * float(ref.abs().max())


def test_null_shared_experts_are_none(tmp_path):
    """num_shared_experts null: LLaDA2 builds no shared experts and saves none."""
    raw = {**SHAPE, "num_shared_experts": 0}
    state = llada2_weights(raw, len(char_tokenizer()), seed=4)
    saved = {k: v for k, v in state.items() if ".shared_experts." not in k}
    ours, ids = _logits(tmp_path, {**SHAPE, "num_shared_experts": None}, saved)
    ref = llada2_forward(state, raw, ids, block_causal(11, 4), torch.float32)
    assert float((ours - ref).abs().max()) <= 2e-5 * float(ref.abs().max())


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("model.layers.1.attention.dense.bias", torch.zeros(64), r"dense\.bias: .*\(use_bias\)"),
        (
            "model.layers.2.mlp.experts.3.down_proj.weight",
            torch.zeros(64, 15),
            r"experts\.3\.down_proj\.weight is \[64, 15\], expert 0's \[64, 16\]",
        ),
    ],
)
def test_a_checkpoint_key_it_cannot_load_is_one_line(tmp_path, key, value, needle):
    """A biased output projection (LLaDA2's `use_bias`, which defaults to true when
    config.json leaves it out), an expert of another shape."""
    state = {**llada2_weights(SHAPE, len(char_tokenizer())), key: value}
    save_checkpoint(tmp_path, {k: v for k, v in SHAPE.items() if k != "use_bias"}, state)
    with pytest.raises(UserError, match=needle) as caught:
        LLaDA2(model=str(tmp_path))
    assert "\n" not in str(caught.value)


def test_the_experts_sum_their_shares_in_float32_and_round_once(tmp_path):
    """In bfloat16, as LLaDA2's `moe_infer`: each expert's output (bfloat16) times its
    float32 weight, summed in float32 and rounded once; transformers' eager experts round
    each share to bfloat16 before adding it."""
    raw = {**SHAPE, "num_experts_per_tok": 4, "n_group": 2, "topk_group": 1}
    save_checkpoint(tmp_path, raw, llada2_weights(raw, len(char_tokenizer()), seed=4))
    moe = LLaDA2(model=str(tmp_path), dtype="bfloat16").transformer.model.layers[1].mlp
    x = torch.randn(64, raw["hidden_size"], generator=torch.Generator().manual_seed(0))
    x = x.to(torch.bfloat16)
    with torch.no_grad():
        _, weights, chosen = moe.gate(x)
        ours = moe.experts(x, chosen, weights)
        gate_up, down = moe.experts.gate_up_proj, moe.experts.down_proj
        shares = []
        for slot in range(chosen.shape[1]):
            g, u = torch.einsum("th,tih->ti", x, gate_up[chosen[:, slot]]).chunk(2, -1)
            part = torch.einsum("ti,thi->th", (F.silu(g) * u).to(x.dtype), down[chosen[:, slot]])
            shares.append(part.to(x.dtype).float() * weights[:, slot, None])
    once = sum(shares).to(x.dtype)
    each = torch.zeros_like(x)
    for share in shares:
        each += share.to(x.dtype)
    same_once = float((ours == once).float().mean())
    same_each = float((ours == each).float().mean())
    assert same_once > 0.9 and same_once > same_each + 0.1


# -- LLaDA2's `generate` (LLaDA2MoeModelLM.generate), written out -----------------------------
# Every step recomputes the whole window up to the current block, as `generate` does; the
# draw is by the backbone's keyed uniforms (inverse CDF) instead of torch.multinomial, and the
# mask token is never drawn (as in test_block's SDAR transcription).


def llada2_generate(
    model,
    prompt,
    mask_id,
    gen,
    block,
    steps,
    temperature,
    threshold,
    u,
    stops,
    top_k=None,
    top_p=1.0,
    early=False,
):
    plen = len(prompt)
    blocks = -(-(plen + gen) // block)
    total = blocks * block
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[0, :plen] = torch.tensor(prompt)
    allowed = block_causal(total, block)
    base, rem = divmod(block, steps)
    schedule = [base + (s < rem) for s in range(steps)]
    taken = 0
    for nb in range(plen // block, blocks):
        end = (nb + 1) * block
        for step in range(steps):
            active = x[0, end - block : end] == mask_id
            if not active.any():
                break
            mask = torch.zeros(end, end).masked_fill(~allowed[:end, :end], -math.inf)
            logits = model(
                input_ids=x[:, :end],
                attention_mask=mask[None, None],
                position_ids=torch.arange(end)[None],
            ).logits[0, -block:]
            logits = logits.double()
            logits[:, mask_id] = -math.inf
            if temperature > 0:
                logits = logits / temperature
            if top_k:  # _top_k_logits, then _top_p_logits of what it kept
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, -math.inf)
            if top_p < 1.0:
                ordered, order = torch.sort(logits, descending=True)
                drop = torch.softmax(ordered, -1).cumsum(-1) > top_p
                drop[:, 1:] = drop[:, :-1].clone()
                drop[:, 0] = False
                logits = logits.masked_fill(
                    torch.zeros_like(drop).scatter(-1, order, drop), -math.inf
                )
            if temperature > 0:
                probs = torch.softmax(logits, -1)
                cdf = probs.cumsum(-1)
                draw = u(taken)[end - block : end]
                x0 = torch.searchsorted(cdf, (draw * cdf[:, -1])[:, None], right=True)[:, 0]
                x0 = torch.minimum(x0, torch.searchsorted(cdf, cdf[:, -1:].contiguous())[:, 0])
            else:
                probs = torch.softmax(logits, -1)
                x0 = probs.argmax(-1)
            p = probs.gather(-1, x0[:, None])[:, 0]
            confidence = torch.where(active, p, -math.inf)
            high = confidence > threshold
            transfer = torch.zeros(block, dtype=torch.bool)
            if int(high.sum()) >= schedule[step]:
                transfer = high
            else:
                transfer[confidence.topk(min(schedule[step], int(active.sum()))).indices] = True
            x[0, end - block : end][transfer] = x0[transfer]
            taken += 1
            ends = torch.tensor(stops)
            if early and bool(torch.isin(x0[transfer], ends).any()):  # eos_early_stop
                answer = x[0, plen:]
                first = int(torch.isin(answer, ends).nonzero()[0, 0])
                if not bool((answer[:first] == mask_id).any()):
                    return x[0], taken
        if any(bool((x[0, plen:end] == s).any()) for s in stops):
            break
    return x[0], taken


@pytest.mark.parametrize(
    ("block", "steps", "threshold", "temperature", "text", "top_k", "top_p"),
    [
        (4, 4, 0.95, 1.0, "Question: 12+7?", None, 1.0),
        (8, 8, 0.5, 0.7, "What is 9-2?....", None, 1.0),
        (8, 4, 0.9, 1.0, "Q: 3*4+5=?", None, 1.0),
        (4, 4, 0.6, 0.0, "What is 9-2?", None, 1.0),
        # both filters on (their order: test_top_p_reads_what_top_k_left_as_in_generate)
        (8, 8, 0.9, 1.0, "Q: 3*4+5=?", 4, 0.7),
    ],
)
@pytest.mark.filterwarnings("ignore::dllmbench.core.errors.Notice")  # 4 steps a block of 8
def test_the_sampler_is_llada2s_generate_token_for_token(
    block, steps, threshold, temperature, text, top_k, top_p
):
    """On a random LLaDA2 (Glm4Moe, experts routed by a biased router), the backbone's rows,
    read from its KV cache, are `generate`'s tokens recomputing every block each step, and
    it takes as many forwards when its canvas ends on a block boundary (`generate`'s runs on
    to one; the backbone's last block is as much shorter)."""
    bb = LLaDA2(
        model="random",
        block_length=block,
        threshold=threshold,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=5,
    )
    bb.transformer.lm_head.weight.data.mul_(SHARPER)  # confidences spread around the threshold
    prompt = bb.encode(Prompt(text=text))
    gen = 4 * block
    key = 77
    ours = run_rows(bb, prompt, gen, (gen // block) * steps, [key])[0]
    width = len(ours)
    ref, forwards = llada2_generate(
        bb.transformer,
        prompt,
        bb.mask_id,
        gen,
        block,
        steps,
        temperature,
        threshold,
        lambda step: torch.cat([bb.noise_at(key, step, "token", width), torch.rand(block)]),
        sorted(bb.stop_ids),
        top_k,
        top_p,
    )
    same = width if width % block == 0 else width // block * block
    ours, ref = ours[:same], ref[:same]
    written = ref != bb.mask_id
    assert torch.equal(ours[written], ref[written])
    assert bool((ours[~written] == bb.eos_id).all())  # after the stop, the end token
    assert int(written.sum()) > len(prompt) + block
    if width % block == 0:  # no shorter last block: the same forwards
        assert bb.steps_taken == forwards
    if threshold < 0.95:  # the threshold committed several positions at some step
        assert forwards < int(written.sum()) - len(prompt)


def test_eos_early_stop_ends_a_row_at_the_step_generate_does():
    """With `eos_early_stop` (llada2's default, as the model card runs `generate`) a row ends
    at the step that commits an end token with everything before it written: `generate`'s
    tokens, its forwards, fewer than the row that fills its block first."""
    block, steps, threshold, key = 8, 8, 0.95, 77
    taken = {}
    for early in (False, True):
        bb = LLaDA2(
            model="random", block_length=block, seed=5, eos_early_stop=early, threshold=threshold
        )
        head = bb.transformer.lm_head.weight.data
        head.mul_(SHARPER)
        head[bb.eos_id] = head[52]  # the end token where the model would write token 52
        head[52] = -head[52]
        prompt = bb.encode(Prompt(text="What is 9-2?...."))
        ours = run_rows(bb, prompt, 4 * block, 4 * steps, [key])[0]
        width = len(ours)
        assert width % block == 0
        ref, forwards = llada2_generate(
            bb.transformer,
            prompt,
            bb.mask_id,
            4 * block,
            block,
            steps,
            1.0,
            threshold,
            lambda step: bb.noise_at(key, step, "token", width),  # noqa: B023
            sorted(bb.stop_ids),
            early=early,
        )
        written = ref != bb.mask_id
        assert torch.equal(ours[written], ref[written])
        assert bool((ours[~written] == bb.eos_id).all())
        assert bb.steps_taken == forwards
        answer = ours[len(prompt) :].tolist()
        assert 0 < answer.index(bb.eos_id) < 2 * block  # it ended in its second block
        taken[early] = forwards
    assert taken[True] < taken[False]


def test_top_p_reads_what_top_k_left_as_in_generate():
    """`generate`'s `_top_k_logits`, then `_top_p_logits` of what it kept: of probabilities
    0.4, 0.3, 0.2, 0.1, top-2 leaves 0.57 and 0.43, and top-p 0.5 of those keeps the first
    alone (top-p first would keep two)."""
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1, 1e-12]]).log()  # the last: the mask token
    c = LLaDA2.Config(model="random", temperature=1.0, top_k=2, top_p=0.5)
    for u in torch.linspace(0.01, 0.99, 9, dtype=torch.float64):
        x0, conf, _ = draw(logits.clone(), u[None], c, mask_id=4)
        assert int(x0) == 0 and float(conf) == pytest.approx(1.0)


def test_a_row_setting_it_cannot_take_names_llada2():
    bb = LLaDA2(model="random", block_length=4)
    with pytest.raises(UserError, match=r"^llada2: a row cannot set 'alg'"):
        bb.check_row_settings({"alg": "entropy"}, 16, 16)
    with pytest.raises(UserError, match=r"^llada2: a row's sampler settings"):
        bb.check_row_settings({"threshold": 2.0}, 16, 16)


def test_llada2s_defaults_are_its_generates():
    c = LLaDA2.Config()
    assert (c.model, c.block_length, c.threshold) == ("inclusionAI/LLaDA2.0-mini", 32, 0.95)
    assert c.remasking == "low_confidence_dynamic" and c.stop and c.cache and c.eos_early_stop
    assert isinstance(LLaDA2(model="random"), BlockDiffusion)


# -- FLOPs: a token is charged its experts, not all of them ------------------------------------


def test_a_mixture_of_experts_is_charged_the_experts_a_token_is_routed_to():
    """torch's own count of a forward (eager attention and experts, so that every matmul is
    one it sees) is the formula's: the router whole, the shared expert, and num_experts_per_tok
    of the experts, whichever a token is routed to."""
    from torch.utils.flop_counter import FlopCounterMode

    net = random_llada2({**RANDOM_SHAPE, "vocab_size": 80}, seed=2, dtype=torch.float32)
    net.config._attn_implementation = "eager"
    net.config._experts_implementation = "eager"
    shape = shape_of(net)
    c = net.config
    h, routed = c.hidden_size, c.n_routed_experts
    attention = h * c.head_dim * (c.num_attention_heads * 2 + c.num_key_value_heads * 2)
    dense = 3 * h * c.intermediate_size
    experts = c.num_experts_per_tok * 3 * h * c.moe_intermediate_size
    shared = 3 * h * c.moe_intermediate_size * c.n_shared_experts
    assert shape.params == 2 * attention + dense + routed * h + experts + shared
    ids = torch.randint(0, 80, (3, 20), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(input_ids=ids)
    assert counter.get_total_flops() == 3 * flops(shape, Work.full(20))


def test_a_forward_is_sized_for_each_tokens_copies_for_its_experts(monkeypatch):
    """On a (pretended) GPU, a mixture of experts' forward is sized with its experts'
    buffers (`grouped_mm`: per chosen expert, the token's state in and out, the expert's
    widths, its float32 output weighted and reordered) beside a dense layer's activations."""
    from dllmbench.execution.engine import CACHE_SHARE, MEMORY_SHARE, Capacity, sized_to_memory

    free = 10**8
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, free))
    bb = LLaDA2(model="random", block_length=4)
    bb.device = "cuda"
    c = bb.transformer.config
    h, top_k, width = c.hidden_size, c.num_experts_per_tok, c.moe_intermediate_size
    dense = (6 * h + 3 * c.intermediate_size) * 4
    experts = top_k * ((2 * h + 3 * width) * 4 + 2 * h * 4)
    sized = sized_to_memory(Capacity(problems=1), bb, 100)
    left = free - int(free * CACHE_SHARE)
    assert sized.batch_tokens == int(left * MEMORY_SHARE) // (2 * (dense + experts))


def test_rows_of_two_prompts_in_one_forward_are_each_alone():
    """Rows of prompts of different lengths share a forward (padded queries, their own cached
    blocks): each row's tokens are the row's alone, its experts routed per token."""
    bb = LLaDA2(model="random", block_length=4, seed=5, threshold=0.6, eos_early_stop=False)
    bb.transformer.lm_head.weight.data.mul_(SHARPER)
    prompts = [bb.encode(Prompt(text=t)) for t in ("Question: 12+7?", "What is 9-2?")]
    together = stepped(bb, prompts, [0, 1], 8)
    assert torch.equal(together[0], stepped(bb, prompts, [0], 8)[0])
    assert torch.equal(together[1], stepped(bb, prompts, [1], 8)[0])
    assert all(int((row == bb.mask_id).sum()) < 16 - 8 for row in together)  # past block one


def test_a_t_below_gen_length_is_said_once():
    """`run`'s default T of 128 over 512 tokens makes each step commit about 4 tokens where
    `generate` commits one: a Notice says so once, naming the T that gives its schedule."""
    bb = LLaDA2(model="random", block_length=4)
    prompt = bb.encode(Prompt(text="What is 9-2?"))
    with pytest.warns(Notice, match=r"T=8 is below gen_length=16, .* about 2 tokens .* --steps 16"):
        run_rows(bb, prompt, 16, 8, [1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_rows(bb, prompt, 16, 8, [3])  # said once
        run_rows(LLaDA2(model="random", block_length=4), prompt, 16, 16, [1])  # T = gen_length
