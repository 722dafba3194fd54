"""`dllmbench train-scorer` with a scorer plugin whose own code raises while it trains: one
line naming the plugin and what it raised, exit status 3 (a plugin's fault, as in a run), the
traceback under --debug."""

from __future__ import annotations

import pytest

from dllmbench.plugins.scorers.reward import PRM


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    from dllmbench.cli import main

    out = tmp_path_factory.mktemp("collected") / "c"
    argv = ["collect", "--task", "arith:max_steps=1", "--backbone", "tiny", "--n", "2"]
    argv += ["--snapshots", "2", "--limit", "4", "--steps", "4", "--gen-length", "8"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("method", ["trainable", "logits", "train_mode", "save"])
def test_a_scorer_raising_while_it_trains_is_one_line_naming_it(
    cli, tmp_path, collection, monkeypatch, method
):
    """The PRM plugin's `method` raises (a bug in its code): train-scorer printed Python's
    traceback and exited 1, as for a bug in dllmbench."""

    def broken(self, *args, **kwargs):
        raise RuntimeError(f"broken in {method}")

    monkeypatch.setattr(PRM, method, broken)
    train = ["train-scorer", "--kind", "prm", "--data", collection, "--steps", "2"]
    train += ["--batch", "4", "--val-every", "2", "--val-fraction", "0.5"]
    done = cli(*train, "--out", tmp_path / "s")
    lines = [line for line in done.err.splitlines() if not line.startswith("dllmbench: train")]
    assert done.code == 3, done.err
    assert "Traceback" not in done.err
    assert len(lines) == 1, done.err
    assert lines[0].startswith(
        f"dllmbench: error: scorer 'prm' (from dllmbench) raised RuntimeError: broken in "
        f"{method} (at test_train_faults.py:"
    )
    assert lines[0].endswith(" (--debug shows the traceback)")
    debug = cli(*train, "--out", tmp_path / "d", "--debug")
    assert debug.code == 3 and "Traceback" in debug.err and f"broken in {method}" in debug.err
