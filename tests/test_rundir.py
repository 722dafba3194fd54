"""Run directory: records survive interruption, resume reproduces, other manifests refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from typing import Any, Protocol

import pytest

from dllmbench.core.errors import UserError
from dllmbench.execution.engine import Capacity, Sampling
from dllmbench.running.merge import merge
from dllmbench.running.runner import RunConfig, run
from dllmbench.storage.rundir import RunDir, brief_differences, manifest_differences
from dllmbench.storage.shards import Shard

METHODS = ["vanilla", "majority", "orm_rerank", "prm_guided", "smc_vote", "oracle"]


def config(out, **overrides) -> RunConfig:
    base = dict(
        task="toy_sum",
        task_config={"size": 8},
        backbone="toy",
        scorers={"prm": ("toy", {}), "orm": ("toy", {"partial": False})},
        methods=METHODS,
        sampling=Sampling(total_steps=16, gen_length=6, prompt_style="fewshot", seed=3),
        capacity=Capacity(batch_rows=16, problems=2),
        resamples=500,
        out=str(out),
    )
    base.update(overrides)
    return RunConfig(**base)


class Interrupt(KeyboardInterrupt):
    pass


def interrupt_after(n: int):
    """An `on_record` that interrupts the run at its n-th record."""
    seen = []

    def stop(record):
        seen.append(record)
        if len(seen) == n:
            raise Interrupt

    return stop


def floats_close(a, b, abs_tol: float = 1e-9) -> bool:
    """Equal, floats to 1e-6 relative or `abs_tol` (batch composition changes reductions'
    last bits)."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        return numbers and math.isclose(a, b, rel_tol=1e-6, abs_tol=abs_tol)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(floats_close(a[k], b[k], abs_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        pairs = zip(a, b, strict=True)
        return len(a) == len(b) and all(floats_close(x, y, abs_tol) for x, y in pairs)
    return a == b


DECISIONS = ("selected", "answer", "correct", "ceiling")
CANDIDATE = ("text", "answer", "valid", "key", "correct", "lineage")


class Records(Protocol):
    """A run directory, or a run recorded elsewhere: its records."""

    def read_records(self) -> list[dict[str, Any]]: ...


def assert_same_records(a: Records, b: Records, abs_tol: float = 1e-9) -> None:
    """What results-schema.md promises of a resumed run: decisions, candidates and passes
    exactly; scores, weights and strategy info to a tight relative tolerance (or `abs_tol`)."""
    left = {(r["problem"], r["method"]): r for r in a.read_records()}
    right = {(r["problem"], r["method"]): r for r in b.read_records()}
    assert left.keys() == right.keys()
    for key, x in left.items():
        y = right[key]
        assert {k: x[k] for k in DECISIONS} == {k: y[k] for k in DECISIONS}, key
        assert x["ledger"]["passes"] == y["ledger"]["passes"], key
        assert len(x["candidates"]) == len(y["candidates"]), key
        for cx, cy in zip(x["candidates"], y["candidates"], strict=True):
            assert {k: cx[k] for k in CANDIDATE} == {k: cy[k] for k in CANDIDATE}, key
            assert cx["scores"].keys() == cy["scores"].keys(), key
            close = floats_close(cx["scores"], cy["scores"], abs_tol)
            assert close, (key, cx["scores"], cy["scores"])
            assert floats_close(cx["weight"], cy["weight"], abs_tol), key
        assert floats_close(x["info"], y["info"], abs_tol), key


