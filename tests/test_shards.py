"""Sharded runs: shares of the problems into one run directory, the merge, launched runs
(torchrun, a Slurm job step) claiming chunks, heartbeats, status, and compute.json's
per-process counts, accounts and padding."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    DEMO_PROBLEMS,
    LAUNCHER_VARIABLES,
    TORCHRUN,
    TOY_RUN,
    assert_user_error,
    cli_subprocess,
    toy_argv,
)
from test_rundir import assert_same_records

from dllmbench.core.errors import UserError
from dllmbench.execution.scheduler import Capacity
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard, from_launcher, parse_shard, resolve

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
ONE_PROCESS = TESTS / "fixtures" / "demo6_one_process.json.gz"
METHODS = "vanilla,majority,orm_rerank,prm_guided,smc_vote,oracle"
SIZE = 7  # shares of 4 and 3 problems
RUN = [*toy_argv(SIZE), "--methods", METHODS, "--budget", "72", "--resamples", "200"]
RECORDS = SIZE * len(METHODS.split(","))


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
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    assert from_launcher(env) == Shard(3, 4, launched=True)
    assert from_launcher({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == Shard(
        2, 2, launched=True
    )
    assert from_launcher({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert resolve(None, {}) is None
    with pytest.raises(UserError, match="--shard 1/2 under a launcher of 4"):
        resolve(Shard(1, 2), env)


def test_launcher_variables_without_their_launcher_are_one_line():
    """A stray WORLD_SIZE (no rendezvous address beside it) would make this process wait for
    others nobody starts; accelerate's CPU launch of several processes starts one without MPI
    (its environment then has MASTER_ADDR and no WORLD_SIZE): both refused, naming torchrun."""
    with pytest.raises(UserError, match="WORLD_SIZE=2 is set but no launcher started"):
        resolve(None, {"RANK": "0", "WORLD_SIZE": "2"})
    # a rendezvous address and a world but no rank: not rank 0 of 2 running everything
    with pytest.raises(UserError, match=r"WORLD_SIZE=2 is set but RANK is not: .* torchrun"):
        resolve(None, {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    lone = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(UserError, match=r"accelerate launch started one process .* torchrun"):
        resolve(None, lone)
    assert resolve(None, {"ACCELERATE_USE_CPU": "True"}) is None  # one process asked for


def test_slurm_tasks_and_array_jobs_give_the_share():
    step = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1"}
    assert from_launcher(step) == Shard(2, 3, launched=True, local_rank=1)
    assert from_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task
    # torchrun inside a Slurm allocation: torchrun's variables win
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node0"}
    assert from_launcher({**step, **torchrun}) == Shard(1, 2, launched=True)
    array = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "5"}
    assert from_launcher(array) == Shard(3, 3)  # a fixed share: nobody waits, merge joins
    assert not from_launcher(array).merges
    with pytest.raises(UserError, match=r"array task 9 .* is not one of its 3 evenly spaced"):
        from_launcher({**array, "SLURM_ARRAY_TASK_ID": "9"})
    # --array=1-5:2 (tasks 1, 3, 5): shares 1, 2 and 3, each once
    stepped = {**array, "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "5"}
    stepped["SLURM_ARRAY_TASK_STEP"] = "2"
    shares = [from_launcher({**stepped, "SLURM_ARRAY_TASK_ID": str(t)}) for t in (1, 3, 5)]
    assert shares == [Shard(1, 3), Shard(2, 3), Shard(3, 3)]
    # --array=1,4,9 (not evenly spaced): every task refused, the first too
    uneven = {**stepped, "SLURM_ARRAY_TASK_MAX": "9", "SLURM_ARRAY_TASK_STEP": "1"}
    for task in (1, 4, 9):
        with pytest.raises(UserError, match="evenly spaced shares; number the array's tasks"):
            from_launcher({**uneven, "SLURM_ARRAY_TASK_ID": str(task)})
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


def test_three_tasks_on_48_problems_write_a_third_each(tmp_path, cli):
    """Three tasks of a Slurm step on 48 problems at the default --max-problems (32), started
    together: each claims at most its share of what remains, so each writes 16 problems'
    records (within a chunk of 4), where claiming 32 at once left the third with none; the
    decisions equal one process's."""
    argv = [*toy_argv(48, prm=False), "--methods", "vanilla,majority", "--budget", "32"]
    argv.remove("--scorer")
    argv.remove("orm=toy:partial=false")
    one = cli(*argv, "--out", tmp_path / "one")
    assert one.code == 0, one.err
    out = tmp_path / "three"
    slow = [*argv]
    slow[slow.index("toy")] = "toy_slow:delay=1.0"  # 10 s of work each: they overlap
    procs = slurm_step(*slow, "--out", out, env=slow_env(), tasks=3)
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    problems = [
        len({json.loads(x)["problem"] for x in (out / f"samples.shard-{i}-of-3.jsonl").open()})
        for i in (1, 2, 3)
    ]
    assert sum(problems) == 48 and all(12 <= n <= 20 for n in problems), problems
    assert_same_records(RunDir(tmp_path / "one"), RunDir(out))
    accuracy = [
        [(m["id"], m["accuracy"]) for m in json.loads((d / "results.json").read_text())["methods"]]
        for d in (tmp_path / "one", out)
    ]
    assert accuracy[0] == accuracy[1]


