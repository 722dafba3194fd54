"""Where the command's output goes wrong: a reader that leaves (`| head`), a full device
(`> /dev/full`), a closed stdout (`>&-`), an ASCII-only encoding. Each is the documented status
and at most one line, never a traceback. The streams are the test's own (a pipe, /dev/full, a
buffer), put in place of sys.stdout and sys.stderr for one call of `main`."""

from __future__ import annotations

import io
import os
import sys

import pytest
from conftest import TOY_RUN

from dllmbench.cli import BROKEN_PIPE, USER_ERROR, main


def _stderr(monkeypatch) -> io.StringIO:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    return err


def test_a_reader_that_left_is_status_141_and_says_nothing(monkeypatch):
    err = _stderr(monkeypatch)
    for argv in (["plugins"], ["plugins", "--json"]):  # rich alone would exit with 1
        read, write = os.pipe()
        os.close(read)  # `| head` that has read its lines
        with open(write, "w") as stdout:
            monkeypatch.setattr(sys, "stdout", stdout)
            assert main(argv) == BROKEN_PIPE, argv
    assert err.getvalue() == ""


def test_a_full_device_is_one_line(monkeypatch):
    err = _stderr(monkeypatch)
    for argv in (["plugins"], ["plugins", "--json"]):
        with open("/dev/full", "w") as stdout:
            monkeypatch.setattr(sys, "stdout", stdout)
            assert main(argv) == USER_ERROR, argv
    lines = err.getvalue().splitlines()
    assert lines == ["dllmbench: error: cannot write to stdout: No space left on device"] * 2


def test_a_closed_stdout_is_one_line(monkeypatch):
    err = _stderr(monkeypatch)
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["plugins"]) == USER_ERROR
    assert err.getvalue().count("\n") == 1 and "stdout is closed" in err.getvalue()


def test_a_closed_stderr_runs_and_keeps_the_exit_statuses(monkeypatch, tmp_path):
    """`2>&-`: the progress and error lines go nowhere; a run still runs, a mistake is 2."""
    monkeypatch.setattr(sys, "stderr", None)
    assert main([*TOY_RUN, "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "results.json").is_file()
    monkeypatch.setattr(sys, "stderr", None)
    with pytest.raises(SystemExit) as exited:  # argparse's error, as at a terminal
        main(["plugins", "--no-such-flag"])
    assert exited.value.code == USER_ERROR


def test_an_ascii_terminal_gets_the_run_with_question_marks(monkeypatch, tmp_path):
    """The progress line's `×` (and the leaderboard's signs) on an ASCII-only stream: the run
    completes, what cannot be shown is `?`."""
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii"))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="ascii"))
    code = main([*TOY_RUN, "--out", str(tmp_path / "run")])
    sys.stdout.flush()
    sys.stderr.flush()
    assert code == 0, err.getvalue()
    assert b"Vanilla" in out.getvalue() and b"?" in err.getvalue() + out.getvalue()


def test_ctrl_c_while_a_command_loads_its_modules_is_one_line(monkeypatch):
    """Ctrl-C in the first seconds (a command importing the plugins, torch): status 130, one
    line, no traceback."""
    from dllmbench.loading import registry

    def interrupted(selection):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "use_plugins", interrupted)
    err = _stderr(monkeypatch)
    assert main(["plugins"]) == 130
    assert err.getvalue() == "dllmbench: interrupted\n"


def test_ctrl_c_before_a_run_begins_says_nothing_was_written(monkeypatch, tmp_path):
    """Ctrl-C while a run loads its models, before its manifest: the run directory it made is
    removed again, so the line does not say records are kept there."""
    from dllmbench.running import runner

    def interrupted(cfg, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    err = _stderr(monkeypatch)
    out = tmp_path / "run"
    assert main([*TOY_RUN, "--out", str(out)]) == 130
    assert err.getvalue() == (
        f"dllmbench: interrupted; the run had not begun and {out} holds none of it; "
        "run the same command again\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("status", [130, 143])
def test_a_second_ctrl_c_after_an_interrupt_ends_the_process_with_its_status(monkeypatch, status):
    """A user pressing Ctrl-C twice: the second comes while the interpreter shuts down, in
    some exit handler, which printed its traceback under the interrupt's line. After an
    interrupted command the entry point makes the next SIGINT or SIGTERM leave at once with
    the command's status; a command that ended otherwise leaves the signals as they were."""
    import signal

    import dllmbench.cli as cli

    left = []

    def leave(code):
        left.append(code)

    monkeypatch.setattr(os, "_exit", leave)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        monkeypatch.setattr(cli, "main", lambda: 0)
        assert cli.command() == 0
        assert {s: signal.getsignal(s) for s in before} == before
        monkeypatch.setattr(cli, "main", lambda: status)
        assert cli.command() == status
        for signum in before:
            signal.raise_signal(signum)  # the handler runs before the next statement
        assert left == [status, status]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_ctrl_c_pressed_again_while_the_first_is_handled_waits_for_its_line(monkeypatch):
    """Ctrl-C pressed twice in quick succession: the second came while the first was still
    handled (the run unwinding, its line being written), and its KeyboardInterrupt printed a
    traceback instead of the line. It is held: the line is written whole, then the process
    leaves at once with 130."""
    import signal

    import dllmbench.cli as cli
    from dllmbench.loading import registry

    class PressedWhileWritten(io.StringIO):
        def write(self, text: str) -> int:
            signal.raise_signal(signal.SIGINT)  # the second press, as the line goes out
            return super().write(text)

    def loading(selection):
        signal.raise_signal(signal.SIGINT)  # the first, while the command loads its plugins

    left: list[int] = []
    monkeypatch.setattr(os, "_exit", left.append)
    monkeypatch.setattr(registry, "use_plugins", loading)
    err = PressedWhileWritten()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "argv", ["dllmbench", "plugins"])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = cli.command()
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C raised while the first was handled")
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert (status, left) == (130, [130])
    assert err.getvalue() == "dllmbench: interrupted\n"