def test_same_records_tolerates_last_bits_of_scores_but_not_decisions(tmp_path):
    run(config(tmp_path / "a", methods=["vanilla", "smc_vote"]))
    b = tmp_path / "b"
    b.mkdir()
    lines = [json.loads(x) for x in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()]
    smc = next(r for r in lines if r["candidates"][0]["weight"] is not None)
    smc["candidates"][0]["scores"]["prm"] *= 1 + 3e-7
    smc["candidates"][0]["weight"] *= 1 + 3e-7
    (b / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert_same_records(RunDir(tmp_path / "a"), RunDir(b))
    smc["candidates"][0]["scores"]["prm"] *= 1 + 1e-4
    (b / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(AssertionError):
        assert_same_records(RunDir(tmp_path / "a"), RunDir(b))
    smc["candidates"][0]["scores"]["prm"] /= 1 + 1e-4
    smc["selected"] = 1 - smc["selected"] if smc["selected"] in (0, 1) else 0
    (b / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(AssertionError):
        assert_same_records(RunDir(tmp_path / "a"), RunDir(b))


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    whole = run(config(tmp_path / "whole"))
    stop_after_some = interrupt_after(13)
    with pytest.raises(Interrupt):
        run(config(tmp_path / "cut"), on_record=stop_after_some)
    kept = RunDir(tmp_path / "cut").read_records()
    assert len(kept) == 13  # every record written before the interruption is on disk
    assert not (tmp_path / "cut" / "results.json").exists()

    resumed = run(config(tmp_path / "cut", capacity=Capacity(batch_rows=5, problems=3)))
    assert resumed.resumed == 13
    assert resumed.written == 8 * len(METHODS) - 13
    a = (tmp_path / "whole" / "results.json").read_text()
    b = (tmp_path / "cut" / "results.json").read_text()
    assert a == b
    assert_same_records(RunDir(tmp_path / "whole"), RunDir(tmp_path / "cut"))
    assert json.loads(a) == whole.results
    assert (tmp_path / "cut" / "leaderboard.md").read_text() == (
        tmp_path / "whole" / "leaderboard.md"
    ).read_text()


def test_rerun_of_a_finished_run_writes_nothing(tmp_path):
    run(config(tmp_path / "r"))
    again = run(config(tmp_path / "r"))
    assert again.written == 0 and again.resumed == 8 * len(METHODS)


def test_torn_last_line_is_dropped_and_redone(tmp_path):
    whole = run(config(tmp_path / "r"))
    samples = tmp_path / "r" / "samples.jsonl"
    lines = samples.read_bytes().splitlines(keepends=True)
    samples.write_bytes(b"".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    again = run(config(tmp_path / "r"))
    assert again.resumed == len(lines) - 3 and again.written == 3
    assert again.results == whole.results
    assert len(RunDir(tmp_path / "r").read_records()) == len(lines)


def test_different_manifest_is_refused_with_differences(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    with pytest.raises(UserError) as err:
        run(config(tmp_path / "r", methods=["vanilla"], sampling=Sampling(16, 6, "fewshot", 4)))
    assert "sampling.seed: 3 → 4" in str(err.value)


def test_manifest_records_protocol_plugins_and_costs(tmp_path):
    out = run(config(tmp_path / "r"))
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert manifest["sampling"] == {
        "total_steps": 16,
        "gen_length": 6,
        "prompt_style": "fewshot",
        "seed": 3,
    }
    assert manifest["backbone"]["name"] == "toy"
    assert manifest["scorers"]["orm"]["config"] == {"noise": 1.0, "partial": False}
    assert {"torch", "dllmbench", "python"} <= set(manifest["versions"])
    guided = next(m for m in manifest["methods"] if m["family"] == "prm_guided")
    assert guided["cost"] == {"denoise": 8 * 16, "score:prm": 16}  # two segments of T/2
    assert guided["strategy"]["config"]["k"] == 8
    assert guided["strategy"]["distribution"] == "dllmbench"


def edit_manifest(path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_provenance_does_not_block_a_resume(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    edit_manifest(
        tmp_path / "r",
        git_revision="0" * 40,
        versions={"python": "3.0", "torch": "0.1"},
        created="2000-01-01T00:00:00+00:00",
        command=["elsewhere"],
        execution={"batch_rows": 1, "batch_tokens": None, "problems": 1},
    )
    again = run(config(tmp_path / "r", methods=["vanilla"]))
    assert again.written == 0 and again.resumed == 8
    kept = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert kept["git_revision"] == "0" * 40  # the first invocation's provenance stays


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {
                "sampling": {
                    "total_steps": 16,
                    "gen_length": 7,
                    "prompt_style": "fewshot",
                    "seed": 3,
                }
            },
            "sampling.gen_length: 7 → 6",
        ),
        ({"methods": []}, "methods.Vanilla: added"),
        ({"budget": 1}, "budget: 1 → "),
    ],
)
def test_what_changes_results_blocks_a_resume(tmp_path, change, needle):
    run(config(tmp_path / "r", methods=["vanilla"]))
    edit_manifest(tmp_path / "r", **change)
    with pytest.raises(UserError, match="holds a different run") as err:
        run(config(tmp_path / "r", methods=["vanilla"]))
    assert needle in str(err.value)


def test_a_path_that_located_weights_is_compared_by_their_hashes():
    def manifest(model, digest, weights=True):
        entry = {"name": "tiny", "config": {"model": model, "temperature": 2.0}}
        if weights:
            entry["weights"] = {"model": {"model.safetensors": digest}}
        return {"backbone": entry, "scorers": {}}

    assert manifest_differences(manifest("/a/tiny", "x"), manifest("/b/tiny", "x")) == []
    assert manifest_differences(manifest("/a/tiny", "x"), manifest("/a/tiny", "y")) == [
        "backbone.weights.model.model.safetensors: 'x' → 'y'"
    ]
    assert manifest_differences(manifest("/a", "x", weights=False), manifest("/b", "x")) == [
        "backbone.weights.model.model.safetensors: (absent) → 'x'"
    ]
    # a path that located no hashed files is compared as it is
    assert manifest_differences(
        manifest("/a", "x", weights=False), manifest("/b", "x", weights=False)
    ) == ["backbone.config.model: '/a' → '/b'"]


def test_manifest_differences_ignore_volatile_keys():
    a = {"created": "x", "command": ["a"], "execution": {"batch_rows": 1}, "budget": 5}
    b = {"created": "y", "command": ["b"], "execution": {"batch_rows": 9}, "budget": 6}
    assert manifest_differences(a, b) == ["budget: 5 → 6"]


def test_results_have_intervals_and_paired_deltas(tmp_path):
    out = run(config(tmp_path / "r"))
    by_id = {m["id"]: m for m in out.results["methods"]}
    assert out.results["reference"] == "Vanilla"
    maj = by_id["Majority@9"]
    assert maj["accuracy"]["low"] <= maj["accuracy"]["value"] <= maj["accuracy"]["high"]
    assert maj["delta_vs_reference"]["problems"] == 8
    assert maj["pool"]["size"] == 9.0
    assert "pool" not in by_id["Vanilla"] and "delta_vs_reference" not in by_id["Vanilla"]
    assert by_id["Oracle@9"]["ceiling"] is True
    assert maj["passes_per_problem"] == maj["planned_passes"] == 144  # 9 × 16 of a 144 budget
    board = (out.path / "leaderboard.md").read_text()
    assert "Ceilings" in board and board.index("Ceilings") < board.index("Oracle@9")


def test_compute_json_keeps_every_invocation(tmp_path):
    stop = interrupt_after(5)
    with pytest.raises(Interrupt):
        run(config(tmp_path / "r"), on_record=stop)
    run(config(tmp_path / "r"))
    compute = json.loads((tmp_path / "r" / "compute.json").read_text())
    counts = [(i["records_written"], i["finished"]) for i in compute["invocations"]]
    assert counts == [(5, False), (8 * len(METHODS) - 5, True)]
    run(config(tmp_path / "r"))
    compute = json.loads((tmp_path / "r" / "compute.json").read_text())
    counts = [(i["records_written"], i["finished"]) for i in compute["invocations"]]
    assert counts == [(5, False), (8 * len(METHODS) - 5, True), (0, True)]
    assert compute["invocations"][-1]["physical"] == {}


def test_an_interrupted_invocation_is_in_compute_json_with_its_records(tmp_path):
    stop = interrupt_after(7)
    with pytest.raises(Interrupt):
        run(config(tmp_path / "r"), on_record=stop)
    (entry,) = json.loads((tmp_path / "r" / "compute.json").read_text())["invocations"]
    assert entry["records_written"] == 7 == len(RunDir(tmp_path / "r").read_records())
    assert entry["finished"] is False
    assert entry["physical"]["denoise"]["forwards"] > 0
    assert not (tmp_path / "r" / ".lock").exists()  # the lock is given back


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_the_moment_a_record_is_on_disk_still_counts_it(tmp_path, monkeypatch, signum):
    """Python runs a signal's handler between any two statements: a SIGTERM (or Ctrl-C) that
    comes the moment the third record is on disk, before the invocation counts it, waits until
    it is counted. The run stops there, and compute.json holds every record the file does."""
    real = RunDir.append

    def append(self, record):
        real(self, record)
        if len(self.read_records()) == 3:
            signal.raise_signal(signum)  # its handler would run before the next statement

    monkeypatch.setattr(RunDir, "append", append)
    with pytest.raises(KeyboardInterrupt):
        run(config(tmp_path / "r", methods=["vanilla"]))
    (entry,) = json.loads((tmp_path / "r" / "compute.json").read_text())["invocations"]
    assert entry["records_written"] == 3 == len(RunDir(tmp_path / "r").read_records())
    assert entry["finished"] is False
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as they were


def test_interrupts_held_pass_on_the_first_signal_to_the_handler_before_it():
    from dllmbench.running.invocation import interrupts_held

    seen = []
    handler = signal.signal(signal.SIGTERM, lambda s, frame: seen.append(("handler", s)))
    try:
        with interrupts_held():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            seen.append("inside, after the signals")
        seen.append("after")
        assert seen == ["inside, after the signals", ("handler", signal.SIGTERM), "after"]
        with interrupts_held():
            seen.clear()
        assert seen == []  # none came: none is passed on
    finally:
        signal.signal(signal.SIGTERM, handler)


def test_compute_json_is_saved_before_each_record(tmp_path, monkeypatch):
    """The entry is saved before each record is written (so every pass of a written record is
    in a saved entry, whenever a kill comes), durably every SAVE_EVERY seconds, finished
    before compute.json accounts for the records and results.json is written (a kill between
    leaves no results.json beside an unfinished entry), and last when the invocation ends."""
    import dllmbench.running.runner as runner

    saves = []
    real = RunDir.save_invocation

    def save(self, entry, durable=True):
        saves.append((entry, durable, len(self.read_records())))
        return real(self, entry, durable)

    monkeypatch.setattr(runner, "SAVE_EVERY", 3600.0)  # durable: the first and the last
    monkeypatch.setattr(RunDir, "save_invocation", save)
    run(config(tmp_path / "r", methods=["vanilla"]))
    assert [e["records_written"] for e, _, _ in saves] == [*range(8), 8, 8]
    assert [on_disk for _, _, on_disk in saves] == [*range(8), 8, 8]  # saved, then written
    assert [e["finished"] for e, _, _ in saves] == [False] * 8 + [True, True]
    assert [durable for _, durable, _ in saves] == [True] + [False] * 7 + [True, True]


def test_damage_before_the_last_line_is_an_error_not_a_silent_cut(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    samples = tmp_path / "r" / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    lines[2] = "{not json\n"
    samples.write_text("".join(lines))
    with pytest.raises(UserError, match="line 3 is damaged"):
        run(config(tmp_path / "r", methods=["vanilla"]))
    assert samples.read_text() == "".join(lines)  # nothing was cut


def test_summary_settings_may_change_on_resume(tmp_path):
    run(config(tmp_path / "r"))
    again = run(config(tmp_path / "r", reference="Majority@9", resamples=200))
    assert again.written == 0 and again.results["reference"] == "Majority@9"


def test_scorers_that_ask_for_the_backbone_share_it(tmp_path):
    from dllmbench.running.runner import prepare

    cfg = config(tmp_path / "r")
    prepared = prepare(cfg)
    backbone, scorers = prepared.backbone, prepared.scorers
    assert scorers["prm"].backbone is backbone and scorers["orm"].backbone is backbone
    out = run(cfg)
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert "backbone" not in manifest["scorers"]["prm"]["config"]


def test_prepare_leaves_its_configuration_as_it_was(tmp_path):
    """The shipped scorers and the budgets are resolved into what prepare returns, not
    written into the RunConfig it was given."""
    import copy

    from dllmbench.running.runner import prepare

    sampling = Sampling(total_steps=24, gen_length=32, prompt_style="fewshot")  # tiny's own
    cfg = RunConfig(
        task="arith", backbone="tiny", limit=2, sampling=sampling, out=str(tmp_path / "r")
    )
    before = copy.deepcopy(cfg)
    prepared = prepare(cfg)
    assert cfg == before and cfg.scorers is None and cfg.budget is None
    assert set(prepared.scorer_specs) == {"prm", "orm", "self"}  # the tiny backbone's own
    assert prepared.budget == max(cfg.budgets())


def tiny_config(out, model) -> RunConfig:
    return RunConfig(
        task="arith",
        backbone="tiny",
        backbone_config={"model": str(model)},
        scorers={"orm": ("orm", {"checkpoint": str(model / "orm")})},
        methods=["vanilla", "orm_rerank"],
        limit=2,
        sampling=Sampling(total_steps=8, gen_length=8, prompt_style="fewshot", seed=0),
        resamples=100,
        out=str(out),
    )


def test_weights_are_compared_by_content_not_by_where_they_lie(tmp_path):
    from safetensors.torch import load_file, save_file

    from dllmbench.core.checksums import sha256
    from dllmbench.demo import TINY_DIR

    first = tmp_path / "install-a" / "tiny_model"
    shutil.copytree(TINY_DIR, first)
    out = tmp_path / "r"
    done = run(tiny_config(out, first))
    weights = json.loads((out / "manifest.json").read_text())
    assert weights["backbone"]["weights"]["model"]["model.safetensors"] == sha256(
        TINY_DIR / "model.safetensors"
    )
    assert set(weights["backbone"]["weights"]["model"]) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert set(weights["scorers"]["orm"]["weights"]["checkpoint"]) == {
        "config.json",
        "adapter.safetensors",
        "head.safetensors",
    }

    moved = tmp_path / "install-b" / "tiny_model"  # the install moved: same content
    shutil.move(first, moved)
    again = run(tiny_config(out, moved))
    assert again.written == 0 and again.resumed == done.written

    head = moved / "orm" / "head.safetensors"  # new weights at the same place
    tensors = load_file(str(head))
    save_file({k: v + 0.5 for k, v in tensors.items()}, str(head))
    with pytest.raises(UserError) as err:
        run(tiny_config(out, moved))
    assert "scorers.orm.weights.checkpoint.head.safetensors: " in str(err.value)
    assert "config.model" not in str(err.value) and "config.checkpoint" not in str(err.value)


def test_big_files_are_hashed_once_per_content(tmp_path, monkeypatch):
    import hashlib

    from dllmbench.core import checksums

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(checksums, "BIG", 10)
    hashed = []
    real = checksums._digest
    monkeypatch.setattr(checksums, "_digest", lambda p: hashed.append(p) or real(p))
    big = tmp_path / "weights.bin"
    big.write_bytes(b"x" * 100)
    assert checksums.sha256(big) == hashlib.sha256(b"x" * 100).hexdigest()
    assert checksums.sha256(big) == hashlib.sha256(b"x" * 100).hexdigest()
    assert len(hashed) == 1  # the second call came from the cache
    assert (tmp_path / "cache" / "dllmbench" / "sha256.json").exists()
    big.write_bytes(b"y" * 100)
    os.utime(big, ns=(1, 1))  # another mtime: hashed again
    assert checksums.sha256(big) == hashlib.sha256(b"y" * 100).hexdigest()
    assert len(hashed) == 2
    small = tmp_path / "config.json"
    small.write_bytes(b"{}")
    checksums.sha256(small)
    checksums.sha256(small)
    assert len(hashed) == 4  # small files are not cached


def test_a_resumed_share_keeps_its_own_compute_history(tmp_path, monkeypatch):
    """A share killed mid-run and launched again keeps the first invocation's entry in its own
    compute file, and compute.json's total equals the records' ledgers, run by run."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    stop = interrupt_after(3)
    share = config(tmp_path / "r", shard=Shard(1, 2))
    with pytest.raises(Interrupt):
        run(share, on_record=stop)
    run(share)
    own = json.loads((tmp_path / "r" / "compute.shard-1-of-2.json").read_text())
    counts = [(i["records_written"], i["finished"]) for i in own["invocations"]]
    assert counts == [(3, False), (4 * len(METHODS) - 3, True)]
    run(config(tmp_path / "r", shard=Shard(2, 2)))
    merge(tmp_path / "r")
    total = json.loads((tmp_path / "r" / "compute.json").read_text())
    assert len(total["invocations"]) == 3  # both of share 1, one of share 2
    records = RunDir(tmp_path / "r").read_records()
    assert len(records) == 8 * len(METHODS)
    (entry,) = json.loads((tmp_path / "r" / "compute.shard-2-of-2.json").read_text())["invocations"]
    text = (tmp_path / "r" / "samples.shard-2-of-2.jsonl").read_text()
    own = [json.loads(line) for line in text.splitlines()]
    # an uninterrupted share spends exactly what its records' ledgers say
    for kind, passes in entry["passes"].items():
        assert passes == sum(r["ledger"]["passes"].get(kind, 0) for r in own), kind
    # compute.json's total is exactly the kept records' ledgers; what the interrupted
    # invocation spent on problems in flight is counted apart, as is nothing written twice
    assert total["total"]["passes"] == ledger_sum(records)
    assert total["total"]["records"] == len(records)
    assert total["total"]["duplicates"] == {"records": 0, "passes": {}}
    charged, unrecorded = total["total"]["charged"], total["total"]["unrecorded"]
    assert unrecorded and all(n > 0 for n in unrecorded.values()), unrecorded
    for kind in charged:
        assert charged[kind] == total["total"]["passes"][kind] + unrecorded.get(kind, 0)
    # each entry: the records it wrote (its samples file from its offset on)
    first, resumed, other = total["invocations"]
    assert [e["recorded"]["records"] for e in (first, resumed, other)] == [
        3,
        4 * len(METHODS) - 3,
        4 * len(METHODS),
    ]
    for e in (resumed, other):  # finished: everything charged made a record
        assert e["recorded"]["passes"] == e["passes"]
    assert all(first["passes"][k] >= n for k, n in first["recorded"]["passes"].items())


def ledger_sum(records):
    out = {}
    for r in records:
        for kind, n in r["ledger"]["passes"].items():
            out[kind] = out.get(kind, 0) + n
    return {k: v for k, v in sorted(out.items()) if v}


def test_a_refused_resume_lists_what_differs_briefly(tmp_path):
    """Adding methods to a finished run: one short line naming the methods added, not the
    reprs of every entry."""
    run(config(tmp_path / "r", methods=["vanilla"]))
    with pytest.raises(UserError) as err:
        run(config(tmp_path / "r"))
    message = str(err.value)
    assert "methods.Majority@9: added" in message and "methods.Oracle@9: added" in message
    assert len(message) < 600, message
    many = {f"k{i}": "x" * 500 for i in range(20)}
    diffs = manifest_differences(many, {k: "y" for k in many})
    assert len(diffs) == 20 and all(len(d) < 120 for d in diffs)


def test_a_directory_locked_by_a_process_starting_now_names_it(tmp_path):
    import fcntl

    out = tmp_path / "r"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held, its holder's line not written yet
    try:
        with pytest.raises(
            UserError, match=r"in use by another dllmbench run \(a process starting now\)"
        ):
            run(config(out, methods=["vanilla"]))
    finally:
        os.close(fd)


def test_a_missing_compute_json_is_rebuilt_from_the_records_and_said(tmp_path, capsys):
    stop = interrupt_after(4)
    with pytest.raises(Interrupt):
        run(config(tmp_path / "r"), on_record=stop)
    (tmp_path / "r" / "compute.json").unlink()
    capsys.readouterr()
    run(config(tmp_path / "r"))
    assert "compute.json is missing: its entry is rebuilt from the ledgers of the 4 records" in (
        capsys.readouterr().err
    )
    compute = json.loads((tmp_path / "r" / "compute.json").read_text())
    rebuilt, resumed = compute["invocations"]
    assert rebuilt["rebuilt"] and rebuilt["records_written"] == 4 and rebuilt["physical"] == {}
    records = RunDir(tmp_path / "r").read_records()
    assert compute["total"]["passes"] == ledger_sum(records)
    assert rebuilt["recorded"]["passes"] == rebuilt["passes"]
    assert resumed["recorded"]["passes"] == resumed["passes"]
    assert compute["total"]["unrecorded"] == {}


def test_a_nul_damaged_line_is_named_as_such(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    samples = tmp_path / "r" / "samples.jsonl"
    lines = samples.read_bytes().splitlines(keepends=True)
    lines[1] = b"\0" * 40 + b"\n"
    samples.write_bytes(b"".join(lines))
    with pytest.raises(UserError) as err:
        run(config(tmp_path / "r", methods=["vanilla"]))
    assert "line 2 is damaged" in str(err.value) and "NUL bytes" in str(err.value)
    assert "utf-32" not in str(err.value)


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda r: r["candidates"].__setitem__(0, "x"), "candidate 0 is a JSON str"),
        (lambda r: r["candidates"][0].pop("correct"), "no bool 'candidates[0].correct'"),
        (lambda r: r["candidates"][0].__setitem__("valid", 1), "no bool 'candidates[0].valid'"),
        (lambda r: r["ledger"].__setitem__("total_flops", "x"), "'ledger.total_flops' is no int"),
    ],
)
def test_a_record_with_a_damaged_candidate_is_one_line_naming_the_line(tmp_path, damage, needle):
    """What the summary reads of each candidate is checked where records are read: a resume
    (and `merge`) names the line instead of a TypeError once every record is computed."""
    run(config(tmp_path / "r", methods=["vanilla"]))
    samples = tmp_path / "r" / "samples.jsonl"
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    damage(records[1])
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(UserError) as err:
        run(config(tmp_path / "r", methods=["vanilla"]))
    assert "line 2 is damaged" in str(err.value) and needle in str(err.value)


def test_records_without_their_manifest_say_so(tmp_path):
    run(config(tmp_path / "r", methods=["vanilla"]))
    (tmp_path / "r" / "manifest.json").unlink()
    with pytest.raises(UserError, match=r"holds records \(samples.jsonl\) but no manifest.json"):
        run(config(tmp_path / "r", methods=["vanilla"]))


def test_report_of_an_unmerged_sharded_run_says_merge(tmp_path):
    from dllmbench.analysis.report import check_finished

    run(config(tmp_path / "r", methods=["vanilla"], shard=Shard(1, 2)))
    with pytest.raises(UserError, match="finish it by merging its shares with dllmbench merge"):
        check_finished(tmp_path / "r")


def test_a_take_back_puts_compute_json_back_byte_for_byte(tmp_path):
    """A compute.json there when the run began (written between the lock and the manifest) is
    put back as it was, whatever its bytes, and the manifest goes."""
    rundir = RunDir(tmp_path / "run")
    rundir.acquire()
    try:
        before = b'{"invocations": ["\xe9"]}\r\n'  # not UTF-8: bytes, not text
        rundir.compute_path.write_bytes(before)
        rundir.open({"methods": [], "task": {}, "created": "now"})
        rundir.compute_path.write_text('{"invocations": [{"mine": 1}]}\n')
        assert rundir.take_back()
        assert rundir.compute_path.read_bytes() == before
        assert not rundir.manifest_path.exists()
        assert not rundir.take_back()  # once
    finally:
        rundir.release()


def test_a_refused_resume_names_the_cause_before_what_follows_from_it():
    """`dllmbench run` then `dllmbench run --limit 100` into the same default --out: the
    limit is the cause; the methods' prices and the reference row follow from it and come
    after it, so the cut line still names it."""
    old = {
        "task": {"limit": 40, "problems": 40},
        "methods": [{"id": f"M{i}", "flops": 10 + i} for i in range(8)],
        "reference_row": {"prompt_tokens": 47},
    }
    new = {
        "task": {"limit": 100, "problems": 100},
        "methods": [{"id": f"M{i}", "flops": 20 + i} for i in range(8)],
        "reference_row": {"prompt_tokens": 42},
    }
    diffs = manifest_differences(old, new)
    assert diffs[:2] == ["task.limit: 40 → 100", "task.problems: 40 → 100"]
    assert diffs[-1] == "reference_row.prompt_tokens: 47 → 42"
    assert "task.limit: 40 → 100" in brief_differences(diffs)
