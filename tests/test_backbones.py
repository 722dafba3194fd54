"""Dream and LLaDA on native classes: logits, schedules, suppression, batching, loading."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from dllmbench.api.interfaces import StepBatch
from dllmbench.core.errors import UserError
from dllmbench.core.keys import row_key
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.dream import Dream, quota
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.loading import load_strict, rename_llada_keys


# -- a reference forward, written out from the weights ------------------------------------------
def rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_logits(net, ids):
    """Embedding → layers (RMSNorm, RoPE, GQA attention under an all-visible 4-D mask,
    SwiGLU) → norm → head, straight from the state dict."""
    cfg, sd = net.config, net.state_dict()
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    theta = cfg.rope_parameters["rope_theta"]
    n = ids.shape[1]
    pos = torch.arange(n)
    visible = torch.zeros(1, 1, n, n)  # additive 4-D mask: every position sees every other
    h = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = rms(h, sd[p + "input_layernorm.weight"], cfg.rms_norm_eps)

        def proj(name, x=x, p=p):
            out = x @ sd[p + f"self_attn.{name}.weight"].T
            bias = sd.get(p + f"self_attn.{name}.bias")
            return out if bias is None else out + bias

        q = proj("q_proj").view(1, n, heads, dim).transpose(1, 2)
        k = proj("k_proj").view(1, n, kv, dim).transpose(1, 2)
        v = proj("v_proj").view(1, n, kv, dim).transpose(1, 2)
        q, k = rotate(q, pos, theta), rotate(k, pos, theta)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dim) + visible, -1) @ v
        h = h + att.transpose(1, 2).reshape(1, n, -1) @ sd[p + "self_attn.o_proj.weight"].T
        x = rms(h, sd[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = torch.nn.functional.silu(x @ sd[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    return rms(h, sd["model.norm.weight"], cfg.rms_norm_eps) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_native_class_is_bidirectional_and_matches_a_reference_forward(cls):
    bb = cls(model="random", seed=3)
    ids = torch.randint(0, len(bb.tokenizer), (1, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        native = bb.transformer(input_ids=ids).logits
        bb.transformer.config.is_causal = True
        causal = bb.transformer(input_ids=ids).logits
        bb.transformer.config.is_causal = False
    torch.testing.assert_close(native, reference_logits(bb.transformer, ids), atol=1e-5, rtol=1e-5)
    assert (native - causal).abs().max() > 1e-3  # the causal mask really is off


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_a_batch_without_padding_goes_without_a_mask_and_stays_bidirectional(cls):
    """`hidden` leaves the mask out when no row is padded: the same bits as the all-ones mask
    (bidirectional, as the test above shows of the unmasked forward), and a padded batch keeps
    its mask."""
    bb = cls(model="random", seed=3)
    ids = torch.randint(0, len(bb.tokenizer), (3, 17), generator=torch.Generator().manual_seed(1))
    ones = torch.ones_like(ids)
    masks = []
    model_forward = bb.transformer.model.forward

    def forward(*args, **kwargs):
        masks.append(kwargs["attention_mask"])
        return model_forward(*args, **kwargs)

    bb.transformer.model.forward = forward
    unmasked = bb.hidden(ids, ones)
    assert masks == [None]
    with torch.no_grad():
        masked = bb.transformer.model(
            input_ids=ids, attention_mask=ones, position_ids=torch.arange(17).expand(3, -1)
        ).last_hidden_state
    if bb.shift:
        masked = torch.cat([masked[:, :1], masked[:, :-1]], dim=1)
    assert torch.equal(unmasked, masked)
    padded = ones.clone()
    padded[0, :2] = 0
    bb.hidden(ids, padded)
    assert masks[-1] is not None and torch.equal(masks[-1], padded)


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_rows_of_one_canvas_share_a_forward_and_are_stepped_each_with_its_own_key(cls):
    """The transformer sees each distinct canvas (tokens and padding) of a batch once; every
    row gets the hidden states it gets alone; `computed_rows` names the first of each canvas;
    and rows of one canvas at one step still draw their own tokens from their own keys."""
    bb = cls(model="random", seed=3)
    draw = torch.Generator().manual_seed(1)
    a, b = (torch.randint(0, len(bb.tokenizer), (17,), generator=draw) for _ in range(2))
    ids = torch.stack([a, b, a, a, b])
    attn = torch.ones_like(ids)
    attn[[1, 4], :3] = 0  # b's rows padded alike; an a row padded otherwise is another canvas
    ids = torch.cat([ids, a[None]])
    attn = torch.cat([attn, torch.cat([torch.zeros(2), torch.ones(15)]).long()[None]])
    seen = []
    model_forward = bb.transformer.model.forward

    def forward(*args, **kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        return model_forward(*args, **kwargs)

    bb.transformer.model.forward = forward
    shared = bb.hidden(ids, attn)
    assert seen == [3]  # a, b padded, a padded otherwise
    for i in range(len(ids)):
        assert torch.equal(shared[i], bb.hidden(ids[i : i + 1], attn[i : i + 1])[0]), i

    mask = bb.mask_id
    canvas = torch.cat([a[:6], torch.full((11,), mask)])
    other = torch.cat([b[:6], torch.full((11,), mask)])
    rows = [canvas, canvas, other, canvas]
    batch = StepBatch(rows, [6] * 4, [0] * 4, [11, 12, 13, 11], total_steps=4)
    assert bb.computed_rows(batch) == [0, 2]
    seen.clear()
    stepped = bb.denoise_step(batch)
    assert seen == [2]
    assert torch.equal(stepped[0], stepped[3])  # one canvas, one key, one step: one row
    assert not torch.equal(stepped[0], stepped[1])  # one canvas, another key
    alone = bb.denoise_step(StepBatch([canvas], [6], [0], [12], total_steps=4))
    assert torch.equal(stepped[1], alone[0])


def test_dream_shifts_logits_and_llada_does_not():
    for cls, shifted in ((Dream, True), (LLaDA, False)):
        bb = cls(model="random")
        ids = torch.randint(0, 50, (1, 9))
        attn = torch.ones_like(ids)
        raw = bb.transformer(input_ids=ids).logits
        got = bb.logits(ids, attn)
        if shifted:
            torch.testing.assert_close(got[:, 1:], raw[:, :-1])
            torch.testing.assert_close(got[:, :1], raw[:, :1])
        else:
            torch.testing.assert_close(got, raw)


# -- schedules -------------------------------------------------------------------------------
def trajectory(bb, gen_length, total_steps, prompt="12+30=", key=7):
    ids = bb.encode(Prompt(text=prompt))
    tokens, plen = bb.canvas(ids, gen_length), len(ids)
    states = [tokens]
    for t in range(total_steps):
        tokens = bb.denoise_step(StepBatch([tokens], [plen], [t], [key], total_steps))[0]
        states.append(tokens)
    return states, plen


def commits(bb, gen_length, total_steps):
    states, _ = trajectory(bb, gen_length, total_steps)
    masks = [int((s == bb.mask_id).sum()) for s in states]
    return [a - b for a, b in itertools.pairwise(masks)]


@pytest.mark.parametrize(
    "gen,steps,expected",
    [
        (256, 128, [1] + [2] * 126 + [3]),
        (256, 256, [0] + [1] * 254 + [2]),
        (10, 4, [2, 2, 2, 4]),
    ],
)
def test_dream_commits_per_step_follow_the_reference_schedule(gen, steps, expected):
    assert quota(torch.tensor([gen]), torch.tensor([0]), steps, 1e-3).item() == expected[0]
    bb = Dream(model="random", suppress_mask=True)
    assert commits(bb, gen, steps) == expected


def test_dream_quota_keeps_float32_truncation():
    # gen 2000 / 2000 steps: the float32 rounding pattern begins 0, 0, 1, 1, 0, 1
    remaining, counts = 2000, []
    for t in range(6):
        k = int(quota(torch.tensor([remaining]), torch.tensor([t]), 2000, 1e-3))
        counts.append(k)
        remaining -= k
    assert counts == [0, 0, 1, 1, 0, 1]


@pytest.mark.parametrize("gen,steps,expected", [(256, 128, [2] * 128), (10, 4, [3, 3, 2, 2])])
def test_llada_commits_per_step_follow_the_reference_schedule(gen, steps, expected):
    assert commits(LLaDA(model="random", suppress_mask=True), gen, steps) == expected


def test_llada_blocks_commit_block_by_block():
    bb = LLaDA(model="random", suppress_mask=True, block_length=4)
    states, plen = trajectory(bb, 16, 8)
    for t in range(1, 9):
        done = (states[t][plen:] != bb.mask_id).nonzero().flatten()
        assert done.max() < 4 * math.ceil(t / 2)  # nothing right of the current block


def test_llada_refuses_blocks_that_do_not_divide():
    bb = LLaDA(model="random", block_length=3)
    with pytest.raises(UserError, match="not a multiple of block_length 3"):
        trajectory(bb, 10, 4)


# -- suppression and the mask quirk ------------------------------------------------------------
SAMPLERS = [
    (Dream, {"alg": "origin"}),
    (Dream, {"alg": "maskgit_plus"}),
    (Dream, {"alg": "maskgit_plus", "alg_temp": 0.0, "temperature": 0.0}),
    (Dream, {"alg": "topk_margin", "top_p": 0.8}),
    (Dream, {"alg": "entropy", "top_k": 5}),
    (LLaDA, {}),
    (LLaDA, {"temperature": 0.8, "remasking": "random"}),
    (LLaDA, {"block_length": 5, "cfg_scale": 0.5}),
]


@pytest.mark.parametrize("cls,config", SAMPLERS)
def test_with_suppression_only_masks_change_and_none_remain(cls, config):
    bb = cls(model="random", suppress_mask=True, **config)
    states, plen = trajectory(bb, 10, 6)
    for before, after in itertools.pairwise(states):
        assert torch.equal(before[:plen], after[:plen])
        changed = before != after
        assert (before[changed] == bb.mask_id).all()  # only masked positions commit
        assert (after[changed] != bb.mask_id).all()
    assert not (states[-1] == bb.mask_id).any()


class MaskLover(torch.nn.Module):
    """A transformer whose every position prefers the mask token."""

    def __init__(self, vocab: int, mask_id: int):
        super().__init__()
        self.lm_head = torch.nn.Linear(1, vocab, bias=False)
        torch.nn.init.zeros_(self.lm_head.weight)
        self.lm_head.weight.data[mask_id] = 10.0

    def model(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        hidden = torch.ones(*input_ids.shape, 1)
        return type("Out", (), {"last_hidden_state": hidden})()


@pytest.mark.parametrize("cls", [Dream, LLaDA])
def test_reference_behaviour_can_commit_the_mask_token(cls):
    base = cls(model="random")
    lover = MaskLover(len(base.tokenizer), base.mask_id)
    quirky = cls(transformer=lover, tokenizer=base.tokenizer, temperature=0.0)
    states, _ = trajectory(quirky, 6, 3)
    assert (states[-1] == quirky.mask_id).sum() > 0  # "committed" masks stay masked
    clean = cls(transformer=lover, tokenizer=base.tokenizer, temperature=0.0, suppress_mask=True)
    states, _ = trajectory(clean, 6, 3)
    assert not (states[-1] == clean.mask_id).any()


# -- batching and snapshots --------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,config",
    [
        (Dream, {}),
        (Dream, {"alg": "origin"}),
        (Dream, {"alg": "entropy", "alg_temp": 0.0, "dtype": "bfloat16"}),
        (LLaDA, {"temperature": 0.7}),
        (LLaDA, {"temperature": 0.7, "remasking": "random"}),
        (LLaDA, {"temperature": 0.0, "dtype": "bfloat16"}),
    ],
)
def test_row_alone_equals_row_in_a_mixed_batch_and_resumed_from_a_snapshot(cls, config):
    bb = cls(model="random", **config)
    T, gen = 8, 6
    prompts = [f"{a}+{b}=" for a, b in [(1, 2), (123, 45), (7, 8888), (60, 6)]]
    rows = []
    for j in range(64):
        key = row_key(0, f"p{j % 4}", "sample", (j,))
        states, plen = trajectory(bb, gen, T, prompts[j % 4], key)
        rows.append({"states": states, "plen": plen, "key": key, "step": j % T})
    # start every row from its stored snapshot at its own step, then step them together
    live = {j: r["states"][r["step"]] for j, r in enumerate(rows)}
    while live:
        order = sorted(live)
        batch = StepBatch(
            [live[j] for j in order],
            [rows[j]["plen"] for j in order],
            [rows[j]["step"] for j in order],
            [rows[j]["key"] for j in order],
            T,
        )
        out = bb.denoise_step(batch)
        for j, tokens in zip(order, out, strict=True):
            rows[j]["step"] += 1
            assert torch.equal(tokens, rows[j]["states"][rows[j]["step"]]), j
            live[j] = tokens
            if rows[j]["step"] == T:
                del live[j]


# -- packed rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,config",
    [
        (Dream, {}),
        (Dream, {"dtype": "bfloat16"}),
        (LLaDA, {"temperature": 0.7}),
        (LLaDA, {"temperature": 0.7, "cfg_scale": 1.0, "dtype": "bfloat16"}),
    ],
)
def test_packed_rows_give_the_tokens_of_padded_rows(cls, config):
    """attention=packed (rows end to end under a FlexAttention document mask) against SDPA
    over left-padded rows: the same hidden states to rounding, the same tokens at every step
    in float32 (in bf16 all but a near-tie draw or two), and fewer tokens computed."""
    padded = cls(model="random", **config)
    packed = cls(
        transformer=padded.transformer, tokenizer=padded.tokenizer, attention="packed", **config
    )
    T, gen = 6, 8
    prompts = ["1+2=", "123+45=", "7*8888=", "60-6=", "9="]
    rows, plens, keys = [], [], []
    for j, prompt in enumerate(prompts * 3):
        ids = padded.encode(Prompt(text=prompt))
        rows.append(padded.canvas(ids, gen + j % 4))
        plens.append(len(ids))
        keys.append(row_key(0, f"p{j}", "sample", (j,)))
    ids, attn, _ = padded.pad(rows)
    real = attn.bool()
    real[:, 1:] &= real[:, :-1].clone()  # Dream's shift reads a row's first token from a pad
    a, b = padded.hidden(ids, attn)[real].float(), packed.hidden(ids, attn)[real].float()
    tolerance = 5e-2 if padded.dtype == torch.bfloat16 else 1e-5
    assert (a - b).abs().max() <= tolerance * a.abs().max()
    same = total = 0
    for t in range(T):
        batch = StepBatch(list(rows), plens, [t] * len(rows), keys, T)
        rows = padded.denoise_step(batch)
        for x, y in zip(rows, packed.denoise_step(batch), strict=True):
            same, total = same + int((x == y).sum()), total + len(x)
    if padded.dtype == torch.float32:
        assert same == total
    else:  # two bf16 kernels round differently: a draw at a near-tie may go the other way
        assert same >= 0.99 * total, (same, total)
    widths = [len(r) for r in rows]
    assert packed.computed_tokens(widths) < padded.computed_tokens(widths)
    computed = packed.computed_tokens(widths)
    assert computed % 128 == 0 and 0 <= computed - sum(widths) < 128


def test_an_unknown_attention_is_refused():
    with pytest.raises(ValueError, match="attention must be sdpa or packed"):
        Dream(model="random", attention="flash")


# -- loading -----------------------------------------------------------------------------------
LLADA_NAMES = {
    "model.embed_tokens.": "model.transformer.wte.",
    "model.norm.": "model.transformer.ln_f.",
    "lm_head.": "model.transformer.ff_out.",
    "self_attn.o_proj.": "attn_out.",
    "self_attn.q_proj.": "q_proj.",
    "self_attn.k_proj.": "k_proj.",
    "self_attn.v_proj.": "v_proj.",
    "mlp.gate_proj.": "ff_proj.",
    "mlp.up_proj.": "up_proj.",
    "mlp.down_proj.": "ff_out.",
    "input_layernorm.": "attn_norm.",
    "post_attention_layernorm.": "ff_norm.",
}


def as_llada(state):
    """Write a Llama state dict under LLaDA's own key names."""
    out = {}
    for key, value in state.items():
        new = key
        if key.startswith("model.layers."):
            _, _, n, rest = key.split(".", 3)
            for llama, llada in LLADA_NAMES.items():
                if rest.startswith(llama):
                    new = f"model.transformer.blocks.{n}.{llada}{rest[len(llama) :]}"
        else:
            for llama, llada in LLADA_NAMES.items():
                if key.startswith(llama):
                    new = llada + key[len(llama) :]
        assert new != key
        out[new] = value
    return out


