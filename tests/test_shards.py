"""Sharded runs: shares of the problems into one run directory, the merge, launched runs
(`accelerate launch`), and compute.json's per-process counts and padding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_user_error, cli_subprocess, toy_argv
from test_rundir import assert_same_records

from dllmbench.core.errors import UserError
from dllmbench.execution.scheduler import Capacity
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard, from_launcher, parse_shard, resolve

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
METHODS = "vanilla,majority,orm_rerank,prm_guided,smc_vote,oracle"
SIZE = 7  # shares of 4 and 3 problems
RUN = [*toy_argv(SIZE), "--methods", METHODS, "--budget", "72", "--resamples", "200"]
RECORDS = SIZE * len(METHODS.split(","))


LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, with the doubles and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    return {**env, "DLLMBENCH_PLUGIN_MODULES": "dllmbench.testing.doubles", **extra}


def lines(out: Path) -> list[dict]:
    """Every record line of every samples file (duplicates included)."""
    files = sorted(out.glob("samples*.jsonl"))
    return [json.loads(x) for f in files for x in f.read_text().splitlines()]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The run in one process, to compare the others with."""
    out = tmp_path_factory.mktemp("whole") / "run"
    result = cli_subprocess(*RUN, "--out", out, env=child_env(), timeout=300)
    assert result.code == 0, result.err
    return out


def same_run(a: Path, b: Path) -> None:
    """Identical decisions, floats to 1e-6, identical results.json (accuracies and all)."""
    assert_same_records(RunDir(a), RunDir(b))
    assert (a / "results.json").read_text() == (b / "results.json").read_text()
    assert (a / "leaderboard.md").read_text() == (b / "leaderboard.md").read_text()


def test_python_m_dllmbench_is_the_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dllmbench", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.startswith("dllmbench "), proc


