"""One benchmark run: build plugins, plan methods, run the engine into a run directory."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dllmbench import __version__
from dllmbench.engine import Engine, Limits, Sampling
from dllmbench.errors import UserError
from dllmbench.leaderboard import markdown
from dllmbench.method import Method
from dllmbench.planner import Plan, default_budget, plan
from dllmbench.registry import Registry, describe, registry
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
    limits: Limits = field(default_factory=Limits)
    resamples: int = 2000
    out: str | None = None
    command: list[str] = field(default_factory=list)

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


def _plugin_entry(reg: Registry, kind: str, name: str, obj: Any) -> dict[str, Any]:
    info = reg.info(kind, name)
    return {
        "name": name,
        "distribution": info.distribution,
        "version": info.version,
        "config": describe(obj),
    }


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
        entry = m.describe()
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
        "execution": asdict(cfg.limits),
    }


def prepare(cfg: RunConfig, reg: Registry | None = None):
    """Build every plugin and choose the methods; nothing is run or written yet."""
    reg = reg or registry()
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
    backbone = reg.backbone(cfg.backbone, **cfg.backbone_config)
    # a scorer that asks for `backbone` shares the frozen weights instead of loading twice
    if cfg.scorers is None:
        cfg.scorers = dict(getattr(backbone, "shipped_scorers", {}))
    scorers = {
        name: reg.scorer(plugin, shared={"backbone": backbone}, **config)
        for name, (plugin, config) in cfg.scorers.items()
    }
    for name, scorer in scorers.items():
        if getattr(scorer, "trained", True) is False:
            raise UserError(
                f"scorer {name!r} has no trained weights; give checkpoint=DIR "
                "(dllmbench train-scorer makes one)"
            )
    budget = cfg.budget or default_budget(cfg.sampling.total_steps)
    chosen = plan(
        reg,
        budget,
        cfg.sampling.total_steps,
        cfg.methods,
        set(scorers),
        passes_per_step=int(getattr(backbone, "passes_per_step", 1)),
    )
    if not chosen.methods:
        reasons = "; ".join(f"{x.family}: {x.reason}" for x in chosen.left_out)
        raise UserError(f"no method fits: {reasons}")
    ids = [p.method.id for p in chosen.methods]
    if cfg.reference is not None and cfg.reference not in ids:
        raise UserError(f"--reference {cfg.reference!r} is not among the methods: {', '.join(ids)}")
    return reg, task, problems, backbone, scorers, chosen, budget


def run(
    cfg: RunConfig,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Run (or resume) a benchmark; `on_start(total, done)` and `on_record` report progress."""
    reg, task, problems, backbone, scorers, chosen, budget = prepare(cfg)
    problem_ids = [p.id for p in problems]
    methods = [p.method for p in chosen.methods]
    manifest = build_manifest(cfg, reg, task, backbone, scorers, chosen, problem_ids, budget)
    rundir = RunDir(cfg.run_dir())
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
        limits=cfg.limits,
    )
    written = 0

    def keep(record: dict[str, Any]) -> None:
        nonlocal written
        rundir.append(record)
        written += 1
        if on_record is not None:
            on_record(record)

    engine.run(problems, skip=done, on_record=keep)
    records = rundir.read_records()
    results = summarize(
        records,
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
    rundir.add_invocation(
        {
            "created": manifest["created"],
            "records_written": written,
            "physical": engine.ledger.physical(),
        }
    )
    return Outcome(results, rundir.path, len(previous), written, chosen)
