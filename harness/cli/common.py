"""What every command shares: the one-line-error parser, the `Reply` a command returns, and
the arguments several commands take (sampling, methods, scorers, preset, --json)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from dllmbench.cli.argtypes import name_list, natural_int, positive_int, scorer_entry
from dllmbench.cli.defaults import declared_default
from dllmbench.core.errors import UserError
from dllmbench.running import presets

# the configuration dataclasses whose defaults the parsers show (`declared_default` reads them
# without importing their modules, which import torch)
SAMPLING = "dllmbench.execution.engine.Sampling"
CAPACITY = "dllmbench.execution.scheduler.Capacity"
RUN_CONFIG = "dllmbench.running.runner.RunConfig"


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`: the one source of a command-line default
    that a configuration dataclass also has (tests/test_defaults.py checks every one). For a
    dataclass whose module imports torch, `declared_default` reads the same from its source."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise KeyError(f"{cls.__name__} has no field {name!r} with a default")


# the sampling protocol when neither a preset, the backbone's own protocol (the shipped tiny
# models') nor the command line sets it: `Sampling`'s; the paper's T and canvas
GENERAL: dict[str, Any] = {
    "steps": declared_default(SAMPLING, "total_steps"),
    "gen_length": declared_default(SAMPLING, "gen_length"),
    "prompt": declared_default(SAMPLING, "prompt_style"),
}
PROMPT_STYLES = ("chat", "fewshot")


# argparse's line for an option whose value is missing: also what it says when the value
# begins with "-" and is no plain number (`--budget -1e9flops` reads as an option)
_NO_VALUE = re.compile(r"argument (?P<names>[^:]+): expected one argument")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit status 2."""

    commands: dict[str, argparse.ArgumentParser]  # the top-level parser's: each command's
    _words: tuple[str, ...] = ()  # what this parser was last given to read

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._words = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(
            f"dllmbench: error: {message}{self._dash_hint(message)} (see '{self.prog} --help')\n"
        )
        raise SystemExit(2)

    def _dash_hint(self, message: str) -> str:
        """How to give an option a value that begins with "-" when argparse took the value
        for an option of its own (`--budget -1e9flops`): `--budget=-1e9flops`."""
        found = _NO_VALUE.fullmatch(message)
        if found is None:
            return ""
        names = found["names"].split("/")
        for word, value in zip(self._words, self._words[1:], strict=False):
            if word in names and value.startswith("-") and value not in self._option_string_actions:
                return f"; a value that begins with '-' is written {word}={value}"
        return ""


@dataclass(frozen=True)
class Reply:
    """What a command found or did. `data` is what `--json` prints (plain JSON data); `show`
    prints the same for a person (a table, a line). The dispatcher calls one of the two."""

    data: Any
    show: Callable[[Console], None]


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) in a command that keeps its finished work: the message says how
    to go on; `status` is the exit status (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, status: int = 130):
        super().__init__(message)
        self.status = status


UNLIMITED = 100_000  # the width of a console that does not wrap: the full tables


def stdout_width() -> int | None:
    """How wide what a command prints may be: COLUMNS when it is a positive number, else the
    terminal's width; None (no limit) for COLUMNS=0, or for piped output (a file, a log)
    when COLUMNS is unset or not a number."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit():
        return int(columns) or None
    if not sys.stdout.isatty():
        return None
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


class _Console(Console):
    """rich's console, but a reader that left (`| head`) is Python's BrokenPipeError, which
    `main` turns into status 141 (rich would exit with status 1)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def stdout_console() -> Console:
    """The console of what a command prints for a person, `stdout_width()` wide; one with no
    limit prints every table in full."""
    return _Console(width=stdout_width() or UNLIMITED)


def table(
    title: str,
    columns: tuple[str, ...],
    rows: list[tuple[str, ...]],
    whole: tuple[str, ...] = (),
) -> Table:
    """A table whose columns in `whole` (names a person copies into a command: a plugin's, a
    method family's) are never wrapped or cut: the other columns make room."""
    out = Table(title=title)
    for i, column in enumerate(columns):
        if column in whole:
            widest = max((cell_len(row[i]) for row in rows), default=0)
            out.add_column(column, no_wrap=True, min_width=max(widest, cell_len(column)))
        else:
            out.add_column(column)
    for row in rows:
        out.add_row(*row)
    return out


def natural_width(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> int:
    """How wide `table(...)` of these columns and rows is with no cell wrapped: each column's
    widest cell, its padding and the borders."""
    widths = [
        max(cell_len(str(cell)) for cell in cells) for cells in zip(columns, *rows, strict=True)
    ]
    return sum(widths) + 3 * len(widths) + 1


def add_json(parser: argparse.ArgumentParser, what: str = "print JSON instead of text") -> None:
    parser.add_argument("--json", action="store_true", help=what)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def add_sampling(
    parser: argparse.ArgumentParser, *, seed: bool = True, defaults: bool = False
) -> None:
    """--steps, --gen-length, --prompt (and --seed): the sampling protocol every method of a
    run shares. Without `defaults` they stay None, so that --preset, the demo and a shipped
    demo model's own protocol fill them before `GENERAL` does (`settings`)."""

    def default(key: str) -> Any:
        return GENERAL[key] if defaults else None

    own = "" if defaults else "; a shipped demo model's own with --backbone tiny or tiny-block"

    parser.add_argument(
        "--steps",
        type=positive_int,
        default=default("steps"),
        help=f"denoising steps T (default {GENERAL['steps']}{own})",
    )
    parser.add_argument(
        "--gen-length",
        type=positive_int,
        default=default("gen_length"),
        help=f"generated tokens per canvas (default {GENERAL['gen_length']}{own})",
    )
    parser.add_argument(
        "--prompt",
        choices=PROMPT_STYLES,
        default=default("prompt"),
        help=f"prompt style (default {GENERAL['prompt']}{own})",
    )
    if seed:
        parser.add_argument("--seed", type=natural_int, default=declared_default(SAMPLING, "seed"))


def add_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=positive_int, help="first N problems of the split")


