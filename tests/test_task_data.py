"""Task data: the packaged copy, local files and folders, DLLMBENCH_DATA, the Hub (stubbed or
offline), empty and malformed files."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import assert_user_error, cli_subprocess, snapshot

from dllmbench.core.errors import UserError
from dllmbench.core.hub import PROBE_TIMEOUT
from dllmbench.loading.registry import registry
from dllmbench.tasks import data as module
from dllmbench.tasks.data import DATA_ENV, PACKAGED, content_sha256
from dllmbench.tasks.gsm8k import Gsm8k
from dllmbench.tasks.math500 import Math500
from dllmbench.tasks.mbpp import Mbpp
from dllmbench.testing.doubles import ToyBackbone

# sha256 and rows of each shipped file, uncompressed (as upstream publishes it)
SHIPPED = {
    "gsm8k/train.jsonl": ("17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465", 7473),
    "gsm8k/test.jsonl": ("3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14", 1319),
    "math500/test.jsonl": ("35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", 500),
    "mbpp/mbpp.jsonl": ("ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f", 974),
}
SHA = {name: sha for name, (sha, _) in SHIPPED.items()}
GSM8K = {"train": 7473, "test": 1319}
MBPP = {"prompt": 10, "test": 500, "validation": 90, "train": 374}
REAL_PROBE = module.hub_unreachable
GOOD = json.dumps({"question": "q", "answer": "1+1=2\n#### 2"})


@pytest.fixture(autouse=True)
def _no_user_data(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The packaged data uncompressed into a folder of `<task>/<file>.jsonl`."""
    root = tmp_path_factory.mktemp("plain")
    for name in SHIPPED:
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(gzip.decompress((PACKAGED / f"{name}.gz").read_bytes()))
    return root


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_packaged_files_match_their_readme_checksums(name):
    digest, rows = SHIPPED[name]
    path = PACKAGED / f"{name}.gz"
    raw = gzip.decompress(path.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == digest == content_sha256(path)
    assert raw.count(b"\n") == rows and raw.endswith(b"\n")
    folder = path.parent
    readme = (folder / "README.md").read_text()
    assert re.search(rf"\| {re.escape(path.name)} \| {rows} \| {len(raw)} \| {digest} \|", readme)
    assert "License" in readme and (folder / "LICENSE").stat().st_size > 1000
    header = path.read_bytes()[:10]
    assert header[4:8] == b"\0\0\0\0" and not header[3] & 0x08  # mtime 0, no file name


def test_packaged_copy_is_the_default(monkeypatch):
    _hub_stub(monkeypatch, error=AssertionError("the packaged copy must not touch the Hub"))
    task = Gsm8k()
    assert task.splits() == GSM8K
    problems = task.problems("test")
    assert len(problems) == 1319 and problems[0].meta["source"] == "dllmbench:gsm8k/test.jsonl:1"
    assert task.data_files() == {
        "dllmbench:gsm8k/test.jsonl": SHA["gsm8k/test.jsonl"],
        "dllmbench:gsm8k/train.jsonl": SHA["gsm8k/train.jsonl"],
    }
    assert Math500().data_files() == {"dllmbench:math500/test.jsonl": SHA["math500/test.jsonl"]}
    assert Mbpp().data_files() == {"dllmbench:mbpp/mbpp.jsonl": SHA["mbpp/mbpp.jsonl"]}


@pytest.mark.parametrize(
    "factory,data,splits",
    [
        (Gsm8k, "", GSM8K),
        (Gsm8k, "gsm8k", GSM8K),
        (Gsm8k, "gsm8k/train.jsonl", {"train": 7473}),
        (Math500, "math500/test.jsonl", {"test": 500}),
        (Mbpp, "mbpp", MBPP),
        (Mbpp, "mbpp/mbpp.jsonl", MBPP),
    ],
)
@pytest.mark.parametrize("compressed", [False, True])
def test_local_file_or_folder(plain, factory, data, splits, compressed):
    """Plain jsonl files, and the packaged .gz files passed as data=: the same rows and hashes."""
    root = PACKAGED if compressed else plain
    if compressed and data.endswith(".jsonl"):
        data += ".gz"
    task = factory(data=str(root / data))
    assert task.splits() == splits
    files = task.data_files()
    assert files
    for path, digest in files.items():
        name = str(Path(path).relative_to(root)).removesuffix(".gz")
        assert SHA[name] == digest


def test_a_jsonl_and_its_gz_hash_the_same_and_each_file_is_hashed_once(tmp_path, monkeypatch):
    plain = tmp_path / "test.jsonl"
    plain.write_text(GOOD + "\n")
    packed = tmp_path / "c" / "test.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert (
        content_sha256(plain)
        == content_sha256(packed)
        == hashlib.sha256(GOOD.encode() + b"\n").hexdigest()
    )
    reads = []
    original = module.read_bytes
    monkeypatch.setattr(module, "read_bytes", lambda *a: reads.append(a) or original(*a))
    fresh = tmp_path / "d" / "test.jsonl"
    fresh.parent.mkdir()
    fresh.write_text(GOOD + "\n" + GOOD + "\n")
    task = Gsm8k(data=str(fresh))
    assert len(task.problems("test")) == 2
    first = task.data_files()
    assert task.data_files() == first == {str(fresh): content_sha256(fresh)}
    assert len(reads) == 1


