"""`python -m dllmbench.cli ARGS`: the `dllmbench` command."""

from dllmbench.cli import main

raise SystemExit(main())
