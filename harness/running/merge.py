"""`dllmbench merge RUN_DIR`: the results of a sharded run once every share is done.

Reads the manifest and every samples file, checks that each (problem, method) of the run has
its record, and writes results.json, leaderboard.md and compute.json (every process's entry
and their total). A share still running, or records missing, is one line naming the shares.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.schema import Manifest
from dllmbench.core.shape import MANIFEST_FIX, require
from dllmbench.running.summary import summarize_run
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard, running_shares, shards_in


def problem_ids(manifest: dict[str, Any]) -> list[str]:
    ids = manifest.get("task", {}).get("problem_ids")
    if not isinstance(ids, list):
        raise UserError(
            "the manifest lists no problem ids (it is damaged); "
            "run it again without --shard to finish it"
        )
    return [str(x) for x in ids]


def check_complete(rundir: RunDir, manifest: dict[str, Any], ids: list[str]) -> None:
    """Refuse, naming the shares (or problems) that lack records, unless every (problem,
    method) of the run has one."""
    methods = [m["id"] for m in manifest["methods"]]
    have = {(r["problem"], r["method"]) for r in rundir.read_records()}
    lacking = Counter(p for p in ids for m in methods if (p, m) not in have)
    if not lacking:
        return
    counts = sorted({s.count for s in shards_in(rundir.path)})
    missing = sum(lacking.values())
    total = len(ids) * len(methods)
    if len(counts) == 1:
        shares = [Shard(i, counts[0]) for i in range(1, counts[0] + 1)]
        named = []
        for shard in shares:
            gap = sum(lacking[p] for p in shard.share(ids))
            if gap:
                of = len(shard.share(ids)) * len(methods)
                named.append(f"share {shard.label} ({gap} of {of} records missing)")
        what = ", ".join(named)
        fix = f"run the missing share{'s' if len(named) > 1 else ''} with --shard"
    else:
        first = next(iter(lacking))
        what = f"{missing} of {total} records (problem {first!r} and more)"
        fix = "run the missing records with dllmbench run"
    raise UserError(f"{rundir.path} is not complete: missing {what}; {fix}, then merge again")


def merge(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the results of the run directory `path` from every share; return the results
    and the manifest."""
    if not (path / "manifest.json").is_file():
        raise UserError(f"{path} holds no run (no manifest.json); give a run directory")
    busy = [s.label for s in running_shares(path)]
    if busy:
        raise UserError(
            f"share {', '.join(busy)} of {path} is still running; merge when it has finished"
        )
    with RunDir(path) as rundir:
        manifest = require(rundir.read_manifest(), Manifest, rundir.manifest_path, MANIFEST_FIX)
        ids = problem_ids(manifest)
        check_complete(rundir, manifest, ids)
        results = summarize_run(
            rundir,
            manifest,
            ids,
            reference=manifest.get("reference"),
            resamples=manifest["statistics"]["resamples"],
        )
        rundir.write_compute()
    return results, manifest