def test_llada_keys_rename_and_load_strictly_into_llama():
    src = LLaDA(model="random", seed=5).transformer
    llada_state = as_llada(src.state_dict())
    assert all(k.startswith("model.transformer.") for k in llada_state)
    target = LLaDA(model="random", seed=9).transformer
    load_strict(target, rename_llada_keys(llada_state), "synthetic")
    for key, value in src.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)
    with pytest.raises(UserError, match="unexpected key"):
        rename_llada_keys({**llada_state, "model.transformer.extra.weight": torch.zeros(1)})
    missing = rename_llada_keys(llada_state)
    missing.pop("lm_head.weight")
    with pytest.raises(UserError, match=r"missing \['lm_head.weight'\]"):
        load_strict(target, missing, "synthetic")


def qwen_config_json(bb, **fields):
    """config.json of a Qwen-shaped checkpoint of `bb`'s model, with the model's own `fields`
    (its architectures, model_type, ...)."""
    c = bb.transformer.config
    return {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_parameters["rope_theta"],
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": False,
        **fields,
    }


def save_dream(bb, path):
    raw = qwen_config_json(
        bb, architectures=["DreamModel"], model_type="Dream", mask_token_id=bb.mask_id
    )
    (path / "config.json").write_text(json.dumps(raw))
    save_file(
        {k: v.contiguous() for k, v in bb.transformer.state_dict().items()},
        str(path / "model.safetensors"),
    )
    bb.tokenizer.save_pretrained(str(path))