def test_mbpp_splits_by_task_id():
    task = Mbpp()
    ids = {s: [int(p.id) for p in task.problems(s)] for s in task.splits()}
    assert ids["prompt"] == list(range(1, 11))
    assert ids["test"] == list(range(11, 511))
    assert ids["validation"] == list(range(511, 601))
    assert ids["train"] == list(range(601, 975))


def test_env_var_folder(plain, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(plain))
    task = Gsm8k()
    assert task.splits() == GSM8K
    assert task.data_files()[str(plain / "gsm8k" / "test.jsonl")] == SHA["gsm8k/test.jsonl"]
    assert Math500().problems("test")[0].id == "test/precalculus/807.json"
    assert registry().task("mbpp").splits()["test"] == 500


def _folder(root: Path, rows: int) -> Path:
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "test.jsonl").write_text((GOOD + "\n") * rows)
    return root


def test_lookup_order_data_then_env_then_packaged(tmp_path, monkeypatch):
    env = _folder(tmp_path / "env", 2)
    given = _folder(tmp_path / "given", 3)
    monkeypatch.setenv(DATA_ENV, str(env))
    assert Gsm8k(data=str(given)).splits() == {"test": 3}  # data= beats $DLLMBENCH_DATA
    assert Gsm8k(data=str(given / "gsm8k" / "test.jsonl")).splits() == {"test": 3}
    assert Gsm8k().splits() == {"test": 2}  # $DLLMBENCH_DATA beats the packaged copy
    assert list(Gsm8k().data_files()) == [str(env / "gsm8k" / "test.jsonl")]
    # a $DLLMBENCH_DATA without gsm8k/ falls through to the packaged copy
    assert Math500().problems("test")[0].id == "test/precalculus/807.json"
    assert list(Math500().data_files()) == ["dllmbench:math500/test.jsonl"]
    monkeypatch.setenv(DATA_ENV, str(tmp_path))  # holds env/ and given/, no gsm8k/
    assert Gsm8k().splits() == GSM8K


def test_env_var_naming_no_folder_is_one_line(tmp_path, monkeypatch, cli):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(DATA_ENV, str(missing))
    with pytest.raises(UserError, match=re.escape(f"${DATA_ENV}={missing} is not a folder")):
        Gsm8k()
    assert_user_error(cli("tasks"), DATA_ENV, str(missing), "is not a folder")
    out = tmp_path / "run"
    result = cli("run", "--task", "mbpp", "--backbone", "toy", "--out", out)
    assert_user_error(result, DATA_ENV, str(missing))
    assert snapshot(out) == {}


