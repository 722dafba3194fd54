"""Every bad command-line input is one line and exit status 2, before any heavy work.

Each class of mistake runs against a finished run directory (`--out`) where a run is asked
for, and the directory must come out byte-identical. Mistakes in options, scorers and the
plan must be found before the backbone is built: `no_backbone` makes building one fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TOY_RUN, assert_user_error, cli_subprocess, snapshot

from dllmbench.core.errors import PluginCrashed, PluginError, UserError
from dllmbench.demo import TINY_DIR
from dllmbench.loading.manager import PluginInfo
from dllmbench.loading.registry import Registry
from dllmbench.plugins.backbones.base import DiffusionBackbone
from dllmbench.plugins.backbones.llada import LLaDAConfig
from dllmbench.plugins.backbones.loading import read_config

# the shipped tiny model on a few arith problems: loads in well under a second
TINY = ["run", "--task", "arith:test_size=4", "--steps", "4", "--gen-length", "8", "--limit", "2"]
TOY = ["run", "--task", "toy_sum:size=4", "--backbone", "toy", "--steps", "8", "--budget", "72"]


@pytest.fixture
def no_backbone(monkeypatch):
    """Building a model backbone is a test failure: the mistake had to be found before."""

    def built(self, *args, **kwargs):
        raise AssertionError("the backbone was built before the mistake was found")

    monkeypatch.setattr(DiffusionBackbone, "__init__", built)


def unchanged(cli, run_dir: Path, *argv, needles=()):
    """Run `argv` into `run_dir`: a one-line user error that leaves the directory as it was."""
    before = snapshot(run_dir)
    assert_user_error(cli(*argv, "--out", run_dir), *needles)
    assert snapshot(run_dir) == before


# -- 1. broken checkpoint files ------------------------------------------------------------------


def damage(file: Path, how: str) -> None:
    data = file.read_bytes()
    if how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "garbage":
        file.write_bytes(bytes(range(256)) * 4)
    elif how == "not json":
        file.write_text("{not json")
    elif how == "missing keys":
        file.write_text('{"model_type": "Dream", "kind": "prm"}')
    elif "=" in how:  # a config value edited: `key=JSON`
        key, value = how.split("=", 1)
        file.write_text(json.dumps({**json.loads(data), key: json.loads(value)}))
    else:
        raise ValueError(how)


@pytest.fixture
def tiny_copy(tmp_path) -> Path:
    return Path(shutil.copytree(TINY_DIR, tmp_path / "tiny"))


@pytest.mark.parametrize(
    "name,how,needle",
    [
        ("model.safetensors", "truncated", "not a readable safetensors file"),
        ("model.safetensors", "empty", "not a readable safetensors file"),
        ("model.safetensors", "garbage", "not a readable safetensors file"),
        ("config.json", "not json", "is not valid JSON"),
        ("config.json", "missing keys", "lacks hidden_size"),
        ("config.json", "hidden_size=0", "hidden_size is 0, not a positive integer"),
        ("config.json", 'num_hidden_layers="2"', "num_hidden_layers is '2', not a positive"),
        ("config.json", "max_position_embeddings=0", "max_position_embeddings is 0, not"),
        ("config.json", 'hidden_act="nope"', "does not build a model"),
        ("config.json", "num_attention_heads=3", "num_attention_heads 3 does not divide hidden"),
        ("config.json", "num_key_value_heads=3", "num_key_value_heads 3 does not divide num_"),
        ("config.json", "rope_theta=-1", "rope_theta is -1, not a finite positive number"),
        ("config.json", "rms_norm_eps=-1", "rms_norm_eps is -1, not a finite positive number"),
        ("config.json", 'rms_norm_eps="x"', "rms_norm_eps is 'x', not a finite positive number"),
        # weights that do not fit the config: the first tensor named with both shapes
        ("", "intermediate_size=255", "gate_proj.weight is [256, 128], the config makes it [255,"),
        ("", "vocab_size=5", "embed_tokens.weight is [67, 128], the config makes it [5, 128]"),
    ],
)
def test_a_broken_backbone_checkpoint_names_the_file(
    cli, finished_run, tiny_copy, name, how, needle
):
    damage(tiny_copy / (name or "config.json"), how)
    argv = [*TINY, "--backbone", f"tiny:model={tiny_copy}", "--methods", "vanilla"]
    unchanged(cli, finished_run, *argv, needles=(str(tiny_copy / name), needle))


# each checkpoint layout's config.json, as small as read_config takes it
LAYOUTS = {
    "dream": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
    "block": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
    "llada": {"d_model": 64, "mlp_hidden_size": 128, "n_layers": 2},
}
HEADS = {"dream": "num_attention_heads", "block": "num_attention_heads", "llada": "n_heads"}


@pytest.mark.parametrize("arch", sorted(LAYOUTS))
def test_every_checkpoint_layout_refuses_a_config_that_cannot_make_its_model(tmp_path, arch):
    """Every backbone that loads a local checkpoint reads its config.json through
    `read_config`: heads that do not split the width, a rotary base or norm epsilon that is
    not a positive number are the checkpoint's fault, one line naming the file (the rotary
    base of -1 made every logit NaN: a crash blamed on the backbone plugin)."""
    heads = HEADS[arch]
    kv = "n_kv_heads" if arch == "llada" else "num_key_value_heads"
    good = {**LAYOUTS[arch], heads: 4, kv: 2, "vocab_size": 67, "rope_theta": 1e4}
    broken = [
        ({heads: 3}, f"{heads} 3 does not divide"),
        ({kv: 3}, f"{kv} 3 does not divide {heads} 4"),
        ({"rope_theta": 0}, "rope_theta is 0, not a finite positive number"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps is nan, not a finite positive number"),
        ({"rope_theta": True}, "rope_theta is True, not a finite positive number"),
    ]
    file = tmp_path / "config.json"
    file.write_text(json.dumps(good))
    assert read_config(arch, tmp_path) == good
    for change, needle in broken:
        file.write_text(json.dumps({**good, **change}))
        with pytest.raises(UserError, match=re.escape(f"{file}: {needle}")):
            read_config(arch, tmp_path)
    # a Qwen3 block checkpoint gives its heads' width: they need not divide the hidden size
    qwen3 = {**good, heads: 3, kv: 3, "head_dim": 32}
    file.write_text(json.dumps(qwen3))
    if arch == "block":
        assert read_config(arch, tmp_path) == qwen3
    else:  # Dream's and LLaDA's classes take no head_dim: their heads split the hidden size
        with pytest.raises(UserError, match=f"{heads} 3 does not divide"):
            read_config(arch, tmp_path)


@pytest.mark.parametrize(
    "name,how,needle",
    [
        ("adapter.safetensors", "truncated", "not a readable safetensors file"),
        ("adapter.safetensors", "empty", "not a readable safetensors file"),
        ("head.safetensors", "garbage", "not a readable safetensors file"),
        ("head.safetensors", "truncated", "not a readable safetensors file"),
        ("config.json", "not json", "is not valid JSON"),
        ("config.json", "missing keys", "lacks base"),
    ],
)
def test_a_broken_scorer_checkpoint_names_the_file_before_the_backbone_loads(
    cli, finished_run, tiny_copy, no_backbone, name, how, needle
):
    damage(tiny_copy / "prm" / name, how)
    argv = [*TINY, "--backbone", "tiny", "--scorer", f"prm=prm:checkpoint={tiny_copy / 'prm'}"]
    argv += ["--methods", "vanilla,prm_rerank"]
    unchanged(cli, finished_run, *argv, needles=(str(tiny_copy / "prm" / name), needle))


# -- 2. numbers ----------------------------------------------------------------------------------

RUN_NUMBERS = [
    ("--resamples", "0"),
    ("--resamples", "-3"),
    ("--budget", "0"),
    ("--budget", "-5"),
    ("--steps", "0"),
    ("--steps", "2.5"),
    ("--gen-length", "-1"),
    ("--limit", "0"),
    ("--seed", "-1"),
    ("--batch-rows", "0"),
    ("--batch-tokens", "0"),
    ("--max-problems", "-2"),
    ("--resamples", "100001"),  # a resamples × problems array for every method: 1 GB and more
]


@pytest.mark.parametrize("option,value", RUN_NUMBERS)
def test_run_numbers_out_of_range(cli, finished_run, option, value):
    needle = "an integer" if "." in value else ("got " + value)
    unchanged(cli, finished_run, *TOY_RUN, option, value, needles=(f"argument {option}", needle))


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["plan", "--budget", "-5"], "must be a positive integer, got -5"),
        (["plan", "--budget", "abc"], "must be an integer, got 'abc'"),
        (["plan", "--budget", "100", "--steps", "0"], "must be a positive integer, got 0"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--n", "0"], "--n"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--snapshots", "-1"], "got -1"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--steps", "0"], "--steps"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--gen-length", "0"], "got 0"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--limit", "0"], "--limit"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--batch-rows", "0"], "rows"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--seed", "-1"], ">= 0"),
        (["collect", "--task", "toy_sum", "--backbone", "toy", "--rollouts", "-2"], "got -2"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--labels", "soft"], "--labels"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--steps", "0"], "--steps"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--batch", "-1"], "--batch"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--accum", "0"], "--accum"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--lr", "-1"], "positive number"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--warmup", "-1"], "--warmup"),
        (
            ["train-scorer", "--kind", "prm", "--data", "d", "--warmup", "50", "--steps", "20"],
            "--warmup 50 is longer than --steps 20",
        ),
        (["train-scorer", "--kind", "prm", "--data", "d", "--val-fraction", "2"], "between"),
        (["train-scorer", "--kind", "prm", "--data", "d", "--val-every", "0"], "--val-every"),
    ],
)
def test_numbers_of_other_commands_out_of_range(cli, tmp_path, argv, needle):
    if argv[0] != "plan":
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert_user_error(cli(*argv), needle)
    assert not (tmp_path / "out").exists()


def test_a_value_that_begins_with_a_dash_is_shown_how_to_write_it(cli):
    """argparse reads `-1e9flops` (no plain number) as an option, so `--budget` lacks its
    value; the line says how to give it one, and that spelling reaches the budget's check."""
    assert_user_error(
        cli("plan", "--budget", "-1e9flops"),
        "argument --budget: expected one argument; a value that begins with '-' is written "
        "--budget=-1e9flops",
    )
    assert_user_error(cli("plan", "--budget=-1e9flops"), "a FLOP budget is a number >= 1")
    # a missing value, or an option where the value goes, is not given the hint
    for argv in (["plan", "--budget"], ["plan", "--budget", "--json"]):
        assert_user_error(cli(*argv), "argument --budget: expected one argument (see")


