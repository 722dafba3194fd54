"""Named presets: every setting a published protocol used, as plain data.

`--preset paper` sets what the paper's runs used for the chosen backbone and task. A preset
names options only (sampling flags, the budget, backbone, task, scorer and selector options by
name); it imports no plugin, so an option a plugin lacks is the registry's usual one-line error
when the run or the plan checks it. A value given explicitly on the command line wins over the
preset's, and the record the manifest keeps says which values the preset set and which were
overridden. Selector options apply to every planned method whose selector is that plugin,
unless the method's spec gives the option itself (the planner reads them back from the
record with `selector_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllmbench.core.errors import UserError

# The command-line settings a preset may give (`--steps`, `--gen-length`, `--prompt`, `--budget`).
FLAGS = ("steps", "gen_length", "prompt", "budget")


@dataclass(frozen=True)
class Preset:
    """The settings of one protocol: shared ones, and per backbone and per task."""

    name: str
    flags: dict[str, Any]  # steps, gen_length, budget
    backbones: dict[str, dict[str, Any]]  # backbone plugin → its options
    prompts: dict[str, str]  # backbone plugin → prompt style, on every task
    tasks: dict[str, dict[str, Any]]  # task plugin → its options
    scorers: dict[str, dict[str, Any]]  # scorer plugin → its options (any run name)
    # selector plugin → its options, for every method whose selector it is
    selectors: dict[str, dict[str, Any]]


# The paper's runs. Sources: its protocol and evaluation sections (T, the 512-token canvas, the
# two budgets, the shared Dream sampler, strict extraction), its compute accounting (LLaDA-8B-Base
# without classifier-free guidance: the same pass counts as Dream), its grader (30 s per
# MATH-500 grade) and its scorer description (pooling up to the first end-of-sequence token).
PAPER = Preset(
    name="paper",
    flags={
        "steps": 128,  # T = 128 denoising steps in every run
        "gen_length": 512,  # a fully masked canvas of 512 generated tokens after the prompt
        # the headline budget: PRM Guided K=8, b=64 spends 8·128 + 8·2 = 1040 passes against
        # ORM Rerank@8's 1032; the paper's second budget is K=32: `--budget 4160` (4128 for
        # ORM Rerank@32), or both in one run directory: `--budget 1040,4160`. PRM Guided was
        # averaged over several runs: `--seed 0`, 1, 2
        "budget": 1040,
    },
    backbones={
        # Dream-v0-Instruct-7B through its chat template; the shared sampler of every Dream
        # method: temperature 0.5, top-p 1.0, MaskGIT-plus confidence with positions drawn at
        # alg_temp 0.5, and the time grid from 1 down to eps = 1e-3
        "dream": {
            "model": "Dream-org/Dream-v0-Instruct-7B",
            "chat": True,
            "temperature": 0.5,
            "top_p": 1.0,
            "top_k": None,
            "alg": "maskgit_plus",
            "alg_temp": 0.5,
            "eps": 1e-3,
        },
        # LLaDA-8B-Base (the paper's cross-backbone check) with a raw few-shot prompt, no chat
        # template; Gumbel-max tokens at temperature 0.5, low-confidence remasking over one
        # block spanning the whole generated region, no classifier-free guidance (so the
        # pass counts are Dream's: 130K for PRM Guided at b=64), and neither EOS flag, which
        # belong to LLaDA-Instruct's pure-diffusion evaluation
        "llada": {
            "model": "GSAI-ML/LLaDA-8B-Base",
            "chat": False,
            "temperature": 0.5,
            "remasking": "low_confidence",
            "block_length": None,
            "cfg_scale": 0.0,
            "logits_eos_inf": False,
            "confidence_eos_eot_inf": False,
        },
    },
    # Dream's independent pools used the 0-shot chat prompt; LLaDA-Base the raw 8-shot text
    # (on MATH-500 the task's own 4-shot text, on MBPP its few-shot text)
    prompts={"dream": "chat", "llada": "fewshot"},
    tasks={
        "gsm8k": {"extraction": "strict"},  # the strict extractor throughout, never last-number
        "math500": {"timeout": 30.0},  # the paper's grader allowed 30 s per grade
        "mbpp": {},  # the paper states no sandbox limits: the task's own apply
        # HumanEval as the backbones' model cards evaluate it: zero-shot, the problem's prompt
        # alone (LLaDA-Base continues the raw prompt: the task's `fewshot` style has no
        # exemplars) or in Dream's chat template; graded by running check(candidate) under the
        # sandbox's own limits. The sampler stays the paper's shared one (the cards' own
        # samplers, e.g. Dream-Base's temperature 0.2 and top-p 0.95, are backbone options)
        "humaneval": {},
    },
    # the paper's PRM (and its ORM, on final states) pooled the generated region up to the
    # first end-of-sequence token, not up to a turn-end token
    scorers={"prm": {"pool_stop": "eos"}, "orm": {"pool_stop": "eos"}},
    # the paper's Majority counted a failed extraction as a vote: its scripts took
    # Counter(answers).most_common(1) over the extracted strings, a failed one being "None",
    # so the failed extractions vote as one answer, which can win and is then wrong. The
    # default (invalid=drop) keeps them out of the vote
    selectors={"majority": {"invalid": "vote"}},
)

PRESETS = {PAPER.name: PAPER}


@dataclass
class Resolved:
    """A preset applied to a run's settings: the values to use and what to record."""

    flags: dict[str, Any]
    backbone_config: dict[str, Any]
    task_config: dict[str, Any]
    scorers: dict[str, tuple[str, dict[str, Any]]] | None
    selectors: dict[str, dict[str, Any]]  # selector plugin → the options it takes
    record: dict[str, Any]  # {"name", "set", "overridden"}, flat keys as in `set`


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _merge(
    prefix: str,
    preset: dict[str, Any],
    given: dict[str, Any],
    done: dict[str, Any],
    overridden: dict[str, Any],
) -> dict[str, Any]:
    """`given` over `preset`; each preset value is noted in `done` or, when given, in
    `overridden` (with the value given) under `prefix + name`."""
    for key, value in preset.items():
        if key in given:
            overridden[prefix + key] = given[key]
        else:
            done[prefix + key] = value
    return {**preset, **given}