def test_tasks_json_lists_the_shipped_splits_without_the_network(monkeypatch, cli):
    _hub_stub(monkeypatch, error=AssertionError("tasks must not load from the Hub"))
    monkeypatch.setattr(module, "hub_unreachable", _no_probe)
    result = cli("tasks", "--json")
    assert result.code == 0, result.err
    splits = {row["name"]: row["splits"] for row in json.loads(result.out)}
    assert splits["gsm8k"] == GSM8K and splits["math500"] == {"test": 500}
    assert splits["mbpp"] == MBPP
    assert sum(MBPP.values()) == SHIPPED["mbpp/mbpp.jsonl"][1]


def _no_probe(*_args, **_kwargs):
    raise AssertionError("the Hub must not be probed")


def _hub_stub(monkeypatch, rows=None, error=None, reachable=True):
    calls = []

    class FakeDataset(list):
        _fingerprint = "abc123"

    def load_dataset(name, config=None, *, split, revision=None):
        calls.append((name, config, split, revision))
        if error is not None:
            raise error
        return FakeDataset(rows)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(
        module, "hub_unreachable", lambda *a: None if reachable else "https://hub: no route"
    )
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_hub_sizes_without_loading(monkeypatch):
    calls = _hub_stub(monkeypatch, error=AssertionError("splits() must not load"))
    assert Gsm8k(revision="main").splits() == GSM8K
    assert Math500(revision="main").splits() == {"test": 500}
    assert Mbpp(revision="main").splits() == MBPP
    assert Gsm8k().splits() == GSM8K
    assert calls == []


def test_hub_load_on_problems(monkeypatch):
    rows = [{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}]
    calls = _hub_stub(monkeypatch, rows=rows)
    task = Gsm8k(revision="v1")  # a revision asks for the Hub instead of the packaged copy
    problems = task.problems("test")
    assert calls == [("openai/gsm8k", "main", "test", "v1")]
    assert problems[0].gold == "2" and task.splits()["test"] == 1
    assert task.data_files() == {"hf://openai/gsm8k/main/test@v1": "abc123"}
    _hub_stub(monkeypatch, rows=[{"task_id": 11, "text": "t", "code": "c", "test_list": ["a"]}])
    mbpp = Mbpp(revision="v1")
    assert mbpp.problems("test")[0].id == "11" and mbpp.splits()["test"] == 1


def test_hub_failure_is_one_line_user_error(monkeypatch):
    _hub_stub(monkeypatch, error=ConnectionError("no route to host\nsecond line"))
    with pytest.raises(UserError) as info:
        Math500(revision="main").problems("test")
    message = str(info.value)
    assert "HuggingFaceH4/MATH-500" in message and "data=PATH" in message
    assert f"${DATA_ENV}/math500/" in message and "no route to host" in message
    assert "\n" not in message


def test_unreachable_hub_fails_fast_without_calling_datasets(monkeypatch):
    """A real probe against a closed local port: no retries, one line, within the timeout."""
    calls = _hub_stub(monkeypatch, error=AssertionError("datasets must not be called"))
    monkeypatch.setattr(module, "hub_unreachable", REAL_PROBE)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(UserError) as info:
        Gsm8k(revision="main").problems("test")
    assert time.monotonic() - start < PROBE_TIMEOUT + 1
    message = str(info.value)
    assert message.startswith("gsm8k: cannot reach the Hugging Face Hub (http://127.0.0.1:")
    assert "openai/gsm8k (main, test@main)" in message and "data=PATH" in message
    assert f"${DATA_ENV}/gsm8k/" in message and "\n" not in message
    assert calls == []


def test_offline_mode_skips_the_probe(monkeypatch):
    calls = _hub_stub(
        monkeypatch, error=ConnectionError("Couldn't reach it (OfflineModeIsEnabled)")
    )
    monkeypatch.setattr(module, "hub_unreachable", _no_probe)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match=r"OfflineModeIsEnabled.*data=PATH"):
        Mbpp(revision="main").problems("test")
    assert calls == [("google-research-datasets/mbpp", "full", "test", "main")]