@pytest.mark.parametrize(
    "argv,help_of",
    [
        (["run", "--wat"], "dllmbench run"),
        (["merge", "runs/x", "--out", "y"], "dllmbench merge"),  # merge takes RUN_DIR
        (["plan", "--budget", "100", "extra"], "dllmbench plan"),
        (["--wat"], "dllmbench"),
    ],
)
def test_an_unknown_argument_points_to_its_commands_help(cli, argv, help_of):
    assert_user_error(cli(*argv), "unrecognized arguments:", f"(see '{help_of} --help')")


# -- 3. plugin options of the wrong type ---------------------------------------------------------


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--task", "toy_sum:size=abc"], "task 'toy_sum' option size wants an int, got 'abc'"),
        (["--backbone", "toy:p_correct=abc"], "option p_correct wants a number, got 'abc'"),
        (
            ["--method", "independent:n=abc+majority"],
            "strategy 'independent' option n wants an int, got 'abc'",
        ),
        (["--method", "independent:n=2.5+majority"], "option n wants an int, got 2.5"),
        (["--method", "independent:n=4+argmax:scorer=5"], "needs scorer 5"),  # a name, not 5
        (["--scorer", "orm=toy:partial=maybe"], "option partial wants true or false"),
    ],
)
def test_plugin_options_of_the_wrong_type(cli, finished_run, argv, needle):
    # a repeated --task or --backbone replaces the toy run's own (a scorer name is given once)
    scorer = [] if "--scorer" in argv else ["--scorer", "orm=toy"]
    argv = [*TOY, "--methods", "vanilla,orm_rerank", *scorer, *argv]
    unchanged(cli, finished_run, *argv, needles=(needle,))


