"""The command line: `dllmbench run | merge | status | report | plan | plugins | tasks | collect |
train-scorer | diagnose | demo`.

One module per command, each with its own parser (`add_parser`) and an `execute(args)` that
returns a `Reply`: the data `--json` prints, and how to show it to a person. `main` parses,
dispatches, prints one or the other, and turns errors into one line and an exit status.

Importing this package and building the parser load neither torch nor transformers (nor the
plugins): `--help`, `--version`, an argument error, `status` and `merge` answer at once. A
command imports what it runs on (the registry, the engine, the models) inside `execute`;
tests/test_startup.py holds every command module to that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from dllmbench import __version__
from dllmbench.cli import (
    collect,
    demo,
    diagnose,
    merge,
    plan,
    plugins,
    report,
    run,
    status,
    tasks,
    train_scorer,
)
from dllmbench.cli.common import Interrupted, Parser, Reply, stdout_console
from dllmbench.core.errors import CostMismatch, Notice, PluginViolation, Terminated, UserError

COMMANDS = (run, merge, status, report, plan, plugins, tasks, collect, train_scorer, diagnose, demo)

# exit statuses (docs/user-guide.md)
OK, USER_ERROR, INTERRUPTED, BROKEN_PIPE, TERMINATED = 0, 2, 130, 141, 143
# OpenMP spin-waits before a torch thread sleeps (`spin_briefly`)
SPIN_COUNT = "30000"

__all__ = ["COMMANDS", "Reply", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dllmbench",
        description=(
            "Compare test-time search strategies for diffusion LMs "
            "at a matched forward-pass budget."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dllmbench {__version__}")
    # `dllmbench --json plugins` as well as `dllmbench plugins --json`
    parser.add_argument("--json", dest="json_before", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--debug",
        dest="debug_before",
        action="store_true",
        help="print the traceback of a user error (2) or a plugin's fault (3) too; "
        "also DLLMBENCH_DEBUG=1",
    )
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    parser.commands = sub.choices  # each command's own parser: its errors name its --help
    return parser


def _reply(args: argparse.Namespace) -> int:
    reply: Reply = args.execute(args)
    if args.json or args.json_before:
        print(json.dumps(reply.data, indent=2))
    else:
        reply.show(stdout_console())
    sys.stdout.flush()  # a write that fails fails here, where it is handled
    return OK


def _error(message: str, status: int, debug: bool = False) -> int:
    if debug:
        traceback.print_exc()
    sys.stderr.write(f"dllmbench: {message}\n")
    return status


def command() -> int:
    """The `dllmbench` command: `main` on the process's arguments, as its entry point."""
    del _TERMS_HELD[:]
    with _later_interrupts_held() as held:
        status = main()
    if status in (INTERRUPTED, TERMINATED):
        if held or _TERMS_HELD:  # pressed (or sent) again while the first was handled: its
            _leave(status)  # line is out; leave
        _leave_at_the_next_signal(status)
    return status


# SIGTERMs that came while the first was handled (`_terminated_on_sigterm`)
_TERMS_HELD: list[int] = []


def _hold_terms(signum: int, frame: Any) -> None:
    _TERMS_HELD.append(signum)


