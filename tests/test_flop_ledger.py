"""The FLOP ledger: one formula, charged where forwards happen, checked against hand counts;
caps refused as they are spent; the families that came before decide and spend as before."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import DEMO_PROBLEMS, assert_user_error
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

from dllmbench.cli import main
from dllmbench.cli.argtypes import budgets
from dllmbench.core.errors import OverCap
from dllmbench.core.flops import Flops, ModelShape, Work, flops, format_flops, shape_of
from dllmbench.core.ledger import Ledger
from dllmbench.demo import TASK_CONFIG, TINY_DIR
from dllmbench.execution import engine
from dllmbench.plugins.backbones import base
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.methods import FAMILIES
from dllmbench.plugins.scorers.reward import RewardScorer
from dllmbench.plugins.scorers.self_verify import SelfVerify
from dllmbench.storage.rundir import RunDir
from dllmbench.tasks.arith import Arith

FIXTURE = Path(__file__).parent / "fixtures" / "demo30_decisions.json.gz"


# -- the formula --------------------------------------------------------------------------------


def test_the_formula_on_a_row_worked_by_hand():
    shape = ModelShape(params=1_000, head=50, layers=3, width=8)
    # 10 query tokens, each attending 10 keys, the head read at 4 positions
    assert flops(shape, Work.full(10, head=4)) == 2 * 1_000 * 10 + 2 * 50 * 4 + 4 * 3 * 8 * 100
    # causal: query i attends keys 0..i, 1 + 2 + ... + 10 = 55
    assert Work.causal(10).attended == 55
    # a cached block: 4 queries over 20 cached keys and themselves
    assert flops(shape, Work(4, 4 * 24, 0)) == 2 * 1_000 * 4 + 4 * 3 * 8 * 96
    assert format_flops(2.1e15) == "2.1 PFLOP" and format_flops(None) == "–"


def _qwen2(hidden: int, width: int, attention: str = "sdpa") -> Qwen2ForCausalLM:
    """A small random Qwen2 of 2 layers, 4 heads (2 key-value heads), vocabulary 50."""
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=hidden,
        intermediate_size=width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).eval()


def test_shape_of_counts_every_matmul_weight_but_the_embedding_and_adapters():
    from peft import LoraConfig, inject_adapter_in_model

    model = _qwen2(32, 48)
    kv = 2 * (32 // 4)  # two kv heads of dimension 8
    layer = 32 * 32 + 2 * 32 * kv + 32 * 32 + 3 * 32 * 48  # q, k and v, o, MLP
    expected = ModelShape(params=2 * layer, head=50 * 32, layers=2, width=32)
    assert shape_of(model) == expected
    # a scorer's LoRA computes only while it scores: the backbone's shape leaves it out
    inject_adapter_in_model(LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), model)
    assert shape_of(model) == expected


def test_the_formula_equals_pytorchs_own_count_of_a_forward():
    """torch.utils.flop_counter counts every matmul of a forward (eager attention, so that QKᵀ
    and AV are matmuls it sees): a batch of rows costs what the formula says."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _qwen2(64, 96, attention="eager")
    ids = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    assert counter.get_total_flops() == 3 * flops(shape_of(model), Work.full(20))


def test_a_flop_budget_is_spelt_with_its_unit_and_never_mixed():
    assert budgets("2.1e15flops") == Flops(2_100_000_000_000_000)
    assert isinstance(budgets("1e9FLOPS,2e9flops")[1], Flops)
    assert budgets("1040") == 1040 and not isinstance(budgets("1040"), Flops)
    with pytest.raises(Exception, match="one unit"):
        budgets("1040,2e9flops")
    with pytest.raises(Exception, match=r"e\.g\. 2\.1e15flops"):
        budgets("manyflops")


def test_flop_budget_mistakes_are_one_line(cli, tmp_path):
    out = tmp_path / "run"
    too_small = cli("run", "--limit", "1", "--budget", "1e3flops", "--out", out)
    assert_user_error(too_small, "no method fits", "does not fit 1 kFLOP", "at least 2.81 GFLOP")
    # a budget of passes below every family's smallest size too, not a strategy's own refusal
    below = cli("run", "--limit", "1", "--budget", "1", "--out", tmp_path / "other")
    assert_user_error(below, "no method fits", "prism: does not fit 1 passes; needs a budget")
    assert_user_error(cli("plan", "--budget", "1e9flops"), "needs --task and --backbone")
    assert_user_error(cli("plan", "--budget", "1040,1e9flops"), "mixes passes and FLOPs")


