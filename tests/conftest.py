"""Tests run with the deterministic doubles registered as plugins, so the contract kit
checks them too and the engine tests have a backbone, a task and a scorer."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dllmbench.cli import main, spin_briefly
from dllmbench.loading.manager import PluginSelection
from dllmbench.loading.registry import Registry, registry, selection, use_plugins

DOUBLES = "dllmbench.testing.doubles"

# torch is not loaded yet: its threads here and in every child spin as briefly as the command's
spin_briefly()


def share_the_cores() -> None:
    """Under xdist (`-n auto`) each worker's torch, and every child it starts, takes its share
    of the cores instead of all of them: N workers of all the cores each would fight over
    them. Set before torch loads (the environment is read once); a given OMP_NUM_THREADS wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)


share_the_cores()


def hide_the_gpus() -> None:
    """The suite tests the CPU paths, each in the dtype it names; on a machine with a GPU the
    backbones' defaults (cuda, bfloat16) would take every model there instead. Hidden before
    torch loads, from this process and every child (the GPU's own check is
    `benchmarks/bench_gpu.py --check`)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


hide_the_gpus()


def pytest_configure(config):
    """The doubles are plugins for the whole session: for the registry, and in the environment
    for the command line (run here or in a child process) and the contract kit, which read
    it. Set before collection, since the kit parametrises its checks over the plugins."""
    patch = pytest.MonkeyPatch()
    patch.setenv("DLLMBENCH_PLUGIN_MODULES", DOUBLES)
    patch.delenv("DLLMBENCH_PLUGINS", raising=False)
    patch.delenv("DLLMBENCH_DISABLE", raising=False)
    config.stash[ENVIRONMENT] = patch
    use_plugins(PluginSelection(modules=(DOUBLES,)))


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marks
def pytest_collection_modifyitems(config, items):
    """A test that reads the session's demo run is `slow`, whatever it is marked: it waits
    for a run of the demo model. The `slow` tests first, in their order, then the rest: on
    workers (`-n auto`) the long tests start early and short ones are left to fill the end, so
    no worker finishes minutes before the other. Every worker collects and orders the same
    list."""
    for item in items:
        if "demo_run" in item.fixturenames:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config):
    config.stash[ENVIRONMENT].undo()


ENVIRONMENT = pytest.StashKey[pytest.MonkeyPatch]()


@pytest.fixture(autouse=True)
def _the_doubles_after_each_test():
    """A test that runs a command in an environment of its own (`main` selects the plugins the
    environment names) leaves the process-wide registry on the doubles again, whatever test
    comes next in this process."""
    yield
    use_plugins(PluginSelection(modules=(DOUBLES,)))


@pytest.fixture
def registry_with(monkeypatch):
    """`registry_with(*modules, allow=None, disable=())`: the registry with the doubles and
    `modules` as plugins, for one test; the environment says the same, for the command line."""

    def use(*modules: str, allow: tuple[str, ...] | None = None, disable=()) -> Registry:
        selection = PluginSelection((DOUBLES, *modules), allow, tuple(disable))
        monkeypatch.setenv("DLLMBENCH_PLUGIN_MODULES", ",".join(selection.modules))
        if allow is not None:
            monkeypatch.setenv("DLLMBENCH_PLUGINS", ",".join(allow))
        if disable:
            monkeypatch.setenv("DLLMBENCH_DISABLE", ",".join(disable))
        use_plugins(selection)
        return registry()

    return use  # the doubles alone again after the test: `_the_doubles_after_each_test`


def toy_argv(size: int, backbone: str = "toy", prm: bool = True) -> list[str]:
    """`run` on the doubles: the toy task of `size` problems, `backbone`, the toy ORM (and PRM
    unless `prm` is false), T = 8 and 5 generated tokens."""
    scorers = ["--scorer", "prm=toy"] if prm else []
    return [
        "run",
        "--task",
        f"toy_sum:size={size}",
        "--backbone",
        backbone,
        *scorers,
        "--scorer",
        "orm=toy:partial=false",
        "--steps",
        "8",
        "--gen-length",
        "5",
    ]


# A small finished-run command on the doubles: a few seconds, every file of a run directory.
TOY_RUN = [
    *toy_argv(4, prm=False),
    "--methods",
    "vanilla,majority,orm_rerank,oracle",
    "--budget",
    "72",
    "--resamples",
    "200",
]


@dataclass
class Result:
    code: int
    out: str
    err: str


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative name → bytes), to show a command changed nothing."""
    path = Path(path)
    if not path.exists():
        return {}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): p.read_bytes() for p in files}