def add_preset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=sorted(presets.PRESETS),
        help="every setting of a published protocol for --task and --backbone "
        "(docs/reproducing.md); explicit flags and options override single values",
    )


def add_methods(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--methods", type=name_list, help="comma-separated method families; default: all"
    )
    parser.add_argument(
        "--method",
        action="append",
        default=[],
        metavar="SPEC",
        help="a method spec, e.g. independent:n=8+majority; repeatable",
    )


def add_scorers(parser: argparse.ArgumentParser, metavar: str, what: str) -> None:
    parser.add_argument(
        "--scorer", action="append", default=None, type=scorer_entry, metavar=metavar, help=what
    )


def methods_arg(args: argparse.Namespace) -> list[str] | None:
    """--methods and --method together, or None for every family."""
    return (list(args.methods or []) + list(args.method)) or None


def scorers_arg(entries: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """`--scorer prm` or `--scorer orm=toy:partial=false` → {run name: (plugin, config)}."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    given: dict[str, str] = {}  # run name → the entry that gave it
    for entry in entries:
        name, eq, plugin = entry.partition("=")
        if name.strip() in given:
            raise UserError(
                f"--scorer {name.strip()} is given twice ({given[name.strip()]!r} and "
                f"{entry!r}); give each scorer name once"
            )
        given[name.strip()] = entry
        out[name.strip()] = plugin_arg("scorer", plugin if eq else name)
    return out


_FORMS = {  # how --KIND is written, and an example: for a line naming what is missing
    "task": ("task[:option=value,...]", "arith:test_size=50"),
    "backbone": ("backbone[:option=value,...]", "tiny:temperature=0.5"),
    "scorer": ("NAME=PLUGIN[:option=value,...]", "orm=orm:checkpoint=DIR"),
}


def plugin_arg(kind: str, text: str) -> tuple[str, dict[str, Any]]:
    """`--task arith:test_size=50` and the like → (name, options): an unknown plugin is one
    line listing the known ones, an option that is not key=value one naming the plugin's
    options."""
    from dllmbench.execution.method import parse_part
    from dllmbench.loading.registry import options, registry

    name = text.partition(":")[0].strip()
    if not name:  # `--backbone :`, `--task :x=1`: parse_part's line would speak of a method
        form, example = _FORMS.get(kind, (f"{kind}[:option=value,...]", "NAME"))
        raise UserError(f"--{kind} {text!r} names no {kind}; give {form}, e.g. {example}")
    info = registry().info(kind, name)  # unknown: the registry's line
    try:
        return parse_part(text)
    except UserError:
        items = text.partition(":")[2].split(",")
        bad = next((i for i in items if i.strip() and not i.partition("=")[0].strip()), None)
        bad = next((i for i in items if i.strip() and "=" not in i), bad)
        if info is None or bad is None:  # an option given twice: parse_part's line
            raise
    known = ", ".join(options(info.factory)) or "none"
    raise UserError(
        f"{kind} {name!r} option {bad.strip()!r} is not key=value; its options: {known}"
    ) from None


@dataclass
class Settings:
    """--task, --backbone and --scorer parsed, a preset's values applied."""

    task: str | None
    task_config: dict[str, Any]
    backbone: str | None
    backbone_config: dict[str, Any]
    scorers: dict[str, tuple[str, dict[str, Any]]] | None
    preset: dict[str, Any] | None  # what the preset set and what was overridden


def settings(args: argparse.Namespace, defaults: dict[str, Any]) -> Settings:
    """Parse --task, --backbone and --scorer; fill the flags from --preset, then from
    `defaults`. An explicit flag or plugin option always wins over the preset's value."""
    task, task_config = plugin_arg("task", args.task) if args.task else (None, {})
    backbone, backbone_config = (
        plugin_arg("backbone", args.backbone) if args.backbone else (None, {})
    )
    scorers = None if args.scorer is None else scorers_arg(args.scorer)
    record = None
    if args.preset:
        if task is None or backbone is None:
            raise UserError(
                f"--preset {args.preset} needs --task and --backbone; e.g. "
                f"--preset {args.preset} --task gsm8k --backbone dream"
            )
        resolved = presets.apply(
            args.preset,
            backbone=backbone,
            task=task,
            flags={key: getattr(args, key) for key in presets.FLAGS},
            backbone_config=backbone_config,
            task_config=task_config,
            scorers=scorers,
        )
        for key, value in resolved.flags.items():
            setattr(args, key, value)
        task_config, backbone_config = resolved.task_config, resolved.backbone_config
        scorers, record = resolved.scorers, resolved.record
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return Settings(task, task_config, backbone, backbone_config, scorers, record)


def check_canvas(backbone: str | None, config: Any, gen_length: int) -> None:
    """A canvas of `gen_length` positions must leave room for the prompt in the backbone's
    model (`KnowsPositions`, read from its config.json before any weights load): one line
    instead of a run that crawls over a canvas the model was never trained on."""
    from dllmbench.api.interfaces import positions

    limit = positions(config) if backbone else None
    if limit is not None and gen_length >= limit:
        raise UserError(
            f"--gen-length {gen_length} does not fit backbone {backbone!r}: its model has "
            f"{limit} positions for the prompt and the canvas together; give --gen-length "
            f"below {limit}, e.g. --gen-length {min(GENERAL['gen_length'], limit // 2)}"
        )
