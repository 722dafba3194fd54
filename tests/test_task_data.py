"""Task data: local files and folders, DLLMBENCH_DATA, the Hub (stubbed), malformed rows."""

from __future__ import annotations

import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from dllmbench.errors import UserError
from dllmbench.registry import registry
from dllmbench.tasks.data import DATA_ENV, sha256
from dllmbench.tasks.gsm8k import Gsm8k
from dllmbench.tasks.math500 import Math500
from dllmbench.tasks.mbpp import Mbpp

DATA = Path(__file__).parents[2] / "shared" / "data"
SHA = {
    "gsm8k/train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "gsm8k/test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "math500/test.jsonl": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    "mbpp/mbpp.jsonl": "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f",
}


def test_shared_data_present_and_unchanged():
    for name, digest in SHA.items():
        assert (DATA / name).is_file(), f"test data missing: {DATA / name}"
        assert sha256(DATA / name) == digest, name


@pytest.mark.parametrize(
    "factory,data,splits",
    [
        (Gsm8k, DATA, {"train": 7473, "test": 1319}),
        (Gsm8k, DATA / "gsm8k", {"train": 7473, "test": 1319}),
        (Gsm8k, DATA / "gsm8k" / "train.jsonl", {"train": 7473}),
        (Math500, DATA / "math500" / "test.jsonl", {"test": 500}),
        (Mbpp, DATA / "mbpp", {"prompt": 10, "test": 500, "validation": 90, "train": 374}),
        (
            Mbpp,
            DATA / "mbpp" / "mbpp.jsonl",
            {"prompt": 10, "test": 500, "validation": 90, "train": 374},
        ),
    ],
)
def test_local_file_or_folder(factory, data, splits):
    task = factory(data=str(data))
    assert task.splits() == splits
    files = task.data_files()
    assert files and all(SHA[str(Path(p).relative_to(DATA))] == d for p, d in files.items())


def test_mbpp_splits_by_task_id():
    task = Mbpp(data=str(DATA))
    ids = {s: [int(p.id) for p in task.problems(s)] for s in task.splits()}
    assert ids["prompt"] == list(range(1, 11))
    assert ids["test"] == list(range(11, 511))
    assert ids["validation"] == list(range(511, 601))
    assert ids["train"] == list(range(601, 975))


def test_env_var_folder(monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(DATA))
    assert Gsm8k().splits() == {"train": 7473, "test": 1319}
    assert Math500().problems("test")[0].id == "test/precalculus/807.json"
    assert registry().task("mbpp").splits()["test"] == 500


def _hub_stub(monkeypatch, rows=None, error=None):
    calls = []

    class FakeDataset(list):
        _fingerprint = "abc123"

    def load_dataset(name, config=None, *, split, revision=None):
        calls.append((name, config, split, revision))
        if error is not None:
            raise error
        return FakeDataset(rows)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv(DATA_ENV, raising=False)
    return calls


def test_hub_sizes_without_loading(monkeypatch):
    calls = _hub_stub(monkeypatch, error=AssertionError("splits() must not load"))
    assert Gsm8k().splits() == {"train": 7473, "test": 1319}
    assert Math500().splits() == {"test": 500}
    assert Mbpp().splits() == {"prompt": 10, "test": 500, "validation": 90, "train": 374}
    assert calls == []


def test_hub_load_on_problems(monkeypatch):
    rows = [{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}]
    calls = _hub_stub(monkeypatch, rows=rows)
    task = Gsm8k(revision="v1")
    problems = task.problems("test")
    assert calls == [("openai/gsm8k", "main", "test", "v1")]
    assert problems[0].gold == "2" and task.splits()["test"] == 1
    assert task.data_files() == {"hf://openai/gsm8k/main/test@v1": "abc123"}
    _hub_stub(monkeypatch, rows=[{"task_id": 11, "text": "t", "code": "c", "test_list": ["a"]}])
    assert Mbpp().problems("test")[0].id == "11"


def test_hub_failure_is_one_line_user_error(monkeypatch):
    _hub_stub(monkeypatch, error=ConnectionError("no route to host\nsecond line"))
    with pytest.raises(UserError) as info:
        Math500().problems("test")
    message = str(info.value)
    assert "HuggingFaceH4/MATH-500" in message and "data=PATH" in message
    assert "\n" not in message


def test_hub_malformed_row(monkeypatch):
    _hub_stub(monkeypatch, rows=[{"question": "q"}])
    with pytest.raises(UserError, match=r"openai/gsm8k\[test\]\[0\] has no field 'answer'"):
        Gsm8k().problems("test")


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
    good = json.dumps({"question": "q", "answer": "1+1=2\n#### 2"})
    path = _copy(tmp_path, [good, good, bad])
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


def test_missing_data(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        Gsm8k(data=str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"has none of test\.jsonl, train\.jsonl"):
        Gsm8k(data=str(tmp_path))
    (tmp_path / "gsm8k").mkdir()
    shutil.copy(DATA / "gsm8k" / "test.jsonl", tmp_path / "gsm8k" / "test.jsonl")
    task = Gsm8k(data=str(tmp_path))
    assert task.splits() == {"test": 1319}
    with pytest.raises(UserError, match="no split 'train'"):
        task.problems("train")