@pytest.mark.parametrize(
    "option,needle",
    [
        ("tiny:dtype=3", "option dtype wants one of 'float32', 'bfloat16', 'float16', got 3"),
        ("tiny:temperature=hot", "option temperature wants a number, got 'hot'"),
        ("tiny:chat=maybe", "option chat wants true or false, got 'maybe'"),
        ("tiny:mask_id=x", "option mask_id wants an int, got 'x'"),
        ("tiny:alg=fast", "option alg wants one of 'origin'"),  # the Config's own check, one line
    ],
)
def test_backbone_options_are_checked_before_it_loads(
    cli, finished_run, no_backbone, option, needle
):
    unchanged(
        cli, finished_run, *TINY, "--backbone", option, "--methods", "vanilla", needles=(needle,)
    )


def test_a_config_error_with_several_lines_is_one_line():
    @dataclass(frozen=True)
    class FussyConfig:
        level: int = 0

        def __post_init__(self):
            raise ValueError("first line\nsecond line\n\nthird")

    class Fussy:
        Config = FussyConfig

    info = PluginInfo("fussy", "selector", Fussy, "tests", "0", __name__)
    reg = Registry({"selector": {"fussy": info}})
    with pytest.raises(PluginError) as caught:
        reg.selector("fussy", level=2)
    assert str(caught.value) == "selector 'fussy' with level=2: first line second line third"