SCALING = TESTS.parent / "docs" / "scaling.md"


def sbatch_script() -> str:
    """The sbatch script of docs/scaling.md's "64 GPUs under Slurm"."""
    text = SCALING.read_text(encoding="utf-8")
    section = text.split("## 64 GPUs under Slurm", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def script_commands(script: str) -> tuple[dict[str, str], list[list[str]]]:
    """The script's #SBATCH options, and its command lines (continuations joined) that start
    with `srun` or run `dllmbench`, as words."""
    import shlex

    options = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            options[key] = value
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        if line.startswith("#") or "dllmbench" not in line:
            continue
        line = line.split("||", 1)[1] if "||" in line else line
        commands.append(shlex.split(line))
    return options, commands


def test_the_sbatch_script_of_the_docs_runs(tmp_path, cli, whole, monkeypatch):
    """docs/scaling.md's sbatch script for 64 GPUs: its #SBATCH lines ask for 64 tasks of one
    GPU each, SIGTERM to the tasks (not `B:`) before the time limit, and requeue; its `srun`
    line keeps the step alive when one task fails; and its `srun … dllmbench run` and
    `dllmbench merge` lines, run as written for two tasks with Slurm's variables set by hand
    (task 1 in a child process, task 0 here) on the test doubles, equal one process."""
    options, commands = script_commands(sbatch_script())
    assert int(options["--nodes"]) * int(options["--ntasks-per-node"]) == 64
    assert options["--gpus-per-task"] == "1" and "--requeue" in options
    assert options["--signal"].startswith("TERM@") and int(options["--signal"][5:]) > 30
    (srun, merge) = commands
    at = srun.index("dllmbench")
    assert srun[0] == "srun" and "--kill-on-bad-exit=0" in srun[:at]
    run, merging = srun[at + 1 :], merge[1:]
    assert run == ["run", "${ARGS[@]}", "--out", "$RUN"] and merging == ["merge", "$RUN"]
    out = tmp_path / "slurm"
    words = {"${ARGS[@]}": RUN[1:], "$RUN": [str(out)]}
    argv = [w for word in run for w in words.get(word, [word])]
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    task1 = subprocess.Popen(
        [sys.executable, "-m", "dllmbench", *argv],
        env=child_env(**step, SLURM_PROCID="1", SLURM_LOCALID="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**step, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(name, value)
    # task 0 runs in this process, which started long before: it starts with the launch now
    started = time.time()
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: started)
    try:
        task0 = cli(*argv)
    finally:
        _, err1 = task1.communicate(timeout=600)
    assert (task0.code, task1.returncode) == (0, 0), [*task0.err.splitlines()[-1:], err1]
    monkeypatch.delenv("SLURM_NTASKS")
    merged = cli(*[w for word in merging for w in words.get(word, [word])])
    assert merged.code == 0, merged.err
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


def test_shares_not_started_are_named_by_status_and_merge(tmp_path, cli):
    """Share 5/5 of four problems has none: it writes no samples file, yet status and merge
    name the four shares that never ran (merge said "missing 16 of 16 records", status
    listed 5/5 alone)."""
    out = tmp_path / "run"
    assert cli(*TOY_RUN, "--out", out, "--shard", "5/5").code == 0
    assert not list(out.glob("samples*"))
    found = cli("status", out, "--json")
    assert json.loads(found.out)["not_started"] == ["1/5", "2/5", "3/5", "4/5"]
    assert "not started: share 1/5, 2/5, 3/5, 4/5" in cli("status", out).out
    missing = cli("merge", out)
    assert_user_error(missing, "missing share 1/5 (4 of 4 records missing), share 2/5", "4/5")


def test_a_rank_refused_for_another_budget_stops_the_others(tmp_path, cli, monkeypatch):
    """A process of a launch started with another --budget than the run its directory holds
    (started first by another process of the launch, or earlier) is refused, and leaves its
    heartbeat saying so: the other processes' watches stop them with its line, instead of
    one of them running the whole launch at its own budget."""
    from dllmbench.running.launched import Watch
    from dllmbench.storage.heartbeat import read_beats

    out = tmp_path / "r"
    started = time.time()
    assert cli(*RUN, "--out", out, "--shard", "2/2").code == 0  # the run, at --budget 72
    other = [*RUN]
    other[other.index("72")] = "80"
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    refused = cli(*other, "--out", out)
    assert_user_error(refused, "was run at --budget 72, not --budget 80")
    beat = read_beats(out)["1/2"]
    assert beat.state == "stopped" and "--budget 72, not --budget 80" in str(beat.reason)
    watch = Watch(RunDir(out), Shard(2, 2, launched=True), None, started=started)
    error = watch.check(time.time())
    assert error is not None and str(error).startswith("share 1/2 (pid")
    assert "of this launch was refused: " in str(error) and "--budget 72" in str(error)


def test_status_of_a_merged_run_whose_samples_were_cut_is_not_merged(cli, finished_run):
    """results.json written, then samples.jsonl cut mid-line: the records are missing, and
    `status` says so instead of `merged`."""
    samples = finished_run / "samples.jsonl"
    data = samples.read_bytes()
    samples.write_bytes(data[: len(data) // 2])
    shown = cli("status", finished_run)
    assert shown.code == 0 and "records missing (results.json is older" in shown.out
    assert "), merged" not in shown.out
    found = json.loads(cli("status", finished_run, "--json").out)
    assert (found["merged"], found["stale"], found["complete"]) == (False, True, False)


@pytest.mark.parametrize("name", ["results.json", "compute.json"])
def test_status_of_a_run_whose_merged_file_was_cut_is_not_merged(cli, finished_run, name):
    """results.json or compute.json cut half-way (a copy cut short, an edit): `report` and
    `merge` refuse it, so `status` does not call the run merged; it says what to run."""
    file = finished_run / name
    file.write_bytes(file.read_bytes()[:100])
    shown = cli("status", finished_run)
    assert shown.code == 0 and "), merged" not in shown.out
    assert f"complete, but {name} is damaged (not a JSON object);" in shown.out
    assert f"run dllmbench merge {finished_run}" in shown.out
    found = json.loads(cli("status", finished_run, "--json").out)
    assert (found["merged"], found["complete"], found["damaged"]) == (False, True, [name])
    if name == "compute.json":
        file.rename(finished_run.parent / name)  # moved away, as the line says
    assert cli("merge", finished_run).code == 0
    found = json.loads(cli("status", finished_run, "--json").out)
    assert (found["merged"], found["damaged"]) == (True, [])


def test_status_is_not_merged_when_a_share_went_on_after_the_merge(tmp_path, cli, monkeypatch):
    """A process that was stuck when the run was merged and moves again changes its compute
    entry (and, before it checked its claims under the lock, wrote records twice): `status`
    no longer says `merged` but names what changed and says to merge again; the merge then
    counts the duplicates. A share run again after the merge counts itself in compute.json."""
    out = tmp_path / "r"
    for share in ("1/2", "2/2"):
        assert cli(*RUN, "--out", out, "--shard", share).code == 0
    assert cli("merge", out).code == 0
    assert json.loads(cli("status", out, "--json").out)["merged"] is True
    again = cli(*RUN, "--out", out, "--shard", "2/2")  # late: resumes, writes nothing
    assert again.code == 0, again.err
    # its heartbeat says it wrote 0 of 0; status also says what its share's file holds
    processes = json.loads(cli("status", out, "--json").out)["processes"]
    share = next(p for p in processes if p["share"] == "2/2")
    assert share["records_written"] == 0
    assert share["held"] == len((out / "samples.shard-2-of-2.jsonl").read_text().splitlines())
    monkeypatch.setenv("COLUMNS", "0")  # the table whole, its cells on one line
    assert f"0/0 ({share['held']} in its file)" in cli("status", out).out
    total = json.loads((out / "compute.json").read_text())
    assert [e["shard"] for e in total["invocations"]] == ["1/2", "2/2", "2/2"]
    assert json.loads(cli("status", out, "--json").out)["merged"] is True
    compute = out / "compute.shard-2-of-2.json"
    entries = json.loads(compute.read_text())
    entries["invocations"][-1]["passes"] = {"denoise": 40}  # it moved again and spent more
    compute.write_text(json.dumps(entries))
    found = json.loads(cli("status", out, "--json").out)
    assert (found["merged"], found["complete"], found["changed"]) == (False, True, ["share 2/2"])
    first = (out / "samples.shard-1-of-2.jsonl").read_text().splitlines(keepends=True)[0]
    with open(out / "samples.shard-2-of-2.jsonl", "a") as fh:
        fh.write(first)  # a record written twice
    shown = cli("status", out)
    assert "share 2/2, records changed after" in shown.out and "), merged" not in shown.out
    assert f"run dllmbench merge {out} again" in shown.out
    assert cli("merge", out).code == 0
    assert json.loads(cli("status", out, "--json").out)["merged"] is True
    duplicates = json.loads((out / "compute.json").read_text())["total"]["duplicates"]
    assert duplicates["records"] == 1 and duplicates["passes"]


def test_merge_of_a_directory_without_a_run_is_one_line(tmp_path, cli):
    assert_user_error(cli("merge", tmp_path), "no manifest.json")


def test_merge_wait_waits_for_a_run_directory_that_is_not_made_yet(
    tmp_path, cli, finished_run, monkeypatch
):
    """A merge job that starts with its array, before any task made the run directory: it
    waits for it (bounded by --wait-timeout), then merges."""
    import threading

    import dllmbench.running.merge as merge_module

    monkeypatch.setattr(merge_module, "POLL_SECONDS", 0.05)
    out = tmp_path / "later"
    started = time.monotonic()
    absent = cli("merge", out, "--wait", "--wait-timeout", "0.5")
    assert_user_error(absent, f"{out} holds no run after --wait-timeout 0.5 s")
    assert time.monotonic() - started >= 0.5  # it waited
    (finished_run / "results.json").unlink()
    maker = threading.Timer(0.3, finished_run.rename, [out])
    maker.start()
    try:
        merged = cli("merge", out, "--wait", "--wait-timeout", "60")
    finally:
        maker.join()
    assert merged.code == 0, merged.err
    assert "merged:" in merged.out and (out / "results.json").exists()


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


def torchrun(*argv: object, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`torchrun --standalone --nproc_per_node 2 -m dllmbench ARGV`, through this Python."""
    return subprocess.Popen(
        [*TORCHRUN, "-m", "dllmbench", *map(str, argv)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ignore_sigint() -> None:
    """What a non-interactive shell does for `cmd &`: the child starts with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def dllmbench_process(
    *argv: object, env: dict[str, str], background: bool = False
) -> subprocess.Popen[str]:
    """`python -m dllmbench ARGV` in the background, its output captured; `background`: as
    a batch script's `cmd &` starts it (SIGINT ignored)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dllmbench", *map(str, argv)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if background else None,
    )


def slurm_step(
    *argv: object, env: dict[str, str], tasks: int = 2, background: bool = False
) -> list[subprocess.Popen]:
    """The tasks of one Slurm job step, with Slurm's variables set by hand."""
    return [
        dllmbench_process(
            *argv,
            env={**env, "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(tasks)},
            background=background,
        )
        for rank in range(tasks)
    ]


def slow_env() -> dict[str, str]:
    """The doubles and `toy_slow` (tests/shard_doubles.py), a toy that takes its time."""
    return child_env(
        DLLMBENCH_PLUGIN_MODULES="dllmbench.testing.doubles,shard_doubles",
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )


def slow_run(backbone: str = "toy_slow:delay=0.1") -> list[str]:
    argv = [*RUN, "--max-problems", "1"]
    argv[argv.index("toy")] = backbone
    return argv


def wait_until(condition, procs, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def ledger_sum(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in records:
        for kind, n in record["ledger"]["passes"].items():
            out[kind] = out.get(kind, 0) + n
    return {k: v for k, v in sorted(out.items()) if v}


def status_of(out: Path) -> dict:
    result = cli_subprocess("status", out, "--json", env=child_env())
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_torchrun_of_two_processes_equals_one(tmp_path, whole):
    out = tmp_path / "launched"
    proc = torchrun(*RUN, "--out", out, env=child_env(), cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "Oracle@9" in stdout  # the first process printed the merged leaderboard
    assert "by this process of 2" in stdout
    pids = {e["pid"] for e in json.loads((out / "compute.json").read_text())["invocations"]}
    assert len(pids) == 2  # two processes ran
    assert len(lines(out)) == RECORDS
    same_run(whole, out)
    assert "(share 1/2)" in stderr and "(share 2/2)" in stderr  # progress lines say whose


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_on_two_nodes_equals_one_process(tmp_path, whole):
    """Two torchrun agents of one process each, as two nodes would start them, meeting at one
    rendezvous: global rank 0 merges; the records equal one process's."""
    out = tmp_path / "nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    node = (sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node")
    node += ("1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "t")
    nodes = [
        subprocess.Popen(
            [*node, "-m", "dllmbench", *map(str, RUN), "--out", str(out)],
            env=child_env(),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert sum("Oracle@9" in stdout for stdout, _ in outputs) == 1  # one merged
    assert len(lines(out)) == RECORDS
    same_run(whole, out)


ACCELERATE = (sys.executable, "-m", "accelerate.commands.launch", "--config_file")


def test_accelerate_launch_of_two_cpu_processes_is_one_line(tmp_path):
    """accelerate's CPU launcher starts one process without MPI: that process says so and
    names torchrun (exit 2), before any work; never a quiet run of everything in one."""
    config = tmp_path / "accelerate.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 2\n"
        "num_machines: 1\nmachine_rank: 0\nuse_cpu: true\nmixed_precision: 'no'\n"
    )
    out = tmp_path / "A"
    proc = subprocess.run(
        [*ACCELERATE, str(config), "-m", "dllmbench", *map(str, RUN), "--out", str(out)],
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0  # accelerate passes the child's failure on
    ours = [x for x in proc.stderr.splitlines() if x.startswith("dllmbench: error:")]
    assert len(ours) == 1 and "torchrun --nproc_per_node" in ours[0], proc.stderr
    assert not out.exists()
    # the process itself, in the environment accelerate gives it: exit 2, one line
    lone = child_env(ACCELERATE_USE_CPU="True", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    assert_user_error(
        cli_subprocess(*RUN, "--out", out, env=lone), "accelerate launch started one process"
    )


def test_a_process_killed_holding_chunks_is_taken_over(tmp_path):
    """Two tasks of a Slurm step (no launcher to stop the others): the second is killed while
    it holds a chunk; the first takes the chunk over and finishes the run, with no record
    missing or written twice, and compute.json accounting for every record exactly."""
    out, slow = tmp_path / "killed", tmp_path / "slow"
    slow.touch()  # slow until the kill, so that the second is killed holding its chunk
    backbone = f"toy_slow:delay=0.4,until={slow}"
    procs = slurm_step(*slow_run(backbone), "--out", out, env=slow_env())
    second = out / "samples.shard-2-of-2.jsonl"
    wait_until(lambda: second.exists() and second.read_text().count("\n") >= 2, procs)
    beat = json.loads((out / "heartbeat.shard-2-of-2.json").read_text())
    os.kill(beat["pid"], signal.SIGSTOP)  # it holds its chunk while the first waits for it
    running = status_of(out)
    assert {p["share"]: p["state"] for p in running["processes"]} == {
        "1/2": "running",
        "2/2": "running",
    }
    chunks = running["chunks"]
    # 7 problems for 2 processes: chunks of 3 (a share of 3 each), 3 and 1
    assert chunks["held"] >= 1 and chunks["total"] == 3
    assert chunks["held"] + chunks["done"] + chunks["free"] == 3
    assert not running["complete"]
    os.kill(beat["pid"], signal.SIGKILL)
    slow.unlink()
    _, stderr = procs[0].communicate(timeout=600)
    procs[1].wait()
    assert procs[0].returncode == 0, stderr
    assert "share 1/2: took over chunk" in stderr
    keys = [(r["problem"], r["method"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == RECORDS  # no duplicate, none missing
    results = json.loads((out / "results.json").read_text())
    assert all(m["problems"] == SIZE for m in results["methods"])
    compute = json.loads((out / "compute.json").read_text())
    total = compute["total"]
    assert total["passes"] == ledger_sum(lines(out))
    assert total["duplicates"] == {"records": 0, "passes": {}}
    assert all(n >= 0 for n in total["unrecorded"].values())
    killed = next(e for e in compute["invocations"] if e["shard"] == "2/2")
    assert not killed["finished"] and killed["recorded"]["records"] >= 2
    after = status_of(out)
    assert {p["share"]: p["state"] for p in after["processes"]} == {
        "1/2": "finished",
        "2/2": "dead",
    }
    assert after["complete"] and after["merged"] and after["chunks"]["done"] == 3


def test_a_process_that_dies_before_claiming_stops_the_first(tmp_path):
    """The second task dies while its model loads (before it claims anything): the first,
    watching from the start, stops with one line naming it instead of waiting, at once,
    though it is itself loading its model (a sleep here) and was started as a batch script's
    `cmd &` starts it, with SIGINT ignored."""
    out = tmp_path / "early"
    argv = slow_run("toy_slow:delay=0.1,load_delay=300")
    procs = slurm_step(*argv, "--out", out, env=slow_env(), background=True)
    beat = out / "heartbeat.shard-2-of-2.json"
    wait_until(beat.exists, procs, seconds=120)
    os.kill(json.loads(beat.read_text())["pid"], signal.SIGKILL)
    try:
        _, stderr = procs[0].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 2, stderr
    errors = [x for x in stderr.splitlines() if x.startswith("dllmbench: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "share 2/2 (pid" in errors[0] and "stopped before it claimed any work" in errors[0]


def test_a_killed_share_resumes_and_compute_json_counts_every_invocation(tmp_path):
    """kill -9 of a fixed share mid-run: `merge --wait` names it at once; run again, it
    resumes; compute.json keeps both of its invocations and its total is exactly the
    records' ledgers, with the killed invocation's unrecorded work apart."""
    out, slow = tmp_path / "killed", tmp_path / "slow"
    slow.touch()  # slow until the kill, so that it is killed mid-run
    env = slow_env()
    argv = [*slow_run(f"toy_slow:delay=0.1,until={slow}"), "--out", str(out)]
    proc = dllmbench_process(*argv, "--shard", "2/2", env=env)
    second = out / "samples.shard-2-of-2.jsonl"
    wait_until(lambda: second.exists() and second.read_text().count("\n") >= 2, [proc])
    proc.kill()
    proc.communicate()
    slow.unlink()
    waited = cli_subprocess("merge", out, "--wait", "--wait-timeout", "60", env=env)
    assert_user_error(waited, "share 2/2 (pid", "died without finishing", "--shard 2/2")
    again = cli_subprocess(*argv, "--shard", "2/2", env=env, timeout=300)
    assert again.code == 0, again.err
    first = dllmbench_process(*argv, "--shard", "1/2", env=env)
    merged = cli_subprocess("merge", out, "--wait", env=env, timeout=300)  # waits for 1/2
    assert first.wait(timeout=300) == 0
    assert merged.code == 0, merged.err
    keys = [(r["problem"], r["method"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == RECORDS
    compute = json.loads((out / "compute.json").read_text())
    entries = [(e["shard"], e["finished"]) for e in compute["invocations"]]
    assert entries == [("1/2", True), ("2/2", False), ("2/2", True)]
    total = compute["total"]
    assert total["passes"] == ledger_sum(lines(out)) and total["records"] == RECORDS
    for kind, charged in total["charged"].items():
        assert charged == total["passes"][kind] + total["unrecorded"].get(kind, 0)
    killed = compute["invocations"][1]
    assert killed["recorded"]["records"] >= 2
    for kind, n in killed["recorded"]["passes"].items():
        assert killed["passes"][kind] >= n  # saved before each record: never less
    for entry in (compute["invocations"][0], compute["invocations"][2]):
        assert entry["recorded"]["passes"] == entry["passes"]


def test_after_sigkill_compute_json_lacks_at_most_one_heartbeat_of_passes(tmp_path):
    """The compute entry is saved on each heartbeat, whatever the main thread does: killed
    with SIGKILL in the middle of a problem (no record written yet), compute.json holds
    every pass the ledger had charged one heartbeat before the kill (the ledger logs each
    charge with its time, tests/shard_doubles.py)."""
    from dllmbench.storage.heartbeat import BEAT_SECONDS

    out, log = tmp_path / "killed", tmp_path / "ledger.log"
    argv = ["run", "--task", "toy_sum:size=2", "--backbone", "toy_slow:delay=2", "--steps"]
    argv += ["8", "--gen-length", "5", "--methods", "vanilla", "--budget", "8", "--out", out]
    env = {**slow_env(), "DLLMBENCH_LEDGER_LOG": str(log)}
    proc = dllmbench_process(*argv, "--max-problems", "1", env=env)

    def charged() -> list[tuple[float, int]]:
        text = log.read_text() if log.exists() else ""
        lines = [x.split() for x in text.splitlines()]
        return [(float(x[0]), int(x[1])) for x in lines if len(x) == 2]

    # charges for more than two heartbeats, and a problem takes 8 forwards of 2 s
    wait_until(
        lambda: len(charged()) > 1 and time.time() - charged()[0][0] > 2 * BEAT_SECONDS, [proc]
    )
    proc.kill()
    killed = time.time()
    proc.communicate()
    assert not (out / "samples.jsonl").exists()  # no record: only the beats saved its passes
    (entry,) = json.loads((out / "compute.json").read_text())["invocations"]
    saved = sum(entry["passes"].values())
    true = charged()
    before = max(n for t, n in true if t <= killed - BEAT_SECONDS - 1.0)
    assert 0 < before <= saved <= true[-1][1], (before, saved, true)


def test_sigterm_saves_and_says_so(tmp_path):
    """SIGTERM (a scheduler's pre-emption) ends a run as Ctrl-C does: one line, exit 143, the
    lock released, the compute entry saved and the heartbeat saying it stopped."""
    out = tmp_path / "term"
    proc = dllmbench_process(*slow_run(), "--out", str(out), env=slow_env())
    samples = out / "samples.jsonl"
    wait_until(lambda: samples.exists() and samples.read_text().count("\n") >= 2, [proc])
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("dllmbench: terminated (SIGTERM);")
    assert "Traceback" not in stderr
    assert not (out / ".lock").exists()
    (entry,) = json.loads((out / "compute.json").read_text())["invocations"]
    assert entry["finished"] is False and entry["records_written"] >= 2
    assert json.loads((out / "heartbeat.json").read_text())["state"] == "stopped"


class OneProcess:
    """The session's demo run as one process made it (tests/fixtures/record_demo_run.py)."""

    def __init__(self) -> None:
        recorded = json.loads(gzip.decompress(ONE_PROCESS.read_bytes()))
        self.records: list[dict] = recorded["records"]
        self.accuracies = {(m, budget): (acc, n) for m, budget, acc, n in recorded["accuracies"]}

    def read_records(self) -> list[dict]:
        return self.records


def test_the_demo_launched_on_two_processes_equals_one_process(demo_run):
    """The session's demo run, `torchrun --nproc_per_node 2 -m dllmbench run --limit 6` (the
    shipped model, every family at both demo budgets), against the same run in one process,
    recorded in tests/fixtures: the same decisions, candidates and passes, scores to 1e-5 and
    the same accuracies, every family."""
    one = OneProcess()
    # A row's float32 scores depend on the width its batch is padded to (SDPA's reductions
    # run over it), and the processes' batches hold other neighbours: the demo's scorer logits
    # differ by up to 2.4e-6 (1e-6 relative would be 1e-7 on a logit of 0.1)
    assert_same_records(RunDir(demo_run.path), one, abs_tol=1e-5)
    results = json.loads((demo_run.path / "results.json").read_text())
    methods = results["methods"]
    accuracies = {(m["id"], m["budget"]): (m["accuracy"], m["problems"]) for m in methods}
    assert accuracies == one.accuracies and len(accuracies) >= 10
    assert {m for m, _ in accuracies} == {r["method"] for r in one.records}
    assert len({r["problem"] for r in one.records}) == DEMO_PROBLEMS
    shares = sorted(p.name for p in demo_run.path.glob("samples*.jsonl"))
    assert shares == ["samples.shard-1-of-2.jsonl", "samples.shard-2-of-2.jsonl"]


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
