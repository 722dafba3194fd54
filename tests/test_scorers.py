"""PRM and ORM: shared weights, attention modes, pooling, strict checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllmbench.api.interfaces import (
    ScoreBatch,
    TrainableScorer,
    TransformerBackbone,
    missing_members,
)
from dllmbench.core.errors import PluginError, UserError
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.dream import Dream
from dllmbench.plugins.backbones.llada import LLaDA
from dllmbench.plugins.backbones.tiny import TINY_DIR
from dllmbench.plugins.scorers.adapters import adapter_names, adapter_parameters
from dllmbench.plugins.scorers.heads import pool, region
from dllmbench.plugins.scorers.reward import ORM, PRM, read_checkpoint
from dllmbench.testing.doubles import ToyBackbone


def canvases(bb, n=3, gen=6):
    out = []
    for i in range(n):
        ids = bb.encode(Prompt(text=f"{i}+{i * 7}="))
        canvas = bb.canvas(ids, gen)
        canvas[len(ids) : len(ids) + i + 1] = torch.tensor(
            bb.tokenizer(str(i) * (i + 1))["input_ids"]
        )
        out.append((canvas, len(ids)))
    return out


def batch(rows):
    return ScoreBatch([c for c, _ in rows], [p for _, p in rows], [0] * len(rows), 8)


def test_region_excludes_masks_and_everything_from_the_first_end_token():
    M, E = 99, 98
    ids = torch.tensor([[5, 5, 7, M, 8, E, 9, 9], [1, 5, M, M, M, M, M, M]])
    inside, ratio = region(ids, torch.tensor([2, 2]), M, {E}, mask_aware=True)
    assert inside[0].nonzero().flatten().tolist() == [2, 4]
    assert inside[1].sum() == 0
    assert ratio.tolist() == pytest.approx([1 / 6, 1.0])
    inside, _ = region(ids, torch.tensor([2, 2]), M, {E}, mask_aware=False)
    assert inside[0].nonzero().flatten().tolist() == [2, 3, 4]


def test_mean_and_last_pooling_read_the_right_positions():
    hidden = torch.arange(2 * 5 * 1, dtype=torch.float).view(2, 5, 1)
    inside = torch.tensor([[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    fallback = torch.tensor([0, 2])
    assert pool(hidden, inside, fallback, "mean").flatten().tolist() == [2.0, 7.0]
    assert pool(hidden, inside, fallback, "last").flatten().tolist() == [3.0, 7.0]


def test_scorers_share_the_frozen_backbone_and_leave_it_untouched():
    bb = Dream(model="random")
    ids, attn, _ = bb.pad([c for c, _ in canvases(bb)])
    before = bb.logits(ids, attn)
    prm, orm = PRM(backbone=bb), ORM(backbone=bb)
    assert prm.net is bb.transformer and orm.net is bb.transformer
    assert adapter_names(bb.transformer) == {prm.adapter, orm.adapter}
    prm.score(batch(canvases(bb)))
    torch.testing.assert_close(bb.logits(ids, attn), before)  # adapters are off again
    assert not any(p.requires_grad for p in bb.transformer.parameters())


def test_training_moves_only_the_trained_scorers_adapter_and_head():
    bb = Dream(model="random")
    prm, orm = PRM(backbone=bb), ORM(backbone=bb)
    base = {k: p.clone() for k, p in bb.transformer.named_parameters() if "lora_" not in k}
    other = {k: p.clone() for k, p in adapter_parameters(orm.net, orm.adapter).items()}
    mine = {k: p.clone() for k, p in adapter_parameters(prm.net, prm.adapter).items()}
    opt = torch.optim.AdamW(prm.trainable(), lr=1e-2)
    prm.train_mode(True)
    rows = canvases(bb)
    z = prm.logits([c for c, _ in rows], [p for _, p in rows])
    torch.nn.functional.binary_cross_entropy_with_logits(
        z, torch.tensor([1.0, 0.0, 1.0])
    ).backward()
    opt.step()
    prm.train_mode(False)
    after = adapter_parameters(prm.net, prm.adapter)
    assert all(after[k].grad is not None for k in mine)  # every LoRA matrix got a gradient
    assert any(not torch.equal(after[k], mine[k]) for k in mine if "lora_B" in k)
    for k, p in adapter_parameters(orm.net, orm.adapter).items():
        torch.testing.assert_close(p, other[k])
    for k, p in bb.transformer.named_parameters():
        if "lora_" not in k:
            torch.testing.assert_close(p, base[k])
    assert not any(p.requires_grad for p in bb.transformer.parameters())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_adapter_trains_in_float32_on_a_half_precision_base(dtype):
    """On a bfloat16 (a GPU's default) or float16 base, the adapter is float32: one AdamW step
    at train-scorer's learning rate moves every entry of every lora_A (in the base's dtype,
    most such steps round away), and scoring still gives the base's dtype's forward."""
    bb = Dream(model="random", dtype=dtype)
    prm = PRM(backbone=bb)
    mine = adapter_parameters(prm.net, prm.adapter)
    assert {p.dtype for p in mine.values()} == {torch.float32}
    assert {p.dtype for k, p in bb.transformer.named_parameters() if "lora_" not in k} == {
        getattr(torch, dtype)
    }
    before = {k: p.clone() for k, p in mine.items()}
    opt = torch.optim.AdamW(prm.trainable(), lr=2e-5)
    prm.train_mode(True)
    rows = canvases(bb)
    z = prm.logits([c for c, _ in rows], [p for _, p in rows])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        z.float(), torch.tensor([1.0, 0.0, 1.0])
    )
    loss.backward()
    opt.step()
    prm.train_mode(False)
    for k, p in mine.items():
        if "lora_A" in k:
            assert bool((p != before[k]).all()), k
    assert all(math.isfinite(s) for s in prm.score(batch(rows)))


def test_bidirectional_and_causal_attention_really_differ():
    bb = Dream(model="random")
    rows = canvases(bb)
    bi = PRM(backbone=bb, seed=1).score(batch(rows))
    causal = PRM(backbone=bb, seed=1, attention="causal").score(batch(rows))
    assert abs(bi - causal).max() > 1e-4


@pytest.mark.parametrize("cls", [PRM, ORM])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scores_do_not_depend_on_batch_composition(cls, dtype):
    """A row is scored at its own width: alone and beside a much longer row it scores the
    same but for the matmul's own rounding (1e-5 apart when rows were padded to the widest of
    their batch; a search pruning on near-equal scores must not decide by its batch)."""
    bb = LLaDA(model="random", dtype=dtype)
    scorer = cls(backbone=bb, pooling="last")
    rows = canvases(bb, 4)
    long = bb.encode(Prompt(text="1234567890+1234567890+1234567890+1234567890="))
    rows.append((bb.canvas(long, 6), len(long)))
    together = scorer.score(batch(rows))
    alone = [scorer.score(batch([r]))[0] for r in rows]
    assert together == pytest.approx(alone, rel=1e-6, abs=1e-6)


def test_step_embedding_changes_the_score_with_the_mask_ratio():
    bb = Dream(model="random")
    prm = PRM(backbone=bb)
    ((canvas, plen),) = canvases(bb, 1)
    fuller = canvas.clone()
    fuller[plen + 1 :] = bb.tokenizer("7")["input_ids"][0]
    a, b = prm.score(batch([(canvas, plen), (fuller, plen)]))
    assert a != b
    assert ORM(backbone=bb).reads_partial is False and prm.reads_partial is True


@pytest.fixture()
def saved(tmp_path):
    bb = Dream(model="random")
    prm = PRM(backbone=bb, seed=4)
    with torch.no_grad():
        for p in prm.trainable():
            p.add_(0.01 * torch.randn_like(p))
    prm.save(tmp_path / "prm")
    return bb, prm, tmp_path / "prm"


def test_a_checkpoint_is_readable_as_the_umask_allows(saved):
    """safetensors writes its files owner-only: a scorer trained on a shared machine would be
    unreadable by the team. Its files get the mode any file the user writes gets."""
    import os
    import stat

    from dllmbench.core.tensorfile import umask

    _, _, path = saved
    expected = 0o666 & ~umask()
    for name in ("adapter.safetensors", "head.safetensors"):
        assert stat.S_IMODE(os.stat(path / name).st_mode) == expected, name


def test_the_umask_is_read_without_setting_it(monkeypatch):
    """Reading the umask by setting it and setting it back would give a file another thread
    creates in between the mode 022 allows; on Linux it is read from /proc instead."""
    import os

    from dllmbench.core.tensorfile import umask

    before = os.umask(0o027)
    try:
        if os.path.exists("/proc/self/status"):
            monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("umask was set"))
        assert umask() == 0o027
    finally:
        monkeypatch.undo()
        os.umask(before)


def test_checkpoint_round_trips(saved):
    bb, prm, path = saved
    loaded = PRM(backbone=bb, checkpoint=str(path))
    rows = canvases(bb)
    assert loaded.trained and not prm.trained
    assert loaded.score(batch(rows)) == pytest.approx(prm.score(batch(rows)), abs=1e-6)
    assert json.loads((path / "config.json").read_text())["pooling"] == "mean"


def test_the_output_folder_of_train_scorer_names_its_checkpoint(saved, tmp_path):
    """Given train-scorer's --out (its checkpoints in best/ and latest/), the line names the
    checkpoint to give."""
    bb, _, path = saved
    out = tmp_path / "trained"
    out.mkdir()
    path.rename(out / "best")
    with pytest.raises(UserError, match=rf"has no config.json; .* checkpoint={out / 'best'}$"):
        PRM(backbone=bb, checkpoint=str(out))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"has no config.json$"):
        PRM(backbone=bb, checkpoint=str(empty))


@pytest.mark.parametrize("name", ["dream", "llada", "tiny", "tiny-block"])
def test_the_base_identity_is_the_same_in_every_dtype_and_differs_for_another_model(name):
    """A scorer follows its model, not the dtype or device it runs in: the identity is equal
    in float32, bfloat16 and float16, and another model's (another seed) differs."""
    from dllmbench.loading.registry import registry
    from dllmbench.plugins.scorers.reward import base_model_digest

    options = {"model": "random"} if name in ("dream", "llada") else {}
    digests = {
        dtype: base_model_digest(registry().backbone(name, dtype=dtype, **options).transformer)
        for dtype in ("float32", "bfloat16", "float16")
    }
    assert len(set(digests.values())) == 1, digests
    other = registry().backbone(name, **{"model": "random", "seed": 1, **options})
    assert base_model_digest(other.transformer) != digests["float32"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_scorer_saved_in_float32_loads_and_scores_in_another_dtype(saved, dtype):
    bb, prm, path = saved
    other = Dream(model="random", dtype=dtype)
    loaded = PRM(backbone=other, checkpoint=str(path))
    assert loaded.trained
    rows = canvases(bb)
    want = prm.score(batch(rows))
    got = loaded.score(batch(rows))
    assert got == pytest.approx(want, abs=0.05 * max(1.0, float(abs(want).max())))


def _rewrite(path, name, change):
    tensors = load_file(str(path / name))
    change(tensors)
    save_file(tensors, str(path / name))


@pytest.mark.parametrize(
    "breakage,needle",
    [
        (
            lambda p: _rewrite(p, "head.safetensors", lambda t: t.pop("mlp.0.weight")),
            "missing ['mlp.0.weight']",
        ),
        (
            lambda p: _rewrite(
                p,
                "adapter.safetensors",
                lambda t: t.__setitem__("extra.lora_A.weight", torch.zeros(1)),
            ),
            "unexpected ['extra.lora_A.weight']",
        ),
        (
            lambda p: _rewrite(
                p, "head.safetensors", lambda t: t.__setitem__("mlp.2.weight", torch.zeros(1, 7))
            ),
            "has shape (1, 7)",
        ),
        (lambda p: (p / "head.safetensors").unlink(), "no head.safetensors"),
    ],
)
def test_checkpoint_that_does_not_fit_raises_naming_the_keys(saved, breakage, needle):
    bb, _, path = saved
    breakage(path)
    with pytest.raises(UserError) as err:
        PRM(backbone=bb, checkpoint=str(path))
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"pooling": "last"}, "trained with pooling='mean', not 'last'"),
        ({"attention": "causal"}, "trained with attention='bidirectional', not 'causal'"),
        ({"lora_r": 8}, "trained with lora_r=16, not 8"),
    ],
)
def test_checkpoint_settings_must_match(saved, options, needle):
    bb, _, path = saved
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        PRM(backbone=bb, checkpoint=str(path), **options)


