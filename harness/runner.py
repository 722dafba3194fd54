"""One benchmark run: build plugins, plan methods, run the engine into a run directory."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dllmbench import __version__
from dllmbench.checksums import sha256
from dllmbench.engine import Capacity, Engine, Sampling
from dllmbench.errors import UserError
from dllmbench.interfaces import (
    MultiPass,
    is_deterministic,
    is_trained,
    passes_per_step,
    shipped_scorers,
    weight_files,
)
from dllmbench.leaderboard import markdown
from dllmbench.method import Method
from dllmbench.planner import Plan, Planned, default_budget, plan
from dllmbench.provenance import Origins, config_data
from dllmbench.registry import Registry, registry
from dllmbench.results import summarize
from dllmbench.rundir import RunDir


@dataclass
class RunConfig:
    task: str
    backbone: str
    task_config: dict[str, Any] = field(default_factory=dict)
    backbone_config: dict[str, Any] = field(default_factory=dict)
    # scorers by run name; None: the scorers the backbone ships with (the demo's), if any
    scorers: dict[str, tuple[str, dict[str, Any]]] | None = None
    split: str = "test"
    limit: int | None = None
    budget: int | None = None
    methods: list[str] | None = None
    reference: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    capacity: Capacity = field(default_factory=Capacity)
    resamples: int = 2000
    out: str | None = None
    command: list[str] = field(default_factory=list)
    # run multi-candidate methods on a backbone that samples deterministically (copies agree)
    allow_deterministic: bool = False
    # `--preset`: {"name", "set", "overridden"} as presets.apply records it; None without one
    preset: dict[str, Any] | None = None

    def run_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        budget = self.budget or default_budget(self.sampling.total_steps)
        return Path("runs") / f"{self.task}-{self.backbone}-b{budget}-seed{self.sampling.seed}"


@dataclass
class Outcome:
    results: dict[str, Any]
    path: Path
    resumed: int  # records found already written
    written: int  # records written by this call
    plan: Plan


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions() -> dict[str, str]:
    import numpy
    import torch

    versions = {
        "python": platform.python_version(),
        "dllmbench": __version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    return versions


def _weights(obj: Any) -> dict[str, dict[str, str]]:
    """Config field → {file: sha256} of the checkpoint files it located, from the plugin's
    optional `weight_files()`. Files are named relative to their common folder, so a moved
    checkpoint (or install) has the same entry and only a change of content differs."""
    out = {}
    for config_field, files in sorted(weight_files(obj).items()):
        paths = [Path(f) for f in files]
        if paths:
            base = Path(os.path.commonpath([p.parent for p in paths]))
            out[config_field] = {p.relative_to(base).as_posix(): sha256(p) for p in sorted(paths)}
    return out


def _plugin_entry(reg: Registry, kind: str, name: str, obj: Any) -> dict[str, Any]:
    info = reg.info(kind, name)
    entry = {
        "name": name,
        "distribution": info.distribution,
        "version": info.version,
        "config": config_data(obj),
    }
    weights = _weights(obj)
    if weights:
        entry["weights"] = weights
    return entry


def build_manifest(
    cfg: RunConfig,
    reg: Registry,
    task: Any,
    backbone: Any,
    scorers: dict[str, Any],
    chosen: Plan,
    problem_ids: list[str],
    budget: int,
) -> dict[str, Any]:
    methods = []
    for planned in chosen.methods:
        m: Method = planned.method
        entry = m.manifest_entry()
        entry["cost"] = planned.cost
        entry["strategy"].update(
            distribution=reg.info("strategy", m.spec.strategy).distribution,
            version=reg.info("strategy", m.spec.strategy).version,
        )
        entry["selector"].update(
            distribution=reg.info("selector", m.spec.selector).distribution,
            version=reg.info("selector", m.spec.selector).version,
        )
        methods.append(entry)
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": cfg.command,
        "versions": _versions(),
        "git_revision": _git_revision(),
        "preset": cfg.preset,
        "sampling": asdict(cfg.sampling),
        "task": {
            **_plugin_entry(reg, "task", cfg.task, task),
            "split": cfg.split,
            "limit": cfg.limit,
            "problems": len(problem_ids),
            "data_files": task.data_files(),
        },
        "backbone": _plugin_entry(reg, "backbone", cfg.backbone, backbone),
        "scorers": {
            name: _plugin_entry(reg, "scorer", plugin, scorers[name])
            for name, (plugin, _) in sorted(cfg.scorers.items())
        },
        "budget": budget,
        "methods": methods,
        "reference": cfg.reference,
        "statistics": {"resamples": cfg.resamples, "level": 0.95},
        "execution": asdict(cfg.capacity),
    }


def prepare(cfg: RunConfig, reg: Registry | None = None):
    """Build every plugin and choose the methods; nothing is run or written yet.

    Everything that needs no model is checked before the backbone loads: plugin options,
    scorer checkpoints (their `Config` checks), the plan and `--reference`, and that a
    backbone sampling deterministically is not asked for several candidates per problem.
    """
    reg = reg or registry()
    if cfg.resamples < 1:
        raise UserError(f"--resamples must be a positive integer, got {cfg.resamples}")
    task = reg.task(cfg.task, **cfg.task_config)
    splits = task.splits()
    if cfg.split not in splits:
        raise UserError(
            f"task {cfg.task!r} has no split {cfg.split!r}; splits: {', '.join(splits)}"
        )
    problems = task.problems(cfg.split)
    if cfg.limit is not None:
        if cfg.limit < 1:
            raise UserError(f"--limit must be >= 1, got {cfg.limit}")
        problems = problems[: cfg.limit]
    # the backbone's configuration says how it plans (passes per step, shipped scorers)
    backbone_config = reg.check("backbone", cfg.backbone, **cfg.backbone_config)
    if cfg.scorers is None:
        cfg.scorers = shipped_scorers(backbone_config)
    for name, (plugin, config) in cfg.scorers.items():
        _need_trained(name, reg.check("scorer", plugin, **config))
    passes = passes_per_step(backbone_config)
    budget = cfg.budget if cfg.budget is not None else default_budget(cfg.sampling.total_steps)
    chosen = _choose(cfg, reg, budget, passes)
    if is_deterministic(backbone_config) and not cfg.allow_deterministic:
        _refuse_deterministic(cfg, backbone_config, chosen, passes)
    backbone = reg.backbone(cfg.backbone, **cfg.backbone_config)
    if isinstance(backbone, MultiPass) and backbone.passes_per_step != passes:
        chosen = _choose(cfg, reg, budget, passes_per_step(backbone))  # not known from config
    # a scorer that asks for `backbone` shares the frozen weights instead of loading twice
    scorers = {
        name: reg.scorer(plugin, shared={"backbone": backbone}, **config)
        for name, (plugin, config) in cfg.scorers.items()
    }
    for name, scorer in scorers.items():
        _need_trained(name, scorer)  # a scorer whose options alone cannot tell
    return reg, task, problems, backbone, scorers, chosen, budget


def _need_trained(name: str, scorer_or_config: Any) -> None:
    if not is_trained(scorer_or_config):
        raise UserError(
            f"scorer {name!r} has no trained weights; give checkpoint=DIR "
            "(dllmbench train-scorer makes one)"
        )


def _trajectories(planned: Planned, total_steps: int, passes_per_step: int) -> int:
    """The trajectories a planned method samples per problem: its denoising passes over one
    trajectory's (a method sampling more than one compares candidates drawn with different
    keys; a strategy that branches counts each branch)."""
    per_trajectory = total_steps * passes_per_step
    return -(-planned.cost.get("denoise", 0) // per_trajectory)


def _refuse_deterministic(cfg: RunConfig, backbone_config: Any, chosen: Plan, passes: int) -> None:
    """A backbone whose copies all come out the same makes every multi-candidate method a
    costly Vanilla: refuse them (unless `allow_deterministic`)."""
    many = [
        (p.method.id, n)
        for p in chosen.methods
        if (n := _trajectories(p, cfg.sampling.total_steps, passes)) > 1
    ]
    if not many:
        return
    shown = ", ".join(f"{name} ({n} copies)" for name, n in many[:3])
    if len(many) > 3:
        shown += f" and {len(many) - 3} more"
    options = (
        dataclasses.asdict(backbone_config) if dataclasses.is_dataclass(backbone_config) else {}
    )
    temperature = options.get("temperature")
    why = f" (temperature={temperature:g})" if isinstance(temperature, (int, float)) else ""
    fix = (
        f"sample at temperature > 0 (--backbone {cfg.backbone}:temperature=0.5, the paper's)"
        if why
        else "give the backbone options that sample"
    )
    raise UserError(
        f"backbone {cfg.backbone!r} samples deterministically{why}: {shown} would compare "
        f"copies of one answer; {fix}, or pass --allow-deterministic"
    )


def _choose(cfg: RunConfig, reg: Registry, budget: int, passes_per_step: int) -> Plan:
    """The plan; a requested method left out for a missing scorer, no method fitting or an
    unknown `--reference` is an error."""
    chosen = plan(
        reg,
        budget,
        cfg.sampling.total_steps,
        cfg.methods,
        set(cfg.scorers or {}),
        passes_per_step=passes_per_step,
    )
    for x in chosen.left_out if cfg.methods else ():
        if x.missing:
            raise UserError(
                f"method {x.family!r} needs scorer {', '.join(x.missing)}, which the run does "
                f"not have; give --scorer {x.missing[0]}=PLUGIN[:checkpoint=DIR] or drop it"
            )
    if not chosen.methods:
        reasons = "; ".join(f"{x.family}: {x.reason}" for x in chosen.left_out)
        raise UserError(f"no method fits: {reasons}")
    ids = [p.method.id for p in chosen.methods]
    if cfg.reference is not None and cfg.reference not in ids:
        raise UserError(f"--reference {cfg.reference!r} is not among the methods: {', '.join(ids)}")
    return chosen


def _origins(cfg: RunConfig, reg: Registry, methods: list[Method]) -> Origins:
    """Who plays each part of the run, to name a plugin that breaks its contract."""
    scorers = {name: plugin for name, (plugin, _) in (cfg.scorers or {}).items()}
    parts = {("backbone", cfg.backbone), ("task", cfg.task)}
    parts |= {("scorer", plugin) for plugin in scorers.values()}
    parts |= {("strategy", m.spec.strategy) for m in methods}
    parts |= {("selector", m.spec.selector) for m in methods}
    return Origins(
        backbone=cfg.backbone,
        task=cfg.task,
        scorers=scorers,
        distributions={part: reg.info(*part).distribution for part in parts},
    )


SAVE_EVERY = 5.0  # seconds between saves of this invocation's compute.json entry


def run(
    cfg: RunConfig,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Run (or resume) a benchmark; `on_start(total, done)` and `on_record` report progress."""
    # the pre-flight: a bad or busy run directory is an error before any model is built
    with RunDir(cfg.run_dir()) as rundir:
        reg, task, problems, backbone, scorers, chosen, budget = prepare(cfg)
        problem_ids = [p.id for p in problems]
        methods = [p.method for p in chosen.methods]
        manifest = build_manifest(cfg, reg, task, backbone, scorers, chosen, problem_ids, budget)
        previous = rundir.open(manifest)
        done = {(r["problem"], r["method"]) for r in previous}
        if on_start is not None:
            on_start(len(problems) * len(methods), len(done))
        engine = Engine(
            backbone=backbone,
            scorers=scorers,
            task=task,
            methods=methods,
            sampling=cfg.sampling,
            capacity=cfg.capacity,
            origins=_origins(cfg, reg, methods),
        )
        written, saved = 0, -SAVE_EVERY

        def save(finished: bool) -> None:
            rundir.save_invocation(
                {
                    "created": manifest["created"],
                    "finished": finished,
                    "records_written": written,
                    "physical": engine.ledger.physical(),
                }
            )

        def keep(record: dict[str, Any]) -> None:
            nonlocal written, saved
            rundir.append(record)
            written += 1
            if time.monotonic() - saved >= SAVE_EVERY:
                save(finished=False)
                saved = time.monotonic()
            if on_record is not None:
                on_record(record)

        finished = False
        try:
            engine.run(problems, skip=done, on_record=keep)
            results = _summarize(cfg, rundir, manifest, problem_ids, budget)
            finished = True
        finally:  # an interrupted or failed invocation is counted too
            save(finished)
        return Outcome(results, rundir.path, len(previous), written, chosen)


def _summarize(
    cfg: RunConfig, rundir: RunDir, manifest: dict[str, Any], problem_ids: list[str], budget: int
) -> dict[str, Any]:
    """results.json and leaderboard.md from every record in the run directory."""
    results = summarize(
        rundir.read_records(),
        manifest["methods"],
        problem_ids,
        budget=budget,
        reference=cfg.reference,
        resamples=cfg.resamples,
        seed=cfg.sampling.seed,
    )
    results["task"] = {"name": cfg.task, "split": cfg.split, "problems": len(problem_ids)}
    results["steps"] = cfg.sampling.total_steps
    title = (
        f"{cfg.task} ({cfg.split}, {len(problem_ids)} problems) · {cfg.backbone} · budget {budget}"
    )
    rundir.write_results(results, markdown(results, title))
    return results