def apply(
    name: str,
    *,
    backbone: str,
    task: str,
    flags: dict[str, Any],
    backbone_config: dict[str, Any],
    task_config: dict[str, Any],
    scorers: dict[str, tuple[str, dict[str, Any]]] | None,
) -> Resolved:
    """The preset's values for `backbone` and `task` under the given ones.

    `flags` holds the command-line settings of `FLAGS`, None where not given; `scorers` maps
    run names to (plugin, options). Keys of the record: `steps`, `gen_length`, `prompt`,
    `budget`, `backbone.OPTION`, `task.OPTION`, `scorers.NAME.OPTION`, `selectors.NAME.OPTION`
    (a selector option is set for every method whose spec does not give it).
    """
    preset = get(name)
    if backbone not in preset.backbones:
        raise UserError(
            f"preset {name!r} has settings for backbones {', '.join(sorted(preset.backbones))}, "
            f"not {backbone!r}; drop --preset to run {backbone} with your own settings"
        )
    if task not in preset.tasks:
        raise UserError(
            f"preset {name!r} has settings for tasks {', '.join(sorted(preset.tasks))}, "
            f"not {task!r}; drop --preset to run {task} with your own settings"
        )
    done: dict[str, Any] = {}
    overridden: dict[str, Any] = {}
    wanted = {**preset.flags, "prompt": preset.prompts[backbone]}
    given = {k: v for k, v in flags.items() if v is not None}
    resolved_flags = _merge("", wanted, given, done, overridden)
    backbone_out = _merge(
        "backbone.", preset.backbones[backbone], backbone_config, done, overridden
    )
    task_out = _merge("task.", preset.tasks[task], task_config, done, overridden)
    scorers_out = None
    if scorers is not None:
        scorers_out = {}
        for run_name, (plugin, config) in sorted(scorers.items()):
            options = preset.scorers.get(plugin, {})
            prefix = f"scorers.{run_name}."
            scorers_out[run_name] = (plugin, _merge(prefix, options, config, done, overridden))
    selectors = {plugin: dict(options) for plugin, options in sorted(preset.selectors.items())}
    for plugin, options in selectors.items():
        done.update({f"selectors.{plugin}.{key}": value for key, value in options.items()})
    return Resolved(
        flags=resolved_flags,
        backbone_config=backbone_out,
        task_config=task_out,
        scorers=scorers_out,
        selectors=selectors,
        record={"name": name, "set": done, "overridden": overridden},
    )


def selector_options(record: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Selector plugin → the options a preset set, read back from the record `apply` made
    (the manifest's `preset`; what the planner merges under each method's own selector
    options); nothing without a preset."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in ((record or {}).get("set") or {}).items():
        kind, _, rest = key.partition(".")
        plugin, _, option = rest.partition(".")
        if kind == "selectors" and option:
            out.setdefault(plugin, {})[option] = value
    return out