def save_llada(bb, path, with_mask=True):
    c = bb.transformer.config
    raw = {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": c.hidden_size,
        "mlp_hidden_size": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "vocab_size": c.vocab_size,
        "embedding_size": c.vocab_size,
        "rope_theta": c.rope_parameters["rope_theta"],
        "rms_norm_eps": c.rms_norm_eps,
        "weight_tying": False,
        "max_sequence_length": 2048,
    }
    if with_mask:
        raw["mask_token_id"] = bb.mask_id
    (path / "config.json").write_text(json.dumps(raw))
    save_file(
        as_llada({k: v.contiguous() for k, v in bb.transformer.state_dict().items()}),
        str(path / "model.safetensors"),
    )
    bb.tokenizer.save_pretrained(str(path))


@pytest.mark.parametrize("cls,save", [(Dream, save_dream), (LLaDA, save_llada)])
def test_local_checkpoint_loads_into_the_native_class(tmp_path, cls, save):
    src = cls(model="random", seed=11)
    save(src, tmp_path)
    loaded = cls(model=str(tmp_path))
    assert type(loaded.transformer) is type(src.transformer)
    assert loaded.transformer.config.is_causal is False
    assert loaded.mask_id == src.mask_id
    ids = torch.randint(0, 50, (2, 12))
    attn = torch.ones_like(ids)
    torch.testing.assert_close(loaded.logits(ids, attn), src.logits(ids, attn))
    prompt = Prompt(messages=({"role": "user", "content": "2+2="},))
    assert loaded.encode(prompt) == src.encode(prompt)


