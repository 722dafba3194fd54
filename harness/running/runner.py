"""One benchmark run: build plugins, plan methods, run the engine into a run directory."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dllmbench import __version__
from dllmbench.analysis.results import summarize_records
from dllmbench.analysis.stats import CONFIDENCE, RESAMPLES
from dllmbench.api.interfaces import (
    is_approximate,
    is_deterministic,
    is_trained,
    passes_per_step,
    shipped_scorers,
    weight_files,
)
from dllmbench.core.checksums import sha256
from dllmbench.core.errors import Terminated, UserError
from dllmbench.core.flops import Flops, unit_of
from dllmbench.core.schema import MOST_RESAMPLES, Results
from dllmbench.execution.engine import Capacity, Engine, Sampling, capped, sized_to_memory
from dllmbench.execution.method import Method
from dllmbench.execution.planner import (
    Plan,
    Planned,
    backbone_predicts,
    backbone_refuses,
    backbone_varies,
    check_budgets,
    default_budget,
    plan,
    refuse_missing_scorers,
    refuse_row_settings,
)
from dllmbench.execution.rates import Reference, reference
from dllmbench.loading.provenance import Origins, config_data
from dllmbench.loading.registry import Registry, registry
from dllmbench.running import presets
from dllmbench.running.allocator import keep_freed_memory
from dllmbench.running.invocation import Invocation
from dllmbench.running.launched import POLL_SECONDS, SAY_EVERY, ClaimedWork, Watch, say
from dllmbench.running.summary import summarize_run
from dllmbench.storage.claims import Claims, chunk_size
from dllmbench.storage.heartbeat import Heartbeat, heartbeat_name
from dllmbench.storage.rundir import RunDir, manifest_differences
from dllmbench.storage.shards import Shard, claim_device, resolve, shards_in


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
    # a --limit the user gave (not a demo's own 40): named in the default run directory, so
    # that `run --limit 100` after the demo starts a run of its own instead of being refused
    named_limit: int | None = None
    # passes per problem: one budget or several (each family planned at each); None: the
    # run's own on resume, else `budget_factors` times `default_budget(T)`
    budget: int | list[int] | None = None
    budget_factors: tuple[int, ...] = (1,)
    methods: list[str] | None = None
    reference: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    capacity: Capacity = field(default_factory=Capacity)
    resamples: int = RESAMPLES
    out: str | None = None
    command: list[str] = field(default_factory=list)
    # run multi-candidate methods on a backbone that samples deterministically (copies agree)
    allow_deterministic: bool = False
    # `--preset`: {"name", "set", "overridden"} as presets.apply records it; None without one
    preset: dict[str, Any] | None = None
    # `--shard I/N`: run one share of the problems (a launcher's environment gives one too)
    shard: Shard | None = None
    # several budgets: serve them one after another, smallest first, so that each budget's
    # methods finish (and its table can be shown) before the next budget's start; the rows a
    # smaller budget computed are reused, not computed again. False: all at once
    by_budget: bool = True

    def budgets(self) -> list[int]:
        """The budgets asked for, ascending (the default when none was given)."""
        if self.budget is None:
            return [f * default_budget(self.sampling.total_steps) for f in self.budget_factors]
        return check_budgets([self.budget] if isinstance(self.budget, int) else self.budget)

    def run_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        budgets = "+".join(b.typed() if isinstance(b, Flops) else str(b) for b in self.budgets())
        limit = f"-n{self.named_limit}" if self.named_limit is not None else ""
        name = f"{self.task}-{self.backbone}-b{budgets}-seed{self.sampling.seed}{limit}"
        return Path("runs") / name


@dataclass
class Outcome:
    results: dict[str, Any] | None
    path: Path
    resumed: int  # records found already written
    written: int  # records written by this call
    plan: Plan
    shard: Shard | None = None  # the share this call ran; results None when it did not merge


ScorerSpecs = dict[str, tuple[str, dict[str, Any]]]  # run name → (plugin, options)


@dataclass(frozen=True)
class Prepared:
    """What `prepare` built and chose for a run: nothing is run or written yet."""

    registry: Registry
    task: Any
    problems: list[Any]
    backbone: Any
    scorer_specs: ScorerSpecs  # the run's scorers: asked for, else the backbone's shipped ones
    scorers: dict[str, Any]  # the scorers built, by run name
    plan: Plan
    reference: Reference | None = None  # the row the plan priced passes in FLOPs at

    @property
    def budget(self) -> int:
        """The largest budget of the plan."""
        return self.plan.budget

    @property
    def problem_ids(self) -> list[str]:
        return [p.id for p in self.problems]


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

    return {
        "python": platform.python_version(),
        "dllmbench": __version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        # from its metadata: a run whose plugins need no transformers does not import it
        "transformers": importlib.metadata.version("transformers"),
    }


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


def plugin_entry(reg: Registry, kind: str, name: str, obj: Any) -> dict[str, Any]:
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


def build_manifest(cfg: RunConfig, prepared: Prepared) -> dict[str, Any]:
    reg, task, chosen = prepared.registry, prepared.task, prepared.plan
    problem_ids = prepared.problem_ids
    methods = []
    origins = _origins(cfg, prepared)
    for planned in chosen.methods:
        m: Method = planned.method
        entry = m.manifest_entry(planned.cost)
        if capped(m, prepared.backbone, origins):
            entry["capped"] = True  # the cost is a cap: the method may spend less
        if is_approximate(prepared.backbone):
            entry["approximate"] = True  # decoded with an approximate cache
        if planned.flops is not None:
            entry["flops"] = planned.flops  # per problem, priced at the reference row
        entry["budgets"] = planned.budgets
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
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": cfg.command,
        "versions": _versions(),
        "git_revision": _git_revision(),
        "preset": cfg.preset,
        "sampling": asdict(cfg.sampling),
        "task": {
            **plugin_entry(reg, "task", cfg.task, task),
            "split": cfg.split,
            "limit": cfg.limit,
            "problems": len(problem_ids),
            "problem_ids": problem_ids,
            "data_files": task.data_files(),
        },
        "backbone": plugin_entry(reg, "backbone", cfg.backbone, prepared.backbone),
        "scorers": {
            name: plugin_entry(reg, "scorer", plugin, prepared.scorers[name])
            for name, (plugin, _) in sorted(prepared.scorer_specs.items())
        },
        "budget": prepared.budget,
        "budgets": chosen.budgets,
        "budget_unit": chosen.unit,
        "reference_row": None if prepared.reference is None else prepared.reference.as_dict(),
        "methods": methods,
        "reference": cfg.reference,
        "statistics": {"resamples": cfg.resamples, "level": CONFIDENCE},
        "execution": asdict(cfg.capacity),
    }


def prepare(
    cfg: RunConfig, reg: Registry | None = None, resumed: list[int] | None = None
) -> Prepared:
    """Build every plugin and choose the methods; nothing is run or written yet, and `cfg`
    is left as it is.

    Everything that needs no model is checked before the backbone loads: plugin options,
    scorer checkpoints (their `Config` checks), the plan and `--reference`, the budgets of a
    resumed run (`resumed`), and that a backbone sampling deterministically is not asked for
    several candidates per problem.
    """
    reg = reg or registry()
    if not 1 <= cfg.resamples <= MOST_RESAMPLES:
        raise UserError(f"--resamples must be between 1 and {MOST_RESAMPLES}, got {cfg.resamples}")
    task = reg.task(cfg.task, **cfg.task_config)
    splits = task.splits()
    if cfg.split not in splits:
        raise UserError(
            f"task {cfg.task!r} has no split {cfg.split!r}; splits: {', '.join(splits)}"
        )
    problems = reg.problems(cfg.task, task, cfg.split)
    if cfg.limit is not None:
        if cfg.limit < 1:
            raise UserError(f"--limit must be >= 1, got {cfg.limit}")
        problems = problems[: cfg.limit]
    # the backbone's configuration says how it plans (passes per step, shipped scorers)
    backbone_config = reg.check("backbone", cfg.backbone, **cfg.backbone_config)
    specs = cfg.scorers if cfg.scorers is not None else shipped_scorers(backbone_config)
    for name, (plugin, config) in specs.items():
        _need_trained(name, reg.check("scorer", plugin, **config))
    passes = passes_per_step(backbone_config)
    budgets = cfg.budgets()
    in_flops = unit_of(budgets) == "flops"
    if not in_flops:  # a plan in FLOPs needs the models' shapes: it waits for them
        chosen = _choose(cfg, reg, budgets, passes, set(specs))
        _refuse_budgets(cfg, chosen, resumed)
        if is_deterministic(backbone_config) and not cfg.allow_deterministic:
            _refuse_deterministic(cfg, backbone_config, chosen, passes)
    else:  # a named method whose rows' settings the backbone's Config refuses: before it loads
        refuses = backbone_refuses(cfg.backbone, backbone_config)
        refuse_row_settings(
            reg,
            cfg.methods,
            cfg.sampling.total_steps,
            refuses,
            backbone_varies(reg, cfg.backbone),
            backbone_predicts(reg, cfg.backbone),
        )
    backbone = reg.backbone(cfg.backbone, **cfg.backbone_config)
    # a scorer that asks for `backbone` shares the frozen weights instead of loading twice
    scorers = {
        name: reg.scorer(plugin, shared={"backbone": backbone}, **config)
        for name, (plugin, config) in specs.items()
    }
    for name, scorer in scorers.items():
        _need_trained(name, scorer)  # a scorer whose options alone cannot tell
    s = cfg.sampling
    origins = Origins.of(reg, cfg.backbone, cfg.task, {n: p for n, (p, _) in specs.items()})
    row = reference(
        backbone, scorers, task, problems, s.prompt_style, s.gen_length, s.total_steps, origins
    )
    if in_flops and "denoise" not in row.rates:
        raise UserError(
            f"backbone {cfg.backbone!r} does not say its model's shape, so a FLOP budget cannot "
            "be priced; give the budget in passes, e.g. --budget 1040"
        )
    # passes per step may be known only once the backbone is built
    chosen = _choose(cfg, reg, budgets, passes_per_step(backbone), set(specs), row.rates)
    if in_flops:
        _refuse_budgets(cfg, chosen, resumed)
        if is_deterministic(backbone_config) and not cfg.allow_deterministic:
            _refuse_deterministic(cfg, backbone_config, chosen, passes_per_step(backbone))
    return Prepared(reg, task, problems, backbone, dict(specs), scorers, chosen, row)


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


def _choose(
    cfg: RunConfig,
    reg: Registry,
    budgets: list[int],
    passes_per_step: int,
    scorers: set[str],
    rates: dict[str, int] | None = None,
) -> Plan:
    """The plan; a requested method left out for a missing scorer, a budget no method fits or
    an unknown `--reference` is an error."""
    chosen = plan(
        reg,
        budgets,
        cfg.sampling.total_steps,
        cfg.methods,
        scorers,
        passes_per_step=passes_per_step,
        rates=rates,
        selectors=presets.selector_options(cfg.preset),
        varies=backbone_varies(reg, cfg.backbone),
        predicts=backbone_predicts(reg, cfg.backbone),
        refuses=backbone_refuses(
            cfg.backbone, reg.check("backbone", cfg.backbone, **cfg.backbone_config)
        ),
    )
    if cfg.methods:
        refuse_missing_scorers(chosen)
    for budget in chosen.budgets:
        if not chosen.at(budget):
            fit = [x for x in chosen.left_out if x.budget in (None, budget)]
            reasons = "; ".join(f"{x.family}: {x.reason}" for x in fit)
            at = f" budget {budget}" if len(chosen.budgets) > 1 else ""
            raise UserError(f"no method fits{at}: {reasons}")
    ids = [p.method.id for p in chosen.methods]
    if cfg.reference is not None and cfg.reference not in ids:
        raise UserError(f"--reference {cfg.reference!r} is not among the methods: {', '.join(ids)}")
    return chosen


def _cached_tokens(cfg: RunConfig, prepared: Prepared) -> int:
    """What one problem may hold in a backbone's KV cache, in tokens: every method's pool of
    rows (an upper bound: methods may share rows) × the reference row's canvas."""
    rows = sum(p.method.strategy.pool_size() for p in prepared.plan.methods)
    prompt = prepared.reference.prompt_tokens if prepared.reference is not None else 0
    return rows * (prompt + cfg.sampling.gen_length)