@contextlib.contextmanager
def _terminated_on_sigterm() -> Iterator[Callable[[], None]]:
    """SIGTERM raises `Terminated` in the main thread for the whole command, as `run` has
    long done for its own span: every command unwinds as from Ctrl-C (its files written
    whole, its locks released) and says in one line what is kept and how to go on, where the
    default action ended the process with no line, leaving its locks and temporary files
    behind. SIGTERMs after the first, until the command returns, are held (`_TERMS_HELD`), so
    the first's tidying and line are not cut short; the entry point then leaves. Yields the
    call that starts holding them (a `Terminated` raised by `run`'s own handler, an interrupt
    being handled). A disposition not the default (SIGTERM ignored) is left alone."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield lambda: None
        return

    def hold() -> None:
        if signal.getsignal(signal.SIGTERM) is first:
            signal.signal(signal.SIGTERM, _hold_terms)

    def first(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, _hold_terms)
        raise Terminated

    signal.signal(signal.SIGTERM, first)
    try:
        yield hold
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _later_interrupts_held() -> Iterator[list[int]]:
    """The first Ctrl-C raises KeyboardInterrupt as ever; those after it, until the command
    returns, are held (listed in what this yields): a KeyboardInterrupt raised while the first
    is handled (records kept, locks released, its line written) would cut the tidying short
    and print a traceback under the line, or instead of it. A third press leaves at once, in
    case the tidying hangs. In the main thread, where SIGINT has Python's own handler only."""
    held: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield held
        return

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)
        if len(held) > 1:
            _leave(INTERRUPTED)

    def first(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, hold)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, first)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _leave(status: int) -> None:
    """End the process at once with `status`, what is printed flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(status)


def _leave_at_the_next_signal(status: int) -> None:
    """After an interrupt, a second Ctrl-C or SIGTERM (a user pressing twice) ends the process
    at once with `status`, instead of a traceback from whatever exit handler it lands in.
    Every record is written before the first interrupt's line; what is left is tidying (a lock
    left behind is taken over by the next command)."""

    def leave(signum: int, frame: Any) -> None:
        _leave(status)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, leave)


def _debugging(args: argparse.Namespace) -> bool:
    flags = getattr(args, "debug", False) or args.debug_before
    return flags or os.environ.get("DLLMBENCH_DEBUG", "") not in (
        "",
        "0",
    )


def spin_briefly() -> None:
    """torch's CPU threads (OpenMP) wait for the next parallel region by spinning about 0.3 ms
    (GOMP_SPINCOUNT=30000) before they sleep, instead of OpenMP's own 3 ms, unless
    OMP_WAIT_POLICY or GOMP_SPINCOUNT says otherwise. On cores busy with other work a spinning
    thread burns the time its sibling needs to reach the barrier: beside two spinning processes
    the demo cost 3.5 to 3.9 times its idle CPU-seconds, 1.1 now. A shorter spin costs as
    little there but puts the thread to sleep in the sampler's pauses between a forward's
    operations, to be woken for the next: on idle cores 0.3 ms made the demo 11% faster than
    30 µs (benchmarks/bench_busy.py, docs/performance.md). Read once, when torch loads: so
    before any command imports it."""
    if "torch" not in sys.modules and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT


def main(argv: list[str] | None = None) -> int:
    """Exit statuses: 0 done; 1 a dllmbench bug (its traceback); 2 a user error; 3 a plugin's
    fault (its contract broken, or an exception raised in its code) or a failed ledger check;
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM). 2 and 3 are one line, with the
    traceback under --debug."""
    spin_briefly()
    for name in ("COLUMNS", "LINES"):  # a size that is no number (`²`) is ignored, not a crash
        value = os.environ.get(name, "0")
        if not (value.isascii() and value.isdigit()):
            del os.environ[name]
    if sys.stderr is None:  # `dllmbench … 2>&-`: the lines meant for it go nowhere
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)
    if sys.stdout is None:  # `dllmbench … >&-`: nowhere to print
        sys.stderr.write(
            "dllmbench: error: stdout is closed; give the command somewhere to write\n"
        )
        return USER_ERROR
    for stream in (sys.stdout, sys.stderr):  # `×` and `≈` on an ASCII terminal: `?`, no crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, which names its own --help
        chosen = parser.commands.get(args.command) if args.command else None
        (chosen or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return USER_ERROR
    debug = _debugging(args)
    with _terminated_on_sigterm() as hold:
        return _dispatch(args, debug, hold)


def _dispatch(args: argparse.Namespace, debug: bool, hold: Callable[[], None]) -> int:
    """Run the command `args` names; its errors and interrupts as one line and a status."""
    stdout, sys.stdout = sys.stdout, _Guarded(sys.stdout)
    try:
        from dllmbench.loading.manager import PluginSelection  # pluggy: once a command runs
        from dllmbench.loading.registry import use_plugins

        use_plugins(PluginSelection.from_environment(os.environ))
        with warnings.catch_warnings():
            warnings.simplefilter("always", Notice)  # each is said once where it arises
            warnings.showwarning = _notice_line(warnings.showwarning)
            return _reply(args)
    except UserError as exc:
        return _error(f"error: {exc}", USER_ERROR, debug)
    except PluginViolation as exc:
        hint = "" if debug or exc.__cause__ is None else " (--debug shows the traceback)"
        return _error(f"error: {exc}{hint}", PluginViolation.EXIT_CODE, debug)
    except CostMismatch as exc:
        return _error(f"ledger check failed: {exc}", 3, debug)
    except Interrupted as exc:
        hold()
        return _error(str(exc), exc.status)
    except Terminated:
        hold()
        return _error(_stopped("terminated (SIGTERM)", args), TERMINATED)
    except KeyboardInterrupt:
        hold()
        return _error(_stopped("interrupted", args), INTERRUPTED)
    except BrokenPipeError:  # `dllmbench plugins --json | head`: the reader left; so do we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except StdoutFailed as exc:  # `> /dev/full`: what is printed cannot be kept
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _error(f"error: cannot write to stdout: {exc}", USER_ERROR)
    finally:
        sys.stdout = stdout


def _stopped(what: str, args: argparse.Namespace) -> str:
    """The line of a command interrupted (`what`): for a command that writes, what it kept
    and how to go on (its `kept(args)`, set as a parser default)."""
    kept = getattr(args, "kept", None)
    if kept is None:
        return what
    try:
        return f"{what}; {kept(args)}"
    except Exception:  # the line must come whatever the arguments are
        return what


def _notice_line(show: Any) -> Any:
    """`warnings.showwarning` that prints a `Notice` as one line on stderr and passes any
    other warning to `show`."""

    def shown(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, Notice):
            sys.stderr.write(f"dllmbench: warning: {message}\n")
        else:
            show(message, category, filename, lineno, file, line)

    return shown


class StdoutFailed(Exception):
    """Writing to stdout failed (a full disk, `/dev/full`): not the command's fault."""


class _Guarded:
    """stdout, whose failures to write (but a reader that left) are `StdoutFailed`."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutFailed(exc.strerror or str(exc)) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutFailed(exc.strerror or str(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


if __name__ == "__main__":
    raise SystemExit(main())
