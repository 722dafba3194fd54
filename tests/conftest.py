"""Tests run with the deterministic doubles registered as plugins, so the contract kit
checks them too and the engine tests have a backbone, a task and a scorer."""

from __future__ import annotations

import os

os.environ["DLLMBENCH_PLUGIN_MODULES"] = "dllmbench.testing.doubles"
os.environ.pop("DLLMBENCH_PLUGINS", None)