def test_a_factory_error_with_several_lines_is_one_line_blaming_the_plugin():
    class Crashes:
        def __init__(self, level: int = 0):
            raise RuntimeError("first line\nsecond line\n\nthird")

    info = PluginInfo("crashes", "selector", Crashes, "tests", "0", __name__)
    reg = Registry({"selector": {"crashes": info}})
    with pytest.raises(PluginCrashed) as caught:
        reg.selector("crashes", level=2)
    line = Crashes.__init__.__code__.co_firstlineno + 1  # the line that raised
    assert str(caught.value) == (
        "selector 'crashes' (from tests) raised RuntimeError: first line second line third "
        f"(at test_bad_inputs.py:{line})"
    )


# -- 4. unknown names and options inside a '*'-sized method --------------------------------------


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("independent:n=*+majorty", "unknown selector 'majorty'; known: argmax"),
        (
            "indep:n=*+majority",
            "unknown strategy 'indep'; known: adaptive, ensemble, hex, independent,",
        ),
        ("independent:m=*+majority", "strategy 'independent' has no option 'm'; options: n"),
        ("independent:n=*+majority:x=1", "selector 'majority' has no option 'x'"),
        ("prm_guided:k=*,every=abc+first", "option every wants an int, got 'abc'"),
        ("prm_guided:k=*,every=0+first", "k, every and keep must be >= 1"),
    ],
)
def test_a_sized_method_with_a_wrong_name_or_option(cli, finished_run, spec, needle):
    unchanged(cli, finished_run, *TOY, "--method", spec, "--scorer", "prm=toy", needles=(needle,))
    assert_user_error(cli("plan", "--budget", "72", "--method", spec), needle)


# -- 5. scorers no method uses, methods whose scorer is missing ----------------------------------


def test_a_scorer_no_requested_method_uses(cli, finished_run):
    unchanged(
        cli,
        finished_run,
        *TOY,
        "--methods",
        "vanilla,orm_rerank",
        "--scorer",
        "orm=toy",
        "--scorer",
        "pmr=toy",
        needles=("no requested method uses scorer 'pmr'", "orm by orm_rerank"),
    )


def test_a_scorer_no_family_uses(cli, finished_run):
    argv = [*TOY, "--scorer", "zzz=toy"]
    unchanged(cli, finished_run, *argv, needles=("scorer 'zzz'", "scorers in use: ", "prm by "))


@pytest.mark.parametrize(
    "argv",
    [
        ["--methods", "vanilla,prm_rerank"],
        ["--method", "independent:n=2+argmax:scorer=prm"],
        ["--methods", "vanilla,prm_rerank", "--scorer", "orm=toy"],
    ],
)
def test_a_requested_method_whose_scorer_is_missing(cli, finished_run, argv):
    unchanged(cli, finished_run, *TOY, *argv, needles=("needs scorer prm", "--scorer prm="))


def test_without_requested_methods_families_lacking_a_scorer_are_left_out(cli, tmp_path):
    result = cli(*TOY, "--scorer", "orm=toy:partial=false", "--out", tmp_path / "r")
    assert result.code == 0, result.err
    assert "prm_rerank — needs scorer prm" in result.out
    assert "ORM Rerank@8" in result.out


