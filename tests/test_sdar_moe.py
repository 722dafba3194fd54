"""SDAR-MoE (SDAR-30B-A3B): its checkpoints, one module per expert, load into transformers'
Qwen3-MoE and compute SDAR-MoE's forward, float32 and bfloat16; transformers' own conversion of
the same files gives the same logits bit for bit; a token is charged the experts it is routed
through. (The sampler over it is SDAR's token for token: test_block.py's qwen3_moe cases.)"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from test_block import stepped
from test_llada2 import block_causal, rms, save_checkpoint

from dllmbench.core.errors import UserError
from dllmbench.core.flops import Work, flops, shape_of
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.block import RANDOM_SHAPE, BlockDiffusion
from dllmbench.plugins.backbones.loading import char_tokenizer
from dllmbench.plugins.backbones.sdar_moe import random_sdar_moe

# -- an SDAR-MoE checkpoint as the Hub holds it (Qwen3-MoE's names), and its forward -----------

SHAPE = {
    "model_type": "sdar_moe",
    "architectures": ["SDARMoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,  # heads × head_dim is not the hidden size
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "num_experts": 8,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],  # a dense layer between sparse ones
    "rope_scaling": None,
    "tie_word_embeddings": False,
}


def sdar_moe_weights(raw: dict, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in SDAR-MoE's own names and layout (one module per expert)."""
    g = torch.Generator().manual_seed(seed)
    h, d = raw["hidden_size"], raw["head_dim"]
    heads, kv = raw["num_attention_heads"], raw["num_key_value_heads"]

    def w(*shape, std=0.08):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1 + w(n, std=0.2)

    state = {"model.embed_tokens.weight": w(vocab, h, std=1.0)}
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm(h)
        state[p + "post_attention_layernorm.weight"] = norm(h)
        for name, rows in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            state[f"{p}self_attn.{name}.weight"] = w(rows, h)
        state[p + "self_attn.o_proj.weight"] = w(h, heads * d)
        state[p + "self_attn.q_norm.weight"] = norm(d)
        state[p + "self_attn.k_norm.weight"] = norm(d)
        if i in raw["mlp_only_layers"]:
            inter = raw["intermediate_size"]
            state[p + "mlp.gate_proj.weight"] = w(inter, h)
            state[p + "mlp.up_proj.weight"] = w(inter, h)
            state[p + "mlp.down_proj.weight"] = w(h, inter)
            continue
        inter = raw["moe_intermediate_size"]
        state[p + "mlp.gate.weight"] = w(raw["num_experts"], h, std=0.5)
        for e in range(raw["num_experts"]):
            q = f"{p}mlp.experts.{e}."
            state[q + "gate_proj.weight"] = w(inter, h)
            state[q + "up_proj.weight"] = w(inter, h)
            state[q + "down_proj.weight"] = w(h, inter)
    state["model.norm.weight"] = norm(h)
    state["lm_head.weight"] = w(vocab, h)
    return state