def test_checkpoint_on_another_base_model_or_kind_raises(saved):
    _, _, path = saved
    with pytest.raises(UserError, match="another base model"):
        PRM(backbone=Dream(model="random", seed=1), checkpoint=str(path))
    with pytest.raises(UserError, match="is a 'prm' checkpoint, not a 'orm' one"):
        ORM(backbone=saved[0], checkpoint=str(path))


def test_a_scorer_needs_a_transformer_backbone():
    with pytest.raises(PluginError, match=r"implementing dllmbench\.interfaces\.TransformerBack"):
        PRM()
    with pytest.raises(PluginError, match=r"TransformerBackbone \(dream, llada\), not ToyBackbone"):
        PRM(backbone=ToyBackbone())


@pytest.mark.parametrize("backbone", [Dream, LLaDA])
def test_the_reward_scorers_meet_their_protocols(backbone):
    bb = backbone(model="random")
    assert isinstance(bb, TransformerBackbone) and missing_members(bb, TransformerBackbone) == []
    scorer = ORM(backbone=bb)
    assert isinstance(scorer, TrainableScorer) and not scorer.trained


# -- pool_stop: where the pooled region ends ----------------------------------------------------


def _turn_then_eos(bb) -> tuple[torch.Tensor, int, list[int]]:
    """A canvas: prompt, two tokens, a turn end, two tokens, EOS, masks; and the four tokens'
    positions."""
    eos = bb.tokenizer.eos_token_id
    (turn,) = set(bb.stop_ids) - {eos}
    ids = bb.encode(Prompt(text="1+2="))
    plen = len(ids)
    a, b, c, d = (bb.tokenizer(ch)["input_ids"][0] for ch in "5678")
    canvas = bb.canvas(ids, 8)
    canvas[plen : plen + 6] = torch.tensor([a, b, turn, c, d, eos])
    return canvas, plen, [plen, plen + 1, plen + 3, plen + 4]