def _origins(cfg: RunConfig, prepared: Prepared) -> Origins:
    """Who plays each part of the run, to name a plugin that breaks its contract."""
    methods = [p.method for p in prepared.plan.methods]
    scorers = {name: plugin for name, (plugin, _) in prepared.scorer_specs.items()}
    parts = {("strategy", m.spec.strategy) for m in methods}
    parts |= {("selector", m.spec.selector) for m in methods}
    return Origins.of(prepared.registry, cfg.backbone, cfg.task, scorers, parts)


def _phases(chosen: Plan) -> list[tuple[int, list[Method]]]:
    """(budget, the methods first planned at it), smallest budget first: once a phase and
    those before it are done, every method planned at its budget is."""
    phases = []
    for budget in chosen.budgets:
        first = [p.method for p in chosen.methods if min(p.budgets) == budget]
        if first:
            phases.append((budget, first))
    return phases


def _resumed_budgets(cfg: RunConfig, rundir: RunDir) -> list[int] | None:
    """The budgets of the run in `rundir`, if it holds one; with no budget given, the run
    resumes at them (`prepare` refuses other budgets)."""
    if not rundir.manifest_path.exists():
        return None
    manifest = rundir.read_manifest()
    ran = manifest.get("budgets")
    if not (isinstance(ran, list) and ran and all(isinstance(b, int) for b in ran)):
        return None  # not a manifest of budgets: the manifest comparison names what differs
    if manifest.get("budget_unit") == "flops":
        return sorted(Flops(b) for b in ran)
    return sorted(ran)