def test_plan_prices_a_flop_budget_and_shows_what_is_unused(cli):
    argv = ["plan", "--budget", "1.5e10flops", "--task", "arith", "--backbone", "tiny"]
    argv += ["--steps", "24", "--gen-length", "32", "--prompt", "fewshot", "--json"]
    result = cli(*argv, "--methods", "vanilla,majority,threshold")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert plan["unit"] == "flops" and set(plan["rates"]) == {
        "denoise",
        "score:orm",
        "score:prm",
        "score:self",
    }
    by_id = {m["family"]: m for m in plan["methods"]}
    rate = plan["rates"]["denoise"]
    for m in by_id.values():
        assert m["flops"] == m["passes"] * rate <= 1.5e10
        assert m["unused"] == 15_000_000_000 - m["flops"]
    # the largest size that fits: one more sample would not
    assert (by_id["majority"]["passes"] + 24) * rate > 1.5e10
    assert by_id["threshold"]["capped"] and not by_id["majority"]["capped"]


SCORERS_OF_ANY_SHAPE = """
from dllmbench.api.hookspecs import hookimpl
from dllmbench.flops import ModelShape
from dllmbench.testing.doubles import ToyScorer


class Shapeless(ToyScorer):
    model_shape = None  # a model it does not describe: its FLOPs are unknown


class NoModel(ToyScorer):
    model_shape = ModelShape(params=0, head=0, layers=0, width=0)  # a rule: no FLOPs


@hookimpl
def dllmbench_register_scorers(register):
    register("shapeless", Shapeless)
    register("no_model", NoModel)
"""


def test_a_flop_budget_leaves_out_what_it_cannot_price_and_prices_a_rule_at_zero(
    cli, tmp_path, monkeypatch, registry_with
):
    """A method whose scorer says no model shape has unknown FLOPs: a FLOP budget leaves it
    out with the reason (named, it is one line), never prices its passes at zero; a scorer
    whose shape is all zeros (a rule, no model) costs no FLOPs and is planned."""
    (tmp_path / "any_shape_scorers.py").write_text(SCORERS_OF_ANY_SHAPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_with("any_shape_scorers")
    argv = ["plan", "--task", "toy_sum", "--backbone", "toy", "--steps", "8", "--gen-length", "5"]
    argv += ["--budget", "1e7flops"]
    unknown = cli(*argv, "--scorer", "orm=shapeless", "--json")  # every family
    assert unknown.code == 0, unknown.err
    plan = json.loads(unknown.out)
    left = {m["family"]: m["reason"] for m in plan["left_out"]}
    assert "unknown FLOPs" in left["orm_rerank"] and "vanilla" not in left, left
    assert "orm_rerank" not in {m["family"] for m in plan["methods"]}
    named = cli(*argv, "--methods", "vanilla,orm_rerank", "--scorer", "orm=shapeless")
    assert_user_error(named, "method 'orm_rerank'", "unknown FLOPs", "give the budget in passes")
    free = cli(*argv, "--methods", "vanilla,orm_rerank", "--scorer", "orm=no_model", "--json")
    plan = json.loads(free.out)
    rerank = next(m for m in plan["methods"] if m["family"] == "orm_rerank")
    assert plan["rates"]["score:orm"] == 0
    assert rerank["flops"] == rerank["cost"]["denoise"] * plan["rates"]["denoise"] > 0


# -- the ledger ---------------------------------------------------------------------------------


def test_a_capped_method_is_refused_the_charge_that_passes_its_cap():
    ledger = Ledger()
    ledger.cap("adaptive", {"denoise": 10}, "adaptive")
    ledger.charge("p", [("adaptive", "exact")], "denoise", 6, 600)
    ledger.check("p", "adaptive", {"denoise": 10})  # under its cap: fine
    with pytest.raises(OverCap, match=r"strategy 'adaptive'.*over its cap \{'denoise': 10\}"):
        ledger.charge("p", [("adaptive", "exact")], "denoise", 5, 500)
    entry = ledger.entry("p", "exact")
    assert entry["passes"] == {"denoise": 6} and entry["flops"] == {"denoise": 600}


def test_flops_of_a_model_without_a_shape_are_unknown_not_zero():
    ledger = Ledger()
    ledger.charge("p", [("m",)], "denoise", 1, 100)
    ledger.charge("p", [("m",)], "score:x", 1, None)
    entry = ledger.entry("p", "m")
    assert entry["total_flops"] is None and entry["flops"] == {"denoise": 100}


# -- the demo, counted by hand ------------------------------------------------------------------

DEMO_FLOPS = "1.5e10flops"


def _tiny() -> dict:
    return json.loads((TINY_DIR / "config.json").read_text())


def _lora(kind: str, hidden: int, width: int, layers: int) -> int:
    """A scorer's LoRA parameters by hand: r × (in + out) of each adapted projection."""
    saved = json.loads((TINY_DIR / kind / "config.json").read_text())
    sizes = {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, hidden),
        "v_proj": (hidden, hidden),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, width),
        "up_proj": (hidden, width),
        "down_proj": (width, hidden),
    }
    modules = saved["target_modules"].split(",")
    return layers * sum(saved["lora_r"] * sum(sizes[m]) for m in modules)