def test_checkpoint_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        Dream(model=str(tmp_path / "nowhere"))
    src = LLaDA(model="random")
    save_llada(src, tmp_path, with_mask=False)
    tok = json.loads((tmp_path / "tokenizer_config.json").read_text())
    tok.pop("mask_token", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok))
    special = (
        json.loads((tmp_path / "special_tokens_map.json").read_text())
        if (tmp_path / "special_tokens_map.json").exists()
        else {}
    )
    special.pop("mask_token", None)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(special))
    loaded = LLaDA(model=str(tmp_path))  # "<|mask|>" is still a known mask token name
    assert loaded.mask_id == src.mask_id
    wrong = LLaDA(model="random").transformer.state_dict()
    wrong["model.layers.0.extra.weight"] = torch.zeros(1)
    save_file({k: v.contiguous() for k, v in wrong.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="unexpected key"):
        LLaDA(model=str(tmp_path))


def test_decode_stops_at_the_first_end_token_and_marks_interior_masks():
    bb = Dream(model="random")
    ids = bb.tokenizer("ab")["input_ids"]
    eos, end = bb.tokenizer.eos_token_id, bb.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def text(*parts):
        return bb.tokenizer("".join(parts))["input_ids"]

    m = bb.mask_id
    tokens = torch.tensor([*ids, *text("4"), m, *text("2"), end, *text("9"), eos])
    assert bb.decode(tokens, len(ids)) == "4<|mask|>2"
    # "12<mask>5" is not "125": one marker per run of interior masks; ends dropped
    tokens = torch.tensor([*ids, m, m, *text("12"), m, m, *text("5"), m, eos, *text("7")])
    assert bb.decode(tokens, len(ids)) == "12<|mask|>5"
    assert bb.decode(torch.tensor([*ids, *text("125"), m]), len(ids)) == "125"
    assert bb.decode(torch.tensor([*ids, m, m]), len(ids)) == ""


def test_cfg_costs_two_passes_per_row_step():
    from dllmbench.execution.engine import Engine, Sampling
    from dllmbench.execution.method import Method, MethodSpec
    from dllmbench.loading.registry import registry
    from dllmbench.testing.doubles import ToySum

    task = ToySum(size=2)
    bb = LLaDA(model="random", cfg_scale=1.0)
    method = Method.build(registry(), MethodSpec.parse("independent:n=2+first"))
    eng = Engine(
        backbone=bb, scorers={}, task=task, methods=[method], sampling=Sampling(4, 4, "fewshot", 0)
    )
    records = eng.run(task.problems("test"))
    assert all(r["ledger"]["passes"] == {"denoise": 2 * 2 * 4} for r in records)