def _refuse_budgets(cfg: RunConfig, chosen: Plan, resumed: list[int] | None) -> None:
    """A run directory keeps its budgets: another list is an error naming both."""
    if resumed is not None and (chosen.budgets != resumed or chosen.unit != unit_of(resumed)):
        given, there = _budget_text(chosen.budgets), _budget_text(resumed)
        raise UserError(
            f"{cfg.run_dir()} was run at --budget {there}, not --budget {given}; resume it "
            f"with --budget {there} (or no --budget), or choose another --out"
        )


def _budget_text(budgets: list[int]) -> str:
    """Budgets as --budget takes them: `1040,4160` or `2.1e+15flops`."""
    return ",".join(f"{b:.6g}flops" if isinstance(b, Flops) else str(b) for b in budgets)


SAVE_EVERY = 5.0  # seconds between saves of this invocation's compute.json entry


OnBudget = Callable[[Results, int], None]


def run(
    cfg: RunConfig,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_budget: OnBudget | None = None,
) -> Outcome:
    """Run (or resume) a benchmark, or one share of it; `on_start(total, done)` and
    `on_record` report progress; `on_budget(results, budget)` is called as soon as every
    method planned at a budget is done, for each budget before the last (a whole run only).
    SIGTERM (a scheduler's pre-emption) ends it as Ctrl-C does: `Terminated`, with every
    record and the compute entry saved."""
    keep_freed_memory()  # a forward reuses the last one's memory instead of faulting it in
    shard = resolve(cfg.shard)
    claim_device(shard)
    with terminated_on_sigterm(), RunDir(cfg.run_dir(), shard) as rundir:
        # the pre-flight is done: a bad or busy run directory was an error before any model
        for notice in rundir.notices:
            say(f"note: {notice}")
        heart = Heartbeat(
            rundir.path / heartbeat_name(shard.suffix if shard else None),
            shard.label if shard else None,
        ).start()
        # every process of a launch watches the others: one that is refused or lost before
        # it claims any work stops them all (the first process merges: without it, or with
        # processes started with other settings, the launch cannot finish)
        watch = Watch(rundir, shard, heart.beat.launch) if shard and shard.launched else None
        try:
            with watch or contextlib.nullcontext():
                outcome = _run_in(cfg, rundir, heart, watch, on_record, on_start, on_budget)
        except KeyboardInterrupt:
            if watch is not None and watch.failure is not None:
                raise watch.failure from None
            raise
        except UserError as exc:
            if watch is not None and not rundir.opened and rundir.manifest_path.exists():
                # refused against the run another process of the launch started: the others
                # read why in this heartbeat, and stop
                heart.update(reason=str(exc))
                heart.stop("stopped")
            elif watch is None:  # refused before its first record: the directory as it was
                rundir.take_back()
            raise
        finally:
            if not rundir.opened and heart.beat.state == "running":
                heart.restore()  # refused before it began: the directory stays as it was
            elif heart.beat.state == "running":
                heart.stop("stopped")
        heart.stop("finished")
        return outcome


