"""`python -m dllmbench ARGS`: the `dllmbench` command (launchers such as `accelerate launch
-m dllmbench` and job scripts run it this way)."""

from dllmbench.cli import command

raise SystemExit(command())