def _readout(kind: str, hidden: int) -> int:
    """A scorer's head weights by hand (PRMHead, ORMHead)."""
    saved = json.loads((TINY_DIR / kind / "config.json").read_text())
    if kind == "orm":
        return hidden
    width, step = saved["head_width"], 256 if saved["step_embedding"] else 0
    return (256 * 256 if step else 0) + (hidden + step) * width + width


def _observe(monkeypatch) -> Counter[str]:
    """Observe every forward of the tiny transformer (its rows' real lengths), every
    application of the LM head (its positions), of a scorer's readout and of the
    self-verifier's head row, and count their FLOPs by hand from the tiny model's
    config.json (2·P·tokens + 2·P_head·head positions + 4·layers·width·Σ keys) into the
    returned counter's "flops"."""
    c = _tiny()
    hidden, width, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    body = layers * (4 * hidden * hidden + 3 * hidden * width)  # q, k, v, o and the MLP
    lm_head = c["vocab_size"] * hidden
    scoring: list[str | None] = [None]  # the reward scorer whose adapter is on, if any
    counted = Counter[str]()
    last_mask: list[torch.Tensor] = []  # the attention mask of the latest forward

    forward = modeling_qwen2.Qwen2Model.forward

    def observed_forward(self, *args, **kwargs):
        mask = kwargs["attention_mask"]  # None: a batch without padding
        if mask is None:
            mask = torch.ones_like(kwargs["input_ids"])
        lengths = mask.sum(-1).tolist()
        adapter = _lora(scoring[0], hidden, width, layers) if scoring[0] else 0
        causal = kwargs.get("is_causal") is True
        keys = sum(n * (n + 1) // 2 if causal else n * n for n in lengths)
        counted["flops"] += 2 * (body + adapter) * sum(lengths) + 4 * layers * hidden * keys
        last_mask[:] = [mask]
        return forward(self, *args, **kwargs)

    head = DiffusionBackbone.head

    def observed_head(self, states):
        # [B, L, H]: the head over whole padded rows (pads not counted); [M, H]: the
        # positions the sampler reads
        positions = int(last_mask[0].sum()) if states.dim() == 3 else states.shape[0]
        counted["flops"] += 2 * lm_head * positions
        return head(self, states)

    logits = RewardScorer.logits

    def observed_logits(self, tokens, prompt_lens, width=None):
        scoring[0] = self.kind
        try:
            out = logits(self, tokens, prompt_lens, width)
        finally:
            scoring[0] = None
        counted["flops"] += 2 * _readout(self.kind, hidden) * len(tokens)
        return out

    verdicts = SelfVerify.verdicts

    def observed_verdicts(self, states):
        # the self-verifier's one head row (Yes − No) at each row's last position
        counted["flops"] += 2 * hidden * states.shape[0]
        return verdicts(self, states)

    monkeypatch.setattr(modeling_qwen2.Qwen2Model, "forward", observed_forward)
    monkeypatch.setattr(DiffusionBackbone, "head", observed_head)
    monkeypatch.setattr(RewardScorer, "logits", observed_logits)
    monkeypatch.setattr(SelfVerify, "verdicts", observed_verdicts)
    return counted


@pytest.mark.slow
@pytest.mark.parametrize("family", [name for name, _, _ in FAMILIES])
def test_recorded_flops_equal_a_hand_count_of_what_the_model_computed(
    family, tmp_path, monkeypatch
):
    """Each family alone on the demo's first problem at a FLOP budget, its forwards observed
    and counted by hand (`_observe`): the record's FLOPs must agree within 0.1%. Rows that
    are one computation, and rows of one canvas, are computed once each here (the engine and
    the backbone otherwise compute them once and charge every row as if it ran alone)."""
    counted = _observe(monkeypatch)
    # computing each row makes what runs what is charged
    monkeypatch.setattr(engine, "_identical", lambda rows: [[n] for n, _ in enumerate(rows)])
    monkeypatch.setattr(base, "distinct_rows", _every_row)
    out = tmp_path / "run"
    argv = ["run", "--limit", "1", "--budget", DEMO_FLOPS, "--methods", family, "--out", out]
    assert main([*map(str, argv), "--json"]) == 0
    (record,) = [json.loads(line) for line in (out / "samples.jsonl").open()]
    recorded = record["ledger"]["total_flops"]
    assert recorded == pytest.approx(counted["flops"], rel=1e-3), (family, record["ledger"])


def _every_row(rows) -> tuple[list[int], list[int]]:
    """`distinct_rows` that calls every row distinct."""
    every = list(range(len(rows)))
    return every, every


@pytest.mark.slow
def test_physical_flops_count_each_canvas_once_as_the_model_computed_it(tmp_path, monkeypatch):
    """Families whose rows share canvases (every row of a problem starts from the same one;
    resampling copies a particle's canvas to its children; an ensemble steps one canvas at
    several settings) on the demo's first problem: compute.json's physical FLOPs equal a
    hand count of the forwards the model ran (`_observe`), and are well below the FLOPs
    charged, which count every row as if it ran alone."""
    counted = _observe(monkeypatch)
    out = tmp_path / "run"
    argv = ["run", "--limit", "1", "--budget", "208", "--methods", "majority,smc,hex,ensemble"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    total = json.loads((out / "compute.json").read_text())["total"]
    physical = sum(kind["flops"] for kind in total["physical"].values())
    assert physical == pytest.approx(counted["flops"], rel=1e-3)
    denoise = total["physical"]["denoise"]
    assert denoise["tokens"] == denoise["real_tokens"]  # one problem: no padding
    assert physical < 0.8 * sum(total["charged_flops"].values())


# -- what came before ---------------------------------------------------------------------------


RECORDED = 30  # the recording's problems: the session's demo run holds the first ones
NEWER = ("adaptive_consistency", "threshold")  # the families the recording predates
PART = 8  # problems per test of the rest: three tests that can run side by side


def _as_recorded(run: Path, recorded: dict) -> tuple[int, set[str]]:
    """Every record of the run directory `run` whose method the recording holds: it selects the same
    candidate, answers and grades the same, spends the same passes by kind and holds the same
    candidates (texts, keys, lineage, settings, edits). The records compared, and the methods
    left out (families the recording predates)."""
    import hashlib

    seen, others = 0, set()
    for r in RunDir(run).read_records():
        if r["method"] not in recorded:
            others.add(r["method"])
            continue
        want = recorded[r["method"]][r["problem"]]
        candidates = [
            [c["text"], c["key"], c["lineage"], c.get("settings"), c.get("edits")]
            for c in r["candidates"]
        ]
        digest = hashlib.blake2b(json.dumps(candidates).encode(), digest_size=12).hexdigest()
        got = {
            "selected": r["selected"],
            "answer": r["answer"],
            "correct": r["correct"],
            "passes": r["ledger"]["passes"],
            "candidates": digest,
        }
        assert got == want, (r["method"], r["problem"])
        seen += 1
    return seen, others


def _recorded() -> dict:
    return json.loads(gzip.decompress(FIXTURE.read_bytes()))["records"]


def test_the_demo_run_decides_and_spends_as_recorded(demo_run):
    """The session's demo run (`dllmbench run --limit 6` on two processes, every family at
    both budgets) on its problems, against the run recorded in tests/fixtures before the FLOP
    ledger: every family that existed then decides and spends as it did, beside the families
    that came after it (adaptive consistency, confidence thresholds), which it leaves out."""
    recorded = _recorded()
    seen, others = _as_recorded(demo_run.path, recorded)
    assert seen == len(recorded) * DEMO_PROBLEMS == 35 * DEMO_PROBLEMS
    methods = json.loads((demo_run.path / "results.json").read_text())["methods"]
    newer = {m["id"] for m in methods if m["family"] in NEWER}
    assert len(newer) == 4 and others == newer


@pytest.mark.slow
@pytest.mark.parametrize("first", range(DEMO_PROBLEMS, RECORDED, PART))
def test_the_families_of_before_decide_and_spend_as_they_did(tmp_path, monkeypatch, first):
    """The rest of the demo's first 30 problems at both budgets, every family that existed
    before the FLOP ledger, against the run recorded in tests/fixtures before the change (as
    `test_the_demo_run_decides_and_spends_as_recorded` does for the first ones). Eight
    problems per test (problems `first` to `first + 7`): a row's noise comes from its
    problem's id, not from the problems run beside it."""
    recorded = _recorded()
    families = [name for name, _, _ in FAMILIES if name not in NEWER]
    problems = Arith.problems

    def part(self: Arith, split: str) -> list:
        return problems(self, split)[first : first + PART]

    monkeypatch.setattr(Arith, "problems", part)
    out = tmp_path / "run"
    argv = ["run", "--methods", ",".join(families), "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    seen, others = _as_recorded(out, recorded)
    assert not others
    ids = {p.id for p in part(Arith(**TASK_CONFIG), "test")}
    assert len(ids) == PART and all(ids <= set(by_problem) for by_problem in recorded.values())
    assert seen == len(recorded) * PART == 35 * PART