@pytest.mark.parametrize("backbone", [Dream, LLaDA])
def test_pool_stop_eos_pools_past_a_turn_end_up_to_the_first_eos(backbone):
    bb = backbone(model="random")
    canvas, plen, _ = _turn_then_eos(bb)
    turn, eos = PRM(backbone=bb, seed=1), PRM(backbone=bb, seed=1, pool_stop="eos")
    assert turn.settings["pool_stop"] == "turn" and eos.settings["pool_stop"] == "eos"
    assert eos.stop_ids() == {bb.tokenizer.eos_token_id} and turn.stop_ids() == bb.stop_ids
    start = torch.tensor([plen])
    inside_turn, _ = region(canvas[None], start, bb.mask_id, turn.stop_ids(), True)
    inside_eos, _ = region(canvas[None], start, bb.mask_id, eos.stop_ids(), True)
    assert inside_turn[0].nonzero().flatten().tolist() == [plen, plen + 1]
    assert inside_eos[0].nonzero().flatten().tolist() == list(range(plen, plen + 5))
    # the same adapter and head (same seed): only the pooled region differs
    assert (
        abs(turn.score(batch([(canvas, plen)]))[0] - eos.score(batch([(canvas, plen)]))[0]) > 1e-6
    )
    plain = canvas.clone()
    plain[plen + 2] = plain[plen]  # no turn end before the EOS: both stop at the EOS
    assert turn.score(batch([(plain, plen)]))[0] == pytest.approx(
        eos.score(batch([(plain, plen)]))[0], abs=1e-6
    )
    orm_turn = ORM(backbone=bb, seed=1, pooling="last")
    orm_eos = ORM(backbone=bb, seed=1, pooling="last", pool_stop="eos")
    assert orm_turn.score(batch([(canvas, plen)]))[0] != orm_eos.score(batch([(canvas, plen)]))[0]


