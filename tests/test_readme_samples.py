"""The README's samples are what the commands print: each `$ dllmbench ...` line in a fenced
block, and the lines below it up to the next `$` or the block's end, are run and compared."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def samples(text: str) -> list[tuple[str, str]]:
    """(command, what it prints) for each `$ dllmbench` line of the fenced blocks of `text`."""
    found = []
    for block in FENCE.findall(text):
        command, printed = None, []
        for line in [*block.splitlines(), "$"]:
            if line.startswith("$"):
                if command is not None:
                    found.append((command, "\n".join(printed)))
                command = line[2:] if line.startswith("$ dllmbench ") else None
                printed = []
            else:
                printed.append(line)
    return found


def normalised(text: str) -> str:
    """Lines without their trailing spaces (a centred title pads its right side), no trailing
    empty lines: nothing else varies between a run and the sample."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


SAMPLES = samples(README.read_text())


def test_the_readme_has_samples():
    assert [command for command, _ in SAMPLES] == ["dllmbench plan --budget 1040"]


@pytest.mark.parametrize(("command", "printed"), SAMPLES, ids=[c for c, _ in SAMPLES])
def test_a_readme_sample_is_what_the_command_prints(cli, monkeypatch, command, printed):
    """As a user runs it: the built-in plugins only (not the test doubles, nor a third-party
    package installed beside dllmbench, whose families the README does not show), output
    piped."""
    monkeypatch.delenv("DLLMBENCH_PLUGIN_MODULES", raising=False)
    monkeypatch.setenv("DLLMBENCH_PLUGINS", "")  # no entry points: the built-ins
    monkeypatch.delenv("COLUMNS", raising=False)
    result = cli(*shlex.split(command)[1:])
    assert result.code == 0, result.err
    assert normalised(result.out) == normalised(printed)
    assert printed.strip()  # a sample shows output
