"""`--preset paper`: the paper's settings as one flag, its dry run in `plan`, its manifest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import assert_user_error

from dllmbench.loading.registry import registry
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.backbones.tiny import TINY_DIR
from dllmbench.plugins.scorers.reward import RewardScorer
from dllmbench.running import presets

PAPER_COSTS = {
    "Vanilla": 128,
    "Majority@8": 1024,
    "ORM Rerank@8": 1032,
    "PRM Guided K=8 b=64": 1040,
    "Oracle@8": 1024,
}
BACKBONES = {
    "dream": {
        "prompt_style": "chat",
        "model": "Dream-org/Dream-v0-Instruct-7B",
        "chat": True,
        "temperature": 0.5,
        "top_p": 1.0,
        "alg": "maskgit_plus",
        "alg_temp": 0.5,
    },
    "llada": {
        "prompt_style": "fewshot",
        "model": "GSAI-ML/LLaDA-8B-Base",
        "chat": False,
        "temperature": 0.5,
        "remasking": "low_confidence",
        "cfg_scale": 0.0,
        "logits_eos_inf": False,
        "confidence_eos_eot_inf": False,
    },
}


@pytest.fixture
def no_models(monkeypatch):
    """Building a backbone or a scorer is a test failure: a dry run loads no weights."""

    def built(self, *args, **kwargs):
        raise AssertionError("a model was built by a dry run")

    monkeypatch.setattr(DiffusionBackbone, "__init__", built)
    monkeypatch.setattr(RewardScorer, "__init__", built)


def plan_json(cli, *argv):
    result = cli("plan", *argv, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize("task", ["gsm8k", "math500", "mbpp", "humaneval"])
@pytest.mark.parametrize("backbone", ["dream", "llada"])
def test_plan_preset_paper_prints_the_resolved_run_without_loading_weights(
    cli, no_models, backbone, task
):
    out = plan_json(cli, "--preset", "paper", "--task", task, "--backbone", backbone)
    expected = dict(BACKBONES[backbone])
    assert out["sampling"] == {
        "steps": 128,
        "gen_length": 512,
        "prompt": expected.pop("prompt_style"),
        "seed": 0,
    }
    assert out["budget"] == 1040 and out["steps"] == 128
    config = out["backbone"]["config"]
    assert {k: config[k] for k in expected} == expected
    passes = {m["id"]: m["passes"] for m in out["methods"]}
    assert {k: passes[k] for k in PAPER_COSTS} == PAPER_COSTS
    prm_guided = next(m for m in out["methods"] if m["id"] == "PRM Guided K=8 b=64")
    assert prm_guided["cost"] == {"denoise": 1024, "score:prm": 16}
    assert out["task"]["name"] == task
    for name in ("prm", "orm"):
        assert out["scorers"][name]["config"]["pool_stop"] == "eos"
        assert out["scorers"][name]["assumed"] is True
    record = out["preset"]
    assert record["name"] == "paper" and record["overridden"] == {}
    assert record["set"]["steps"] == 128 and record["set"]["budget"] == 1040
    assert record["set"]["backbone.temperature"] == 0.5


def test_the_math500_preset_grades_with_the_papers_thirty_seconds(cli, no_models):
    out = plan_json(cli, "--preset", "paper", "--task", "math500", "--backbone", "dream")
    assert out["task"]["config"]["timeout"] == 30.0
    assert out["preset"]["set"]["task.timeout"] == 30.0


def test_an_explicit_flag_or_option_overrides_one_value_and_the_record_says_so(cli, no_models):
    out = plan_json(
        cli,
        "--preset",
        "paper",
        "--task",
        "gsm8k",
        "--backbone",
        "dream:temperature=1.0",
        "--steps",
        "64",
        "--scorer",
        "prm=prm:pool_stop=turn",
    )
    record = out["preset"]
    assert record["overridden"] == {
        "steps": 64,
        "backbone.temperature": 1.0,
        "scorers.prm.pool_stop": "turn",
    }
    assert "steps" not in record["set"] and "backbone.temperature" not in record["set"]
    assert record["set"]["gen_length"] == 512  # the rest still comes from the preset
    assert out["sampling"]["steps"] == 64
    assert out["backbone"]["config"]["temperature"] == 1.0
    assert out["scorers"] == {
        "prm": {
            "plugin": "prm",
            "config": {**out["scorers"]["prm"]["config"], "pool_stop": "turn"},
            "assumed": False,
        }
    }


def test_the_papers_second_budget_is_the_preset_with_budget_4160(cli, no_models):
    out = plan_json(
        cli, "--preset", "paper", "--task", "gsm8k", "--backbone", "dream", "--budget", "4160"
    )
    passes = {m["id"]: m["passes"] for m in out["methods"]}
    assert passes["PRM Guided K=32 b=64"] == 4160
    assert passes["ORM Rerank@32"] == 4128
    assert passes["Majority@32"] == 4096
    assert out["preset"]["overridden"] == {"budget": 4160}


def test_plan_text_shows_the_resolved_settings_before_the_table(cli, no_models):
    result = cli("plan", "--preset", "paper", "--task", "gsm8k", "--backbone", "llada")
    assert result.code == 0, result.err
    assert "sampling: T=128, 512 generated tokens, prompt fewshot" in result.out
    assert "backbone llada: model=GSAI-ML/LLaDA-8B-Base" in result.out
    assert "PRM Guided K=8 b=64" in result.out


def test_plan_without_a_preset_resolves_the_general_defaults(cli, no_models):
    out = plan_json(cli, "--task", "gsm8k", "--backbone", "llada", "--budget", "1040")
    assert out["preset"] is None
    assert out["sampling"]["gen_length"] == 512 and out["sampling"]["steps"] == 128
    assert out["backbone"]["config"]["model"] == "GSAI-ML/LLaDA-8B-Instruct"


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["--preset", "paper", "--task", "gsm8k"], ["--preset paper needs --task and --backbone"]),
        (
            ["--preset", "paper", "--task", "arith", "--backbone", "dream"],
            ["tasks gsm8k, humaneval, math500, mbpp, not 'arith'"],
        ),
        (
            ["--preset", "paper", "--task", "gsm8k", "--backbone", "tiny"],
            ["backbones dream, llada, not 'tiny'"],
        ),
        (
            ["--preset", "paper", "--task", "gsm8k", "--backbone", "dream:tempreature=1"],
            ["no option 'tempreature'", "temperature"],
        ),
        (
            ["--preset", "paper", "--task", "math500:timeout=0", "--backbone", "dream"],
            ["timeout must be > 0"],
        ),
        (["--preset", "nope"], ["invalid choice: 'nope'"]),
        ([], ["plan needs --budget"]),
    ],
)
def test_preset_mistakes_are_one_line_before_any_model(cli, no_models, argv, needles):
    assert_user_error(cli("plan", *argv), *needles)
    if argv[:1] == ["--preset"] and argv[1:2] == ["paper"]:
        assert_user_error(cli("run", *argv, "--out", "unused"), *needles)


@pytest.mark.parametrize(
    "kind,table",
    [
        ("backbone", presets.PAPER.backbones),
        ("task", presets.PAPER.tasks),
        ("scorer", presets.PAPER.scorers),
        ("selector", presets.PAPER.selectors),
    ],
)
def test_every_preset_option_is_an_option_of_the_installed_plugin(kind, table):
    """A preset names options only; one a plugin lacks (or of the wrong type) fails here."""
    for name, options in table.items():
        config = registry().check(kind, name, **options)
        for key, value in options.items():
            assert getattr(config, key) == value, (kind, name, key)


@pytest.mark.slow
def test_the_preset_module_imports_no_plugin():
    code = (
        "import sys, dllmbench.running.presets; "
        "print([m for m in sys.modules if m.startswith('dllmbench.plugins') "
        "or m.startswith('dllmbench.tasks')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_run_with_the_preset_records_it_in_the_manifest(cli, tmp_path):
    out = tmp_path / "run"
    argv = ["run", "--preset", "paper", "--task", "gsm8k", "--backbone", "dream:model=random"]
    argv += ["--steps", "4", "--gen-length", "8", "--limit", "1", "--methods", "vanilla"]
    argv += ["--budget", "4", "--resamples", "10", "--out", out]
    result = cli(*argv)
    assert result.code == 0, result.err
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["preset"]
    assert record["name"] == "paper"
    assert record["overridden"] == {
        "steps": 4,
        "gen_length": 8,
        "budget": 4,
        "backbone.model": "random",
    }
    assert record["set"]["backbone.alg_temp"] == 0.5 and record["set"]["prompt"] == "chat"
    assert manifest["sampling"]["prompt_style"] == "chat"
    assert manifest["backbone"]["config"]["alg"] == "maskgit_plus"
    assert manifest["backbone"]["config"]["chat"] is True
    assert manifest["task"]["config"]["extraction"] == "strict"


def test_a_run_without_a_preset_records_none(finished_run):
    manifest = json.loads((finished_run / "manifest.json").read_text())
    assert manifest["preset"] is None


def test_apply_keeps_given_values_and_fills_the_rest():
    resolved = presets.apply(
        "paper",
        backbone="llada",
        task="mbpp",
        flags={"steps": None, "gen_length": 256, "prompt": None, "budget": None},
        backbone_config={"block_length": 32},
        task_config={"timeout": 5.0},
        scorers={"verifier": ("orm", {"checkpoint": "DIR"})},
    )
    assert resolved.flags == {"steps": 128, "gen_length": 256, "budget": 1040, "prompt": "fewshot"}
    assert resolved.backbone_config["block_length"] == 32
    assert resolved.backbone_config["model"] == "GSAI-ML/LLaDA-8B-Base"
    assert resolved.task_config == {"timeout": 5.0}
    assert resolved.scorers == {"verifier": ("orm", {"pool_stop": "eos", "checkpoint": "DIR"})}
    assert resolved.record["overridden"] == {"gen_length": 256, "backbone.block_length": 32}


def test_a_checkpoint_trained_with_turn_pooling_is_refused_before_any_model(cli, no_models):
    """The shipped demo PRM pools up to turn ends; the preset asks for EOS pooling."""
    prm = TINY_DIR / "prm"
    argv = [
        "--preset",
        "paper",
        "--task",
        "gsm8k",
        "--backbone",
        "dream",
        "--methods",
        "prm_rerank",
    ]
    assert_user_error(
        cli("plan", *argv, "--scorer", f"prm=prm:checkpoint={prm}"),
        f"{prm} was trained with pool_stop='turn', not 'eos'",
    )
    kept = plan_json(cli, *argv, "--scorer", f"prm=prm:checkpoint={prm},pool_stop=turn")
    assert kept["preset"]["overridden"] == {"scorers.prm.pool_stop": "turn"}
    assert kept["scorers"]["prm"]["config"]["checkpoint"] == str(prm)


def test_the_paper_preset_counts_failed_extractions_as_a_vote_and_records_it():
    """The paper's Majority took Counter(answers).most_common(1) over extracted strings, a
    failed extraction being "None": `--preset paper` sets majority:invalid=vote, and the
    record (the manifest's `preset`) says so."""
    resolved = presets.apply(
        "paper",
        backbone="dream",
        task="gsm8k",
        flags=dict.fromkeys(presets.FLAGS),
        backbone_config={},
        task_config={},
        scorers=None,
    )
    assert resolved.selectors == {"majority": {"invalid": "vote"}}
    assert resolved.record["set"]["selectors.majority.invalid"] == "vote"
    options = presets.selector_options(resolved.record)
    assert options == {"majority": {"invalid": "vote"}}
    assert presets.selector_options(None) == {}
    # the options are the selector's own (tests/test_selectors.py: the bloc wins, and is wrong)
    assert registry().selector("majority", **options["majority"]).config.invalid == "vote"


def test_a_run_with_the_preset_counts_failed_extractions_as_the_paper_did(cli, tmp_path):
    """Under --preset paper every Majority votes its failed extractions (the manifest's
    methods and preset record say so, the leaderboard's note too); a spec's own option wins."""
    out = tmp_path / "run"
    argv = ["run", "--preset", "paper", "--task", "gsm8k", "--backbone", "dream:model=random"]
    argv += ["--steps", "4", "--gen-length", "8", "--limit", "1", "--methods", "majority"]
    argv += ["--method", "independent:n=2+majority:invalid=drop"]
    argv += ["--budget", "8"]
    result = cli(*argv, "--resamples", "10", "--out", out)
    assert result.code == 0, result.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["preset"]["set"]["selectors.majority.invalid"] == "vote"
    by_id = {m["id"]: m for m in manifest["methods"]}
    assert by_id["Majority@2"]["selector"]["config"] == {"invalid": "vote"}
    assert by_id["Majority@2"]["spec"] == "independent:n=2+majority:invalid=vote"
    own = by_id["independent:n=2+majority:invalid=drop"]
    assert own["selector"]["config"] == {"invalid": "drop"}
    assert "failed extractions count as one answer" in (out / "leaderboard.md").read_text()
    plan = plan_json(cli, *argv[1:])
    assert {m["id"]: m["spec"] for m in plan["methods"]}["Majority@2"].endswith("invalid=vote")


def test_a_dry_run_of_the_shipped_model_names_the_scorers_run_would_use(cli):
    """`run --backbone tiny` without --scorer uses the demo's own PRM and ORM: `plan` says so,
    with their checkpoints, instead of asking for checkpoints it does not need."""
    out = plan_json(cli, "--task", "arith", "--backbone", "tiny", "--budget", "208")
    for name in ("prm", "orm"):
        scorer = out["scorers"][name]
        assert scorer["assumed"] is False
        assert scorer["config"]["checkpoint"] == str(TINY_DIR / name)
    assert {m["id"] for m in out["methods"]} >= {"ORM Rerank@8", "PRM Guided K=8 b=12"}
    shown = cli("plan", "--task", "arith", "--backbone", "tiny", "--budget", "208")
    assert shown.code == 0 and "assumed" not in shown.out


def test_a_dry_run_assumes_a_scorer_name_that_no_plugin_bears(cli):
    """A method may read a scorer under any run name (`argmax:scorer=fmt`); without --scorer a
    dry run lists it as one the user binds, instead of refusing 'fmt' as an unknown plugin. On
    the demo model, whose shipped scorers lack it, the method is refused as `run` refuses it."""
    method = "independent:n=*+argmax:scorer=fmt"
    out = plan_json(
        cli, "--task", "arith", "--backbone", "dream", "--budget", "1040", "--method", method
    )
    assert out["scorers"]["fmt"] == {"plugin": None, "config": {}, "assumed": True}
    shown = cli(
        "plan", "--task", "arith", "--backbone", "dream", "--budget", "1040", "--method", method
    )
    assert shown.code == 0 and "give --scorer fmt=PLUGIN" in shown.out
    argv = ["--task", "arith", "--backbone", "tiny", "--budget", "208", "--method", method]
    for command in ("plan", "run"):
        demo = cli(command, *argv)
        assert demo.code == 2 and demo.err.count("\n") == 1, demo
        assert "needs scorer fmt, which the run does not have" in demo.err


def test_a_dry_run_says_how_to_bind_each_assumed_scorer(cli):
    """`self` has no checkpoint (it asks the backbone itself): its hint is `--scorer
    self=self`, where every assumed scorer was told to give `NAME=PLUGIN:checkpoint=DIR`."""
    shown = cli("plan", "--task", "arith", "--backbone", "dream", "--budget", "1040")
    assert shown.code == 0, shown.err
    text = " ".join(shown.out.split())
    assert "(assumed: give --scorer self=self)" in text
    assert "(assumed: give --scorer prm=prm:checkpoint=DIR)" in text
    assert "NAME=PLUGIN" not in text