def test_pool_stop_is_saved_with_a_checkpoint_and_enforced(tmp_path):
    bb = Dream(model="random")
    prm = PRM(backbone=bb, seed=2, pool_stop="eos")
    prm.save(tmp_path / "eos")
    assert json.loads((tmp_path / "eos" / "config.json").read_text())["pool_stop"] == "eos"
    loaded = PRM(backbone=bb, checkpoint=str(tmp_path / "eos"))
    assert loaded.settings["pool_stop"] == "eos"
    rows = [_turn_then_eos(bb)[:2]]
    assert loaded.score(batch(rows)) == pytest.approx(prm.score(batch(rows)), abs=1e-6)
    with pytest.raises(UserError, match="trained with pool_stop='eos', not 'turn'"):
        PRM(backbone=bb, checkpoint=str(tmp_path / "eos"), pool_stop="turn")


def test_a_checkpoint_saved_before_pool_stop_loads_with_turn(tmp_path):
    bb = Dream(model="random")
    PRM(backbone=bb, seed=3).save(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["pool_stop"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    assert PRM(backbone=bb, checkpoint=str(tmp_path / "old")).settings["pool_stop"] == "turn"
    with pytest.raises(UserError, match="trained with pool_stop='turn', not 'eos'"):
        PRM(backbone=bb, checkpoint=str(tmp_path / "old"), pool_stop="eos")
    # the shipped demo checkpoints record the option, as every new checkpoint does
    for kind in ("prm", "orm"):
        shipped = TINY_DIR / kind
        assert json.loads((shipped / "config.json").read_text())["pool_stop"] == "turn"
        assert read_checkpoint(shipped, kind)["pool_stop"] == "turn"


def test_a_reward_scorer_on_a_backbone_without_its_target_modules_is_one_line_then_runs():
    """A masked LM's backbone (a BertForMaskedLM: `query`, `value`, no `q_proj`, no `.model`):
    the default target_modules was peft's own error, blamed on the scorer as its bug (exit
    status 3); named as the model names them, the scorer reads hidden states through the
    transformer's body, `base_model`, where it called `.model` (an AttributeError)."""
    from test_plugin_reach import BertBodied

    backbone = BertBodied()
    with pytest.raises(UserError, match=r"target_modules \['q_proj', 'v_proj'\]; its linear "):
        ORM(backbone=backbone)
    orm = ORM(backbone=backbone, target_modules="query+value")
    rows = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([3, 2, 1])]
    values = orm.logits(rows, [2, 1])
    assert values.shape == (2,) and torch.isfinite(values).all()
    assert adapter_names(backbone.transformer) == {orm.adapter}