# -- 6. scorer checkpoints, the plan and --reference before the backbone loads ------------------


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--reference", "Nope"], "--reference 'Nope' is not among the methods: Vanilla"),
        (["--scorer", "prm=prm:checkpoint=/no/such/dir"], "'/no/such/dir' does not exist"),
        (
            ["--scorer", f"prm=prm:checkpoint={TINY_DIR / 'orm'}"],
            "is a 'orm' checkpoint, not a 'prm' one",
        ),
        (["--scorer", "prm=prm"], "scorer 'prm' has no trained weights"),
        (["--scorer", "prm=prm:pooling=max"], "option pooling wants one of 'mean', 'last'"),
        (["--scorer", "prm=prm:pool_stop=end"], "option pool_stop wants one of 'turn', 'eos'"),
        (["--budget", "3"], "needs a budget of at least 4"),
    ],
)
def test_mistakes_are_found_before_the_backbone_loads(cli, finished_run, no_backbone, argv, needle):
    methods = "vanilla,prm_rerank" if "--scorer" in argv else "vanilla"
    argv = [*TINY, "--backbone", "tiny", "--methods", methods, *argv]
    unchanged(cli, finished_run, *argv, needles=(needle,))


def test_classifier_free_guidance_is_planned_at_two_passes_per_step(cli, finished_run, no_backbone):
    assert LLaDAConfig(cfg_scale=1.0).passes_per_step == 2
    assert LLaDAConfig().passes_per_step == 1
    argv = [*TINY, "--backbone", "llada:cfg_scale=1", "--methods", "vanilla", "--budget", "7"]
    unchanged(cli, finished_run, *argv, needles=("needs a budget of at least 8",))


# -- 7. a Hub model that is neither local nor reachable ------------------------------------------


@pytest.mark.slow
def test_an_offline_hub_model_is_one_quick_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    started = time.monotonic()
    result = cli_subprocess(
        "run",
        "--task",
        "arith:test_size=4",
        "--backbone",
        "dream",
        "--methods",
        "vanilla",
        "--out",
        tmp_path / "r",
        env=env,
        cwd=tmp_path,
    )
    assert time.monotonic() - started < 30  # the interpreter's start included
    assert_user_error(
        result, "'Dream-org/Dream-v0-Instruct-7B'", "HF_HUB_OFFLINE is set", "model=PATH"
    )
    assert "warn" not in result.err.lower() and "retry" not in result.err.lower()
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


# -- the short forms that used to slip through ---------------------------------------------------


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--methods", "vanilla,,majority"], "'vanilla,,majority' has an empty item"),
        (["--methods", ","], "has an empty item"),
        (["--scorer", "=x"], "'=x' wants NAME or NAME=PLUGIN"),
        (["--scorer", "prm="], "'prm=' wants NAME or NAME=PLUGIN"),
    ],
)
def test_malformed_lists_and_scorers(cli, finished_run, argv, needle):
    assert_user_error(cli("plan", "--budget", "100", *argv), needle)
    unchanged(cli, finished_run, *TOY, *argv, needles=(needle,))


# -- sampler numbers that are no numbers, and ids outside the model -----------------------------


@pytest.mark.parametrize(
    "option,needle",
    [
        ("tiny:temperature=nan", "temperature must be a finite number >= 0 (0 draws the most"),
        ("tiny:temperature=inf", "temperature must be a finite number >= 0"),
        ("tiny:alg_temp=-5", "alg_temp must be a finite number >= 0 (0 or None: the most"),
        ("tiny-block:temperature=nan", "temperature must be a finite number >= 0"),
        ("llada:model=random,temperature=inf", "temperature must be a finite number >= 0"),
        ("llada:model=random,cfg_scale=nan", "cfg_scale must be a finite number >= 0"),
        ("tiny:seed=-1", "seed must be >= 0, got -1"),  # as --seed
        ("tiny-block:seed=-2", "seed must be >= 0, got -2"),
        ("llada:model=random,seed=-1", "seed must be >= 0"),
    ],
)
def test_sampler_numbers_that_cannot_sample_are_refused_before_the_model_loads(
    cli, finished_run, no_backbone, option, needle
):
    unchanged(
        cli, finished_run, *TINY, "--backbone", option, "--methods", "vanilla", needles=(needle,)
    )