def sdar_moe_forward(state, raw, ids, allowed, dtype):
    """SDARMoeForCausalLM's forward, written out from its definition (Qwen3-MoE's): logits
    [B, L, V] (float32) of `ids` [B, L] at positions 0..L-1, query i seeing key j where
    `allowed[i, j]`. The router's float32 softmax picks the top experts, renormalised; expert
    by expert, in index order, each one's weighted output is added in the model's dtype."""
    s = {k: v.to(dtype) for k, v in state.items()}
    eps, d = raw["rms_norm_eps"], raw["head_dim"]
    heads, kv = raw["num_attention_heads"], raw["num_key_value_heads"]
    b, n = ids.shape
    inv = 1.0 / raw["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
    angles = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))

    def rope(t):  # rotate-half on the whole head
        half = torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1)
        return t * cos + half * sin

    def mlp(x, p):
        return F.linear(
            F.silu(F.linear(x, s[p + "gate_proj.weight"])) * F.linear(x, s[p + "up_proj.weight"]),
            s[p + "down_proj.weight"],
        )

    additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, -math.inf)
    x = s["model.embed_tokens.weight"][ids]
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms(x, s[p + "input_layernorm.weight"], eps)

        def split(name, count, y=y, p=p):
            out = F.linear(y, s[f"{p}self_attn.{name}.weight"])
            return out.view(b, n, count, d).transpose(1, 2)

        q = rope(rms(split("q_proj", heads), s[p + "self_attn.q_norm.weight"], eps))
        k = rope(rms(split("k_proj", kv), s[p + "self_attn.k_norm.weight"], eps))
        v = split("v_proj", kv)
        k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=d**-0.5)
        x = x + F.linear(att.transpose(1, 2).reshape(b, n, -1), s[p + "self_attn.o_proj.weight"])
        y = rms(x, s[p + "post_attention_layernorm.weight"], eps)
        if i in raw["mlp_only_layers"]:
            x = x + mlp(y, p + "mlp.")
            continue
        flat = y.reshape(b * n, -1)
        probs = torch.softmax(F.linear(flat, s[p + "mlp.gate.weight"]).float(), dim=-1)
        weight, chosen = probs.topk(raw["num_experts_per_tok"], dim=-1)
        if raw["norm_topk_prob"]:
            weight = weight / weight.sum(-1, keepdim=True)
        weight = weight.to(dtype)
        out = torch.zeros_like(flat)
        for e in range(raw["num_experts"]):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if len(token):
                part = mlp(flat[token], f"{p}mlp.experts.{e}.") * weight[token, slot, None]
                out.index_add_(0, token, part)
        x = x + out.view(b, n, -1)
    x = rms(x, s["model.norm.weight"], eps)
    return F.linear(x, s["lm_head.weight"]).float()