def assert_user_error(result: Result, *needles: str) -> None:
    """Exit status 2, one line (at most two) on stderr naming what was wrong, no traceback."""
    lines = result.err.strip().splitlines()
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err, result.err
    assert 1 <= len(lines) <= 2, result.err
    for needle in needles:
        assert needle in result.err, (needle, result.err)


@pytest.fixture
def cli(capsys):
    """Run `dllmbench ARGV` in this process: exit status (SystemExit included), stdout, stderr.
    The command sets the process's plugins from the environment, as it does when run; the
    test's own selection is back once it returns."""

    def call(*argv: str) -> Result:
        before = selection()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            use_plugins(before)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call


def cli_subprocess(*argv: str, cwd: Path | None = None, env: dict | None = None, timeout=60):
    """Run `python -m dllmbench.cli ARGV` in a child process (a real exit status and stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dllmbench.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def finished_run_once(tmp_path_factory) -> Path:
    """The toy run, made once per session; tests get a copy (`finished_run`)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*map(str, TOY_RUN), "--out", str(out)]) == 0
    return out


@dataclass(frozen=True)
class DemoRun:
    cwd: Path  # the folder it ran in
    path: Path  # the run directory it wrote (under cwd/runs)
    out: str  # what it printed


DEMO_PROBLEMS = 6  # the session's demo run: `dllmbench run --limit 6`, launched on two processes
# `torchrun --standalone --nproc_per_node 2`, through this Python
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
# what a launcher or a Slurm job sets: a child of the tests starts without them
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
)


def shared_by_the_workers(factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this session sees: the base temp folder, or under xdist
    (`-n auto`) its parent, which the workers share."""
    base = factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """`torchrun --nproc_per_node 2 -m dllmbench run --limit 6`, once per session (the first
    worker to ask launches it, under a lock; the others wait and read it): the shipped demo,
    every family at both budgets, written under runs/ of the folder it ran in, with the user's
    plugins (no doubles), as a cluster user launches it. tests/fixtures holds the same run made
    in one process, which it must equal (test_shards.py). Tests that write next to it take a
    copy."""
    home = shared_by_the_workers(tmp_path_factory) / "demo"
    cwd, printed = home / "cwd", home / "printed.txt"
    with open(f"{home}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():  # written last: a run that failed leaves none
            shutil.rmtree(home, ignore_errors=True)
            cwd.mkdir(parents=True)
            skip = {*LAUNCHER_VARIABLES, "DLLMBENCH_PLUGIN_MODULES"}
            env = {k: v for k, v in os.environ.items() if k not in skip}
            argv = [*TORCHRUN, "-m", "dllmbench", "run", "--limit", str(DEMO_PROBLEMS)]
            proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            printed.write_text(proc.stdout)
    (path,) = (cwd / "runs").iterdir()
    return DemoRun(cwd, path, printed.read_text())


@pytest.fixture
def finished_run(tmp_path, finished_run_once):
    """A finished toy run directory (manifest, samples, results, leaderboard, compute) of this
    test's own: a copy of the session's one run."""
    out = tmp_path / "run"
    shutil.copytree(finished_run_once, out)
    return out


def pip_install(source: Path, target: Path) -> Path:
    """pip-install the package at `source` into the folder `target` (no index, no deps, no
    build isolation: nothing is downloaded), as a user installs a plugin package."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return target
