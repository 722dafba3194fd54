"""The contract kit's other process: strategies' records under another `PYTHONHASHSEED`.

A pool that depends on `hash()` of a string, or on the order of a set of strings, changes
from one process to the next; one process never sees it. `records_elsewhere` runs every
(strategy, configuration) given in a child process with the hash seed given, through the
same engine and doubles as the kit (`run_kit` at T = `STEPS`), and returns each one's
records as JSON data, or the one line its run raised.

    python -m dllmbench.testing.elsewhere < pairs.json   # [[name, config], ...] → records
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from typing import Any

from dllmbench.testing.helpers import STEPS


def pair_key(name: str, config: dict[str, Any]) -> str:
    return json.dumps([name, config], sort_keys=True)


def as_data(records: dict[tuple[int, str, str], dict[str, Any]]) -> dict[str, Any]:
    """Records by (T, problem, method) as JSON data: what a child process can send back."""
    return json.loads(json.dumps({"|".join(map(str, k)): v for k, v in records.items()}))


@cache
def records_elsewhere(hash_seed: str, pairs_json: str) -> dict[str, Any]:
    """pair_key → records (`as_data`) or {"error": line}, computed in a child process whose
    PYTHONHASHSEED is `hash_seed`, with this process's plugins and import path."""
    env = {
        **os.environ,
        "PYTHONHASHSEED": hash_seed,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    done = subprocess.run(
        [sys.executable, "-m", "dllmbench.testing.elsewhere"],
        input=pairs_json,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-1:])
        raise AssertionError(f"the kit's other process failed: {tail}")
    return json.loads(done.stdout)


def main() -> None:
    from dllmbench.loading.manager import PluginSelection
    from dllmbench.loading.registry import use_plugins
    from dllmbench.testing.contracts import kit_method, run_kit

    use_plugins(PluginSelection.from_environment(os.environ))  # the parent's plugins

    out: dict[str, Any] = {}
    for name, config in json.load(sys.stdin):
        try:
            records = run_kit([kit_method(name, config)], (STEPS,))
        except AssertionError as exc:
            out[pair_key(name, config)] = {"error": str(exc)}
            continue
        out[pair_key(name, config)] = as_data(records)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