@pytest.mark.slow
def test_offline_hub_through_the_real_datasets_is_one_quiet_line(tmp_path):
    """HF_HUB_OFFLINE=1 and an empty cache: the real datasets library fails in seconds, one line."""
    env = {
        **{k: v for k, v in os.environ.items() if k != DATA_ENV},
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    out = tmp_path / "run"
    start = time.monotonic()
    result = cli_subprocess(
        "run", "--task", "math500:revision=main", "--backbone", "toy", "--out", out, env=env
    )
    assert time.monotonic() - start < 30
    assert_user_error(result, "HuggingFaceH4/MATH-500", "data=PATH", f"${DATA_ENV}/math500/")
    assert snapshot(out) == {}


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("empty.jsonl", b"", "has no rows (it is empty)"),
        ("blank.jsonl", b"\n  \n\t\n", "has no rows (it is empty)"),
        ("empty.jsonl.gz", gzip.compress(b"\n", mtime=0), "has no rows (it is empty)"),
        ("plain.jsonl.gz", GOOD.encode() + b"\n", "is not a valid gzip file"),
        (
            "cut.jsonl.gz",
            gzip.compress(GOOD.encode() * 50, mtime=0)[:40],
            "is not a valid gzip file",
        ),
        ("latin1.jsonl", '{"question": "café"}\n'.encode("latin-1"), "is not UTF-8 text"),
    ],
)
def test_unusable_file_is_one_line_before_the_backbone(
    tmp_path, monkeypatch, cli, finished_run, name, content, needle
):
    path = tmp_path / name
    path.write_bytes(content)

    def no_backbone(*_args, **_kwargs):
        raise AssertionError("the backbone must not be built")

    monkeypatch.setattr(ToyBackbone, "__init__", no_backbone)
    for out, before in ((tmp_path / "new", {}), (finished_run, snapshot(finished_run))):
        result = cli("run", "--task", f"gsm8k:data={path}", "--backbone", "toy", "--out", out)
        assert_user_error(result, f"gsm8k: {path} ", needle, ".jsonl")
        assert snapshot(out) == before


def test_gz_files_in_a_folder_are_found(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl.gz").write_bytes(gzip.compress((GOOD + "\n").encode()))
    task = Gsm8k(data=str(tmp_path))
    assert task.splits() == {"test": 1}
    assert Gsm8k(data=str(tmp_path / "gsm8k" / "test.jsonl.gz")).splits() == {"test": 1}


def _copy(tmp_path: Path, lines: list[str], name: str = "test.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", "is not valid JSON"),
        ('["a", "list"]', "is not a JSON object"),
        ('{"question": "q"}', "has no field 'answer'"),
        ('{"question": "q", "answer": 7}', "field 'answer' is int, not str"),
        ('{"question": "q", "answer": "no final line"}', "does not end in '#### <number>'"),
    ],
)
def test_malformed_gsm8k_row_names_file_and_line(tmp_path, bad, message):
    path = _copy(tmp_path, [GOOD, GOOD, bad])
    with pytest.raises(UserError) as info:
        Gsm8k(data=str(path)).problems("test")
    assert f"{path}:3" in str(info.value) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_malformed_mbpp_and_math500_rows(tmp_path):
    path = _copy(tmp_path, [json.dumps({"task_id": 11, "text": "t", "code": "c", "test_list": []})])
    with pytest.raises(UserError, match=re.escape(f"{path}:1 has a test_list")):
        Mbpp(data=str(path)).splits()
    path = _copy(tmp_path, [json.dumps({"problem": "p"})], "m.jsonl")
    with pytest.raises(UserError, match=re.escape(f"{path}:1 has no field 'answer'")):
        Math500(data=str(path)).problems("test")


def test_missing_data(tmp_path, plain):
    with pytest.raises(UserError, match="does not exist"):
        Gsm8k(data=str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"has none of test\.jsonl, train\.jsonl \(or \.gz\)"):
        Gsm8k(data=str(tmp_path))
    (tmp_path / "gsm8k").mkdir()
    shutil.copy(plain / "gsm8k" / "test.jsonl", tmp_path / "gsm8k" / "test.jsonl")
    task = Gsm8k(data=str(tmp_path))
    assert task.splits() == {"test": 1319}
    with pytest.raises(UserError, match="no split 'train'"):
        task.problems("train")