@pytest.mark.parametrize("mask_id", ["99999", "-3"])
def test_a_mask_id_outside_the_vocabulary_is_one_line(cli, finished_run, mask_id):
    unchanged(
        cli,
        finished_run,
        *TINY,
        "--backbone",
        f"tiny:mask_id={mask_id}",
        "--methods",
        "vanilla",
        needles=(f"mask_id={mask_id} is outside the vocabulary", "leave mask_id out"),
    )


@pytest.mark.parametrize(
    "option,needle",
    [
        ("lora_r=-4", "lora_r must be a whole number >= 1 (default 16), got -4"),
        ("lora_dropout=nan", "lora_dropout must be a number in [0, 1)"),
        ("lora_alpha=0", "lora_alpha must be a number > 0"),
        ("head_width=0", "head_width must be a whole number >= 1"),
        ("target_modules=q_proj+", "target_modules must name modules"),
    ],
)
def test_scorer_training_options_that_cannot_build_an_adapter(cli, tmp_path, option, needle):
    """`train-scorer --options lora_r=-4` was the built-in plugin's fault (exit 3): it is
    the user's, one line, and nothing is written."""
    data = tmp_path / "collection"
    collect = [
        *("collect", "--task", "arith:max_steps=1", "--backbone", "dream:model=random"),
        *("--n", "2", "--snapshots", "1", "--limit", "2", "--out", data),
        *("--steps", "6", "--gen-length", "8", "--prompt", "fewshot"),
    ]
    assert cli(*collect).code == 0
    out = tmp_path / "scorer"
    train = ["train-scorer", "--kind", "prm", "--data", data, "--steps", "1", "--out", out]
    assert_user_error(cli(*train, "--options", option), needle)
    assert not out.exists()


def test_a_share_of_a_finished_whole_run_is_refused(cli, finished_run):
    """`--resume --shard 1/2` on a run finished without shares has nothing to run: one line,
    instead of an empty share that `status` then lists; a share that ran there before still
    resumes (a requeued array task that had finished succeeds again)."""
    unchanged(
        cli,
        finished_run,
        *TOY_RUN,
        "--resume",
        "--shard",
        "1/2",
        needles=(
            "holds every record of share 1/2 already",
            "written by a run without --shard (it is finished)",
            "drop --shard",
        ),
    )
    assert not list(finished_run.glob("*shard*"))
    # its records written by shares of another count: they are named
    (finished_run / "samples.jsonl").rename(finished_run / "samples.shard-1-of-2.jsonl")
    (finished_run / "samples.shard-2-of-2.jsonl").touch()
    needles = ("holds every record of share 1/3 already", "written by --shard 1/2, 2/2")
    unchanged(cli, finished_run, *TOY_RUN, "--resume", "--shard", "1/3", needles=needles)
    # half by a share, the rest by a whole run: both are named, not the share alone
    (finished_run / "samples.shard-2-of-2.jsonl").unlink()
    shard = (finished_run / "samples.shard-1-of-2.jsonl").read_bytes().splitlines(keepends=True)
    (finished_run / "samples.shard-1-of-2.jsonl").write_bytes(b"".join(shard[:3]))
    (finished_run / "samples.jsonl").write_bytes(b"".join(shard[3:]))
    needles = ("holds every record of share 2/2 already", "by --shard 1/2 and a run without")
    unchanged(cli, finished_run, *TOY_RUN, "--resume", "--shard", "2/2", needles=needles)


def test_a_prompt_longer_than_the_model_is_refused_before_a_forward(cli, tmp_path):
    """GSM8K's eight-shot prompt is over 1,000 tokens for the tiny model's word-level
    tokenizer, which has 256 positions: one line naming the problem, nothing written but the
    refusal (the notice of the words it cannot read comes first)."""
    out = tmp_path / "run"
    argv = ["run", "--task", "gsm8k", "--backbone", "tiny", "--limit", "1", "--budget", "208"]
    result = cli(*argv, "--methods", "vanilla", "--out", out)
    assert_user_error(result, "problem 'test-0'", "do not fit the backbone's 256 positions")
    assert not (out / "samples.jsonl").exists() or not (out / "samples.jsonl").read_text()