IDS = torch.randint(3, 60, (2, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("dtype", "tol", "change"),
    [
        ("float32", 2e-5, {}),
        ("float32", 2e-5, {"num_experts_per_tok": 1, "norm_topk_prob": False}),
        ("float32", 2e-5, {"mlp_only_layers": [], "attention_bias": False}),
        ("bfloat16", 0.05, {}),
    ],
)
def test_an_sdar_moe_checkpoint_computes_sdar_moes_forward(tmp_path, dtype, tol, change):
    """Saved in SDAR-MoE's names (an expert per module), the checkpoint loads into Qwen3-MoE,
    unread remote code aside, and its logits under the block-causal mask are SDAR-MoE's: in
    float32 to rounding, in bfloat16 as bfloat16 rounds. Also: one expert chosen and not
    renormalised; every layer sparse (SDAR-30B-A3B's)."""
    raw = {**SHAPE, **change}
    state = sdar_moe_weights(raw, len(char_tokenizer()), seed=4)
    save_checkpoint(tmp_path, raw, state)
    bb = BlockDiffusion(model=str(tmp_path), block_length=4, dtype=dtype)
    assert type(bb.transformer).__name__ == "Qwen3MoeForCausalLM"
    ours = bb.logits(IDS, torch.ones_like(IDS)).float()
    ref = sdar_moe_forward(state, raw, IDS, block_causal(11, 4), getattr(torch, dtype))
    scale = float(ref.abs().max())
    assert float((ours - ref).abs().max()) <= tol * scale
    if dtype == "float32":  # the routing matters: another router chooses other experts
        moved = dict(state)
        for key in [k for k in moved if k.endswith("mlp.gate.weight")]:
            moved[key] = -moved[key]
        other = sdar_moe_forward(moved, raw, IDS, block_causal(11, 4), torch.float32)
        assert float((other - ref).abs().max()) > 100 * tol * scale


def test_transformers_own_conversion_of_the_files_gives_the_same_logits(tmp_path):
    """transformers reads Qwen3-MoE's per-expert files with its own weight conversion: the
    model it builds from the same files computes the backbone's logits bit for bit, in
    bfloat16 (the experts stacked in the same order, gate rows before up rows)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    state = sdar_moe_weights(SHAPE, len(char_tokenizer()), seed=6)
    save_checkpoint(tmp_path, SHAPE, state)
    bb = BlockDiffusion(model=str(tmp_path), block_length=4, dtype="bfloat16")
    fields = {k: v for k, v in json.loads((tmp_path / "config.json").read_text()).items()}
    config = Qwen3MoeConfig(**{k: v for k, v in fields.items() if k not in ("model_type",)})
    config._experts_implementation = "eager"
    theirs = Qwen3MoeForCausalLM.from_pretrained(
        str(tmp_path), config=config, dtype=torch.bfloat16, attn_implementation="sdpa"
    ).eval()
    for name, tensor in bb.transformer.state_dict().items():
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    allowed = block_causal(11, 4)[None, None].expand(2, 1, 11, 11)
    with torch.no_grad():
        expected = theirs(input_ids=IDS, attention_mask=allowed).logits
    assert torch.equal(bb.logits(IDS, torch.ones_like(IDS)), expected)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 is more than num_experts=8"),
        ({"num_experts": 0}, "num_experts is 0, not an integer >= 1"),
        ({"moe_intermediate_size": True}, "moe_intermediate_size is True, not an integer"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step is 0, not an integer >= 1"),
        ({"mlp_only_layers": "1"}, "mlp_only_layers is '1', not a list of layer numbers"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob is 'yes', not true or false"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling .* not supported"),
    ],
)
def test_an_sdar_moe_config_it_cannot_compute_is_one_line(tmp_path, change, needle):
    save_checkpoint(tmp_path, {**SHAPE, **change}, sdar_moe_weights(SHAPE, len(char_tokenizer())))
    with pytest.raises(UserError, match=needle) as caught:
        BlockDiffusion(model=str(tmp_path))
    assert "\n" not in str(caught.value)


EXPERTS = "model.layers.0.mlp.experts."


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda s: s.pop("model.layers.2.mlp.experts.5.up_proj.weight"),
            r"layer 2 has 7 of 8 experts' up_proj \(lacks \[5\]\)",
        ),
        (
            lambda s: s.update({f"{EXPERTS}8.up_proj.weight": torch.zeros(16, 64)}),
            r"layer 0 has 9 of 8 experts' up_proj \(has experts \[8\] beyond them\)",
        ),
        (
            lambda s: s.update({f"{EXPERTS}3.down_proj.weight": torch.zeros(64, 8)}),
            r"experts\.3\.down_proj\.weight is \[64, 8\], expert 0's \[64, 16\]",
        ),
        (  # Qwen2-MoE's shared expert: not SDAR-MoE's
            lambda s: s.update({"model.layers.0.mlp.shared_expert.up_proj.weight": torch.zeros(8)}),
            r"unexpected \['model\.layers\.0\.mlp\.shared_expert\.up_proj\.weight'\]",
        ),
    ],
)
def test_an_sdar_moe_checkpoint_it_cannot_load_names_what(tmp_path, edit, needle):
    state = sdar_moe_weights(SHAPE, len(char_tokenizer()))
    edit(state)
    save_checkpoint(tmp_path, SHAPE, state)
    with pytest.raises(UserError, match=needle) as caught:
        BlockDiffusion(model=str(tmp_path))
    assert "\n" not in str(caught.value)


def test_each_expert_is_let_go_of_once_its_layer_is_stacked():
    """The experts are most of a mixture's weights: the conversion takes them out of the
    checkpoint's dict as it stacks them, so a 30B checkpoint is not held twice while it loads."""
    from dllmbench.plugins.backbones.loading import block_config
    from dllmbench.plugins.backbones.sdar_moe import sdar_moe_state

    raw = {**SHAPE, "vocab_size": len(char_tokenizer())}
    state = sdar_moe_weights(SHAPE, len(char_tokenizer()))
    before = set(state)
    out = sdar_moe_state(state, block_config(raw, qwen3=True, experts=True))
    assert not any(".mlp.experts." in k for k in state) and len(state) < len(before)
    assert {k for k in out if ".mlp.experts." not in k} == set(state)
    assert out["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 32, 64)


def test_a_checkpoint_is_known_by_its_experts_without_a_model_type(tmp_path):
    """A config.json that names no model type (a hand-made or older one) still loads as
    SDAR-MoE when its weights are experts; a dense SDAR stays Qwen3."""
    raw = {k: v for k, v in SHAPE.items() if k not in ("model_type", "architectures")}
    state = sdar_moe_weights(raw, len(char_tokenizer()), seed=2)
    save_checkpoint(tmp_path, raw, state)
    bb = BlockDiffusion(model=str(tmp_path), block_length=4)
    assert type(bb.transformer).__name__ == "Qwen3MoeForCausalLM"
    ref = sdar_moe_forward(state, raw, IDS, block_causal(11, 4), torch.float32)
    ours = bb.logits(IDS, torch.ones_like(IDS)).float()
    assert float((ours - ref).abs().max()) <= 2e-5 * float(ref.abs().max())


def test_a_dense_block_checkpoint_with_rotary_scaling_is_one_line(tmp_path):
    """Qwen3Config would not read a rope_scaling left in config.json: the positions would be
    computed unscaled, silently. It is refused; null or the default is none."""
    bb = BlockDiffusion(model="random")
    tok = char_tokenizer()
    fields = bb.transformer.config.to_dict()
    raw = {k: fields[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers")}
    raw |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    raw |= {"vocab_size": len(tok), "tie_word_embeddings": False}
    state = {k: v.contiguous() for k, v in bb.transformer.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    tok.save_pretrained(str(tmp_path))
    for scaling, refused in (
        ({"rope_type": "yarn", "factor": 4.0}, True),
        ({"type": "default"}, False),
        (None, False),
    ):
        (tmp_path / "config.json").write_text(json.dumps({**raw, "rope_scaling": scaling}))
        if refused:
            with pytest.raises(UserError, match=r"rope_scaling \{'rope_type': 'yarn'"):
                BlockDiffusion(model=str(tmp_path))
        else:
            loaded = BlockDiffusion(model=str(tmp_path))
            assert type(loaded.transformer).__name__ == "Qwen3ForCausalLM"


# -- FLOPs and memory: a token is charged its experts, not all of them -------------------------


def test_a_token_is_charged_the_experts_it_is_routed_to():
    """torch's own count of a forward (eager attention and experts) is the formula's: the
    router whole and num_experts_per_tok of the experts, whichever a token is routed to."""
    from torch.utils.flop_counter import FlopCounterMode

    net = random_sdar_moe({**RANDOM_SHAPE, "vocab_size": 80}, seed=2, dtype=torch.float32)
    net.config._attn_implementation = "eager"
    shape = shape_of(net)
    c = net.config
    h = c.hidden_size
    attention = h * c.head_dim * (c.num_attention_heads * 2 + c.num_key_value_heads * 2)
    experts = c.num_experts_per_tok * 3 * h * c.moe_intermediate_size
    assert shape.params == c.num_hidden_layers * (attention + c.num_experts * h + experts)
    ids = torch.randint(0, 80, (3, 20), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(input_ids=ids)
    assert counter.get_total_flops() == 3 * flops(shape, Work.full(20))


def test_sdar_30b_a3b_is_charged_its_three_billion_active_parameters():
    """SDAR-30B-A3B's shape (Qwen3-30B-A3B's config.json), on the meta device: 48 layers of 128
    experts, 8 routed. P counts the 2.7 billion weights a token passes through beside the
    embedding and the head (3.3 billion with them: its "A3B"), not the 29 billion the layers
    hold."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        net = Qwen3MoeForCausalLM(config)
    shape = shape_of(net)
    held = sum(p.numel() for p in net.model.layers.parameters() if p.dim() > 1)
    assert 28e9 < held < 30e9
    attention = 2048 * 128 * (32 * 2 + 4 * 2)
    routed = 8 * 3 * 2048 * 768
    assert shape.params == 48 * (attention + 128 * 2048 + routed)
    assert 2.7e9 < shape.params < 2.8e9 and shape.head == 151936 * 2048
    assert 3.3e9 < shape.params + 2 * shape.head < 3.4e9


def test_rows_of_two_prompts_in_one_forward_are_each_alone_in_bfloat16():
    """Rows of prompts of different lengths share a forward, in the dtype users run: each
    row's tokens are the row's alone, its experts routed per token."""
    bb = BlockDiffusion(model="random", family="qwen3_moe", block_length=4, seed=5,
                        threshold=0.6, dtype="bfloat16")  # fmt: skip
    bb.transformer.lm_head.weight.data.mul_(40)
    prompts = [bb.encode(Prompt(text=t)) for t in ("Question: 12+7?", "What is 9-2?")]
    together = stepped(bb, prompts, [0, 1], 8)
    assert torch.equal(together[0], stepped(bb, prompts, [0], 8)[0])
    assert torch.equal(together[1], stepped(bb, prompts, [1], 8)[0])
    assert all(int((row == bb.mask_id).sum()) < 16 - 8 for row in together)  # past block one
