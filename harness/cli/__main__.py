"""`python -m dllmbench.cli ARGS`: the `dllmbench` command."""

from dllmbench.cli import command

raise SystemExit(command())