@contextlib.contextmanager
def terminated_on_sigterm() -> Iterator[None]:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread for the duration,
    so it unwinds as Ctrl-C does; elsewhere (a thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated()

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _run_in(
    cfg: RunConfig,
    rundir: RunDir,
    heart: Heartbeat,
    watch: Watch | None,
    on_record: Callable[[dict[str, Any]], None] | None,
    on_start: Callable[[int, int], None] | None,
    on_budget: OnBudget | None = None,
) -> Outcome:
    resumed = _resumed_budgets(cfg, rundir)
    if resumed is not None and cfg.budget is None:  # no budget given: the run's own
        cfg = dataclasses.replace(cfg, budget=resumed)
    prepared = prepare(cfg, resumed=resumed)
    problems, problem_ids = prepared.problems, prepared.problem_ids
    methods = [p.method for p in prepared.plan.methods]
    manifest = build_manifest(cfg, prepared)
    _refuse_a_share_with_nothing_to_do(rundir, manifest)
    previous = rundir.open(manifest)
    shard = rundir.shard
    claimed = shard is not None and shard.launched
    mine = shard.share(problems) if shard and not claimed else problems
    done = {(r["problem"], r["method"]) for r in previous}
    ids = {p.id for p in mine}
    found = sum(p in ids for p, _ in done)  # records of this share (of the run) written already
    if not claimed:
        heart.update(planned=len(mine) * len(methods) - found)
    if on_start is not None:
        on_start(len(mine) * len(methods), found)
    engine = Engine(
        backbone=prepared.backbone,
        scorers=prepared.scorers,
        task=prepared.task,
        methods=methods,
        sampling=cfg.sampling,
        capacity=sized_to_memory(cfg.capacity, prepared.backbone, _cached_tokens(cfg, prepared)),
        origins=_origins(cfg, prepared),
    )

    def summary() -> Results:
        return summarize_run(
            rundir, manifest, problem_ids, reference=cfg.reference, resamples=cfg.resamples
        )

    with Invocation(rundir, engine.ledger, manifest, on_record, SAVE_EVERY, heart) as invocation:
        if claimed:
            _run_claimed(engine, rundir, heart, watch, invocation, problems, methods, done)
            results = invocation.conclude(summary, problem_ids)
            return Outcome(results, rundir.path, found, invocation.written, prepared.plan, shard)
        phases = _phases(prepared.plan) if cfg.by_budget else [(prepared.budget, methods)]
        if len(phases) > 1:
            # the first unfinished problem whole, every method at every budget, before the
            # phases: each method meets the run's largest settings in its first seconds, and
            # an interrupted run keeps at least one problem that is done at every budget
            first = next((p for p in mine if any((p.id, m.id) not in done for m in methods)), None)
            if first is not None:
                written = engine.run([first], skip=done, on_record=invocation.keep)
                done |= {(r["problem"], r["method"]) for r in written}
        for n, (budget, _) in enumerate(phases):
            later = {m.id for _, ms in phases[n + 1 :] for m in ms}
            skip = done | {(p.id, m) for p in mine for m in later}
            written = engine.run(mine, skip=skip, on_record=invocation.keep, keep_rows=bool(later))
            done |= {(r["problem"], r["method"]) for r in written}
            if later and on_budget is not None and shard is None:
                on_budget(
                    summarize_records(
                        rundir,
                        manifest,
                        problem_ids,
                        reference=cfg.reference,
                        resamples=cfg.resamples,
                    ),
                    budget,
                )
        results = invocation.conclude(summary, problem_ids)
    return Outcome(results, rundir.path, found, invocation.written, prepared.plan, shard)


def _refuse_a_share_with_nothing_to_do(rundir: RunDir, manifest: dict[str, Any]) -> None:
    """`--shard I/N` into a run whose records of that share are all written by others (a whole
    run, shares of another count) and where this share never ran: it would only add an empty
    share that `status` and `merge` then list. One line instead; a share that ran here before
    resumes as ever (a requeued array task that had finished writes nothing, and succeeds)."""
    shard = rundir.shard
    if shard is None or shard.launched or not rundir.manifest_path.exists():
        return
    if rundir.samples_path.exists() or rundir.compute_path.exists():
        return  # this share ran here: running it again resumes it
    if manifest_differences(rundir.read_manifest(), json.loads(json.dumps(manifest))):
        return  # another run: `open` names the differences
    ids = [str(x) for x in manifest["task"]["problem_ids"]]
    methods = [m["id"] for m in manifest["methods"]]
    have = {(r["problem"], r["method"]) for r in rundir.read_records()}
    if all((p, m) in have for p in shard.share(ids) for m in methods):
        finished = " (it is finished)" if len(have) >= len(ids) * len(methods) else ""
        writers = [f"--shard {', '.join(s.label for s in shards_in(rundir.path))}"]
        if not writers[0].removeprefix("--shard "):
            writers = []
        if (rundir.path / "samples.jsonl").exists():  # a whole run wrote some, or all
            writers.append("a run without --shard")
        by = f"by {' and '.join(writers)}" if writers else "by a run without --shard"
        raise UserError(
            f"{rundir.path} holds every record of share {shard.label} already, written "
            f"{by}{finished}: there is nothing for this share to run; "
            f"drop --shard (dllmbench status {rundir.path} says how far the run is), or "
            "choose another --out"
        )


def _run_claimed(
    engine: Engine,
    rundir: RunDir,
    heart: Heartbeat,
    watch: Watch | None,
    invocation: Invocation,
    problems: list[Any],
    methods: list[Method],
    done: set[tuple[str, str]],
) -> None:
    """A process of a launched run: claim chunks and run them until none is free; the first
    process (`watch` is its watch over the others) then waits until every chunk is done,
    taking over any whose holder is gone, and until the others have ended (so that their
    compute entries are final when it merges)."""
    shard = rundir.shard
    assert shard is not None
    work = ClaimedWork(
        claims=Claims(
            rundir.path,
            [p.id for p in problems],
            shard.label,
            heart.token,
            size=chunk_size(len(problems), shard.count),
            processes=shard.count,
            heart=heart,
        ),
        problems={p.id: p for p in problems},
        methods=[m.id for m in methods],
        skip=set(done),
        rundir=rundir,
    )

    def keep(record: dict[str, Any]) -> None:
        if work.write(record, invocation.keep):  # only while this process holds its chunk
            work.recorded(record)

    said = time.monotonic()
    while True:
        engine.run(work.stream(), skip=work.skip, on_record=keep)
        if watch is None or not shard.merges or (work.finished() and watch.others_ended()):
            return
        started = time.monotonic()
        heart.doing("waiting")  # for the others: not stuck
        time.sleep(POLL_SECONDS)  # chunks held by live processes: wait, then look again
        heart.doing("forward")
        invocation.waiting(time.monotonic() - started)
        if time.monotonic() - said >= SAY_EVERY:
            say(f"share {shard.label}: waiting for {work.waiting_for()}")
            said = time.monotonic()