def test_a_share_is_every_nth_problem_in_order():
    items = list(range(10))
    shares = [Shard(i, 3).share(items) for i in (1, 2, 3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert parse_shard("2/4") == Shard(2, 4)
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(Exception, match="want I/N"):
            parse_shard(bad)


def test_the_launchers_environment_gives_the_share():
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}
    assert from_launcher(env) == Shard(3, 4, launched=True)
    assert from_launcher({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == Shard(
        2, 2, launched=True
    )
    assert from_launcher({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert resolve(None, {}) is None
    with pytest.raises(UserError, match="--shard 1/2 under a launcher of 4"):
        resolve(Shard(1, 2), env)


def test_slurm_tasks_and_array_jobs_give_the_share():
    step = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1"}
    assert from_launcher(step) == Shard(2, 3, launched=True, local_rank=1)
    assert from_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task
    # torchrun inside a Slurm allocation: torchrun's variables win
    assert from_launcher({**step, "RANK": "0", "WORLD_SIZE": "2"}) == Shard(1, 2, launched=True)
    array = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "5"}
    assert from_launcher(array) == Shard(3, 3)  # a fixed share: nobody waits, merge joins
    assert not from_launcher(array).merges
    with pytest.raises(UserError, match=r"array task 9 .* is not one of its 3 shares"):
        from_launcher({**array, "SLURM_ARRAY_TASK_ID": "9"})
    with pytest.raises(UserError, match="Slurm says rank 3 of 3"):
        from_launcher({"SLURM_PROCID": "3", "SLURM_NTASKS": "3"})


@pytest.mark.parametrize("value", ["²", "٢", "2.0", "-1", "two"])
def test_a_launcher_variable_that_is_not_a_whole_number_is_one_line(value):
    with pytest.raises(UserError, match="is not a whole number; unset it"):
        from_launcher({"WORLD_SIZE": value})


def test_an_array_of_three_then_merge_equals_one_process(tmp_path, whole):
    """Three array tasks with Slurm's variables set by hand (any order), then the merge."""
    out = tmp_path / "array"
    for task in (3, 1, 2):
        env = child_env(
            SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT="3", SLURM_ARRAY_TASK_MIN="1"
        )
        result = cli_subprocess(*RUN, "--out", out, env=env, timeout=300)
        assert result.code == 0, result.err
    assert not (out / "results.json").exists()
    merged = cli_subprocess("merge", out, env=child_env(), timeout=300)
    assert merged.code == 0, merged.err
    assert len(lines(out)) == RECORDS
    same_run(whole, out)


def test_slurm_tasks_of_one_step_equal_one_process(tmp_path, whole):
    """Two tasks of a job step (SLURM_PROCID 0 and 1 of SLURM_NTASKS 2, set by hand): the
    first waits for the second and merges."""
    out = tmp_path / "step"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dllmbench", *map(str, RUN), "--out", str(out)],
            env=child_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert (out / "results.json").exists()
    assert len(lines(out)) == RECORDS
    same_run(whole, out)


def test_shares_then_merge_equal_one_process(tmp_path, cli, whole):
    out = tmp_path / "sharded"
    first = cli(*RUN, "--out", out, "--shard", "2/2")
    assert first.code == 0, first.err
    assert "dllmbench merge" in first.out and not (out / "results.json").exists()
    missing = cli("merge", out)
    assert_user_error(missing, "share 1/2", "24 of 24 records missing")
    assert cli(*RUN, "--out", out, "--shard", "1/2").code == 0
    merged = cli("merge", out)
    assert merged.code == 0, merged.err
    assert len(lines(out)) == RECORDS  # each record once
    same_run(whole, out)


def test_merge_of_a_directory_without_a_run_is_one_line(tmp_path, cli):
    assert_user_error(cli("merge", tmp_path), "no manifest.json")


def test_two_shares_run_at_once_and_the_same_share_twice_is_refused(tmp_path, cli):
    out = tmp_path / "r"
    holder = RunDir(out, Shard(1, 2))
    holder.acquire()  # share 1/2 is running
    try:
        again = cli(*RUN, "--out", out, "--shard", "1/2")
        assert_user_error(again, "share 1/2", "is already running", f"pid {os.getpid()}")
        whole_run = cli(*RUN, "--out", out)
        assert_user_error(whole_run, "in use by another dllmbench run")
        other = cli(*RUN, "--out", out, "--shard", "2/2")
        assert other.code == 0, other.err
        busy = cli("merge", out)
        assert_user_error(busy, "share 1/2", "still running")
    finally:
        holder.release()
    assert cli(*RUN, "--out", out, "--shard", "1/2").code == 0
    assert cli("merge", out).code == 0


def test_compute_json_counts_every_process_and_the_padding(tmp_path, cli):
    out = tmp_path / "r"
    for share in ("1/2", "2/2"):
        assert cli(*RUN, "--out", out, "--shard", share).code == 0
    assert cli("merge", out).code == 0
    compute = json.loads((out / "compute.json").read_text())
    entries = compute["invocations"]
    assert [(e["shard"], e["finished"], e["records_written"]) for e in entries] == [
        ("1/2", True, 24),
        ("2/2", True, 18),
    ]
    total = compute["total"]
    assert total["processes"] == 2 and total["records_written"] == RECORDS
    passes: dict[str, int] = {}
    for record in lines(out):
        for kind, n in record["ledger"]["passes"].items():
            passes[kind] = passes.get(kind, 0) + n
    assert total["passes"] == passes  # every pass charged, once
    for kind, numbers in total["physical"].items():
        assert numbers["rows"] == sum(e["physical"][kind]["rows"] for e in entries)
        assert numbers["tokens"] >= numbers["real_tokens"] > 0
        assert numbers["padding"] == round(numbers["tokens"] / numbers["real_tokens"], 6)
    # toy prompts differ in length, so some batch holds padding
    assert total["physical"]["denoise"]["padding"] > 1.0


def computed(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_batches_compute_the_fewest_tokens_within_the_fewest_forwards():
    capacity = Capacity(batch_rows=4)
    lengths = [20, 10, 20, 10, 10, 20]
    cut = capacity.batches(lengths)
    assert [[lengths[i] for i in b] for b in cut] == [[10, 10, 10], [20, 20, 20]]
    full = [10] * 5 + [11] * 3  # no spare slot: as full as the row cap allows
    assert [len(b) for b in capacity.batches(full)] == [4, 4]
    for n in range(1, 40):
        mixed = [10 + (i * 7) % 5 for i in range(n)]
        cut = capacity.batches(mixed)
        assert len(cut) == -(-n // 4)  # never more forwards than filling every batch
        assert sorted(i for b in cut for i in b) == list(range(n))
        order = sorted(range(n), key=lambda i: mixed[i])
        filled = [order[i : i + 4] for i in range(0, n, 4)]
        assert computed(mixed, cut) <= computed(mixed, filled)
    capped = Capacity(batch_rows=4, batch_tokens=30)  # the token cap still holds
    assert all(len(b) * max(lengths[i] for i in b) <= 30 for b in capped.batches(lengths))


def accelerate(*argv: object, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["accelerate", "launch", "--cpu", "--num_processes", "2", "-m", "dllmbench"]
        + [str(a) for a in argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_accelerate_launch_of_two_processes_equals_one(tmp_path, whole):
    out = tmp_path / "launched"
    proc = accelerate(*RUN, "--out", out, env=child_env(), cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "Oracle@9" in stdout  # the first process printed the merged leaderboard
    pids = {e["pid"] for e in json.loads((out / "compute.json").read_text())["invocations"]}
    assert len(pids) == 2  # two processes ran, one share each
    assert len(lines(out)) == RECORDS
    same_run(whole, out)


def test_a_killed_share_is_resumed_by_launching_again(tmp_path):
    out = tmp_path / "killed"
    slow = [*RUN, "--max-problems", "1"]
    slow[slow.index("toy")] = "toy_slow:delay=0.1"
    env = child_env(
        DLLMBENCH_PLUGIN_MODULES="dllmbench.testing.doubles,shard_doubles",
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )
    proc = accelerate(*slow, "--out", out, env=env, cwd=tmp_path)
    second = out / "samples.shard-2-of-2.jsonl"
    deadline = time.monotonic() + 300
    while not (second.exists() and second.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    holder = (out / ".lock.shard-2-of-2").read_text().split()
    os.kill(int(holder[1]), signal.SIGKILL)  # "pid PID on HOST"
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "share 2/2 stopped without finishing" in stderr, stderr
    kept = len(lines(out))
    assert 2 <= kept < RECORDS and not (out / "results.json").exists()

    again = accelerate(*slow, "--out", out, env=env, cwd=tmp_path)
    _, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
    keys = [(r["problem"], r["method"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == RECORDS  # no duplicate, none missing
    results = json.loads((out / "results.json").read_text())
    assert all(m["problems"] == SIZE for m in results["methods"])


def test_the_demo_launched_on_two_processes_equals_one_process(tmp_path):
    """`accelerate launch --cpu --num_processes 2 -m dllmbench run --limit 6` against
    `dllmbench run --limit 6`: the shipped model, every family at both demo budgets."""
    env = child_env()
    env.pop("DLLMBENCH_PLUGIN_MODULES")
    single = cli_subprocess("run", "--limit", "6", "--out", tmp_path / "B", env=env, timeout=900)
    assert single.code == 0, single.err
    proc = accelerate("run", "--limit", "6", "--out", tmp_path / "A", env=env, cwd=tmp_path)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    a, b = RunDir(tmp_path / "A"), RunDir(tmp_path / "B")
    # A row's float32 scores depend on the width its batch is padded to (SDPA's reductions
    # run over it), and the processes' batches hold other neighbours: the demo's scorer logits
    # differ by up to 2.4e-6 (1e-6 relative would be 1e-7 on a logit of 0.1)
    assert_same_records(a, b, abs_tol=1e-5)
    accuracies = [
        {(m["id"], m["budget"]): (m["accuracy"], m["problems"]) for m in run["methods"]}
        for run in (json.loads((d / "results.json").read_text()) for d in (a.path, b.path))
    ]
    assert accuracies[0] == accuracies[1] and len(accuracies[0]) >= 10


def test_a_packed_run_makes_the_same_records_and_counts_what_it_computed(tmp_path, cli):
    """`--backbone tiny:attention=packed` against the padded forward: identical records, and
    compute.json counts the packed tokens (whole 128-token blocks of the rows' own)."""
    runs = {}
    for attention in ("sdpa", "packed"):
        out = tmp_path / attention
        argv = ["run", "--task", "arith", "--backbone", f"tiny:attention={attention}"]
        argv += ["--steps", "24", "--gen-length", "24", "--prompt", "fewshot", "--limit", "2"]
        result = cli(*argv, "--methods", "vanilla,majority", "--budget", "208", "--out", out)
        assert result.code == 0, result.err
        runs[attention] = json.loads((out / "compute.json").read_text())["total"]["physical"]
    assert_same_records(RunDir(tmp_path / "sdpa"), RunDir(tmp_path / "packed"))
    padded, packed = runs["sdpa"]["denoise"], runs["packed"]["denoise"]
    assert packed["real_tokens"] == padded["real_tokens"]
    assert packed["forwards"] == padded["forwards"]
    assert packed["tokens"] % 128 == 0
    assert 0 <= packed["tokens"] - packed["real_tokens"] < 128 * packed["forwards"]
