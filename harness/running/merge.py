"""`dllmbench merge RUN_DIR`: the results of a sharded run once every share is done.

Reads the manifest and every samples file, checks that each (problem, method) of the run has
its record, and writes compute.json (every process's entry and their total), then results.json
and leaderboard.md: results.json is written last, so a merge cut short never leaves it beside
a compute.json that does not account for the records. A share still running, or records
missing, is one line naming the shares.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dllmbench.core.errors import UserError
from dllmbench.core.shape import require_manifest
from dllmbench.running.summary import summarize_run
from dllmbench.storage.claims import CLAIMS, Claims, abandoned
from dllmbench.storage.heartbeat import read_beats
from dllmbench.storage.rundir import RunDir
from dllmbench.storage.shards import Shard, running_shares, shards_in

POLL_SECONDS = 2.0
SAY_EVERY = 60.0  # seconds between "waiting for …" lines


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
    method) of the run has one; and a record that is not of the run (`refuse_strays`)."""
    methods = [m["id"] for m in manifest["methods"]]
    have = {(r["problem"], r["method"]) for r in rundir.read_records(manifest)}
    lacking = Counter(p for p in ids for m in methods if (p, m) not in have)
    if not lacking:
        return
    # the share counts that ran here (a share of no problems writes no samples file)
    ran = [*shards_in(rundir.path), *shards_in(rundir.path, "compute")]
    counts = sorted({s.count for s in ran})
    missing = sum(lacking.values())
    total = len(ids) * len(methods)
    if (rundir.path / CLAIMS).exists():  # a launched run: chunks, not fixed shares
        open_ = [
            c for c in Claims(rundir.path, ids).chunks() if any(p in lacking for p in c.problems)
        ]
        named = ", ".join(str(c.index + 1) for c in open_[:5]) + (" …" if len(open_) > 5 else "")
        what = f"{missing} of {total} records (in chunk {named})"
        fix = "launch the run again to finish them"
    elif len(counts) == 1:
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


def merge(
    path: Path, wait: bool = False, timeout: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the results of the run directory `path` from every share; return the results
    and the manifest. `wait`: first wait until every record is written (`wait_for`)."""
    if wait:
        wait_for(path, timeout)
    elif not (path / "manifest.json").is_file():
        raise UserError(f"{path} holds no run (no manifest.json); give a run directory")
    busy = [s.label for s in running_shares(path)]
    if busy:
        raise UserError(
            f"share {', '.join(busy)} of {path} is still running; merge when it has finished"
        )
    with RunDir(path) as rundir:
        manifest = require_manifest(rundir.read_manifest(), rundir.manifest_path)
        ids = problem_ids(manifest)
        check_complete(rundir, manifest, ids)
        # compute.json first, results.json last: a merge cut short between the two leaves
        # no results.json (or the one before, of the same records), never a results.json
        # beside a compute.json that does not account for its records (`status` checks)
        rundir.write_compute(accounted=True)
        results = summarize_run(
            rundir,
            manifest,
            ids,
            reference=manifest.get("reference"),
            resamples=manifest["statistics"]["resamples"],
        )
    return results, manifest


def wait_for(path: Path, timeout: float | None = None) -> None:
    """Return when every (problem, method) of the run has its record and no share runs.
    Stop with one line when a process died without finishing (its share, or a chunk it
    held, names it), or after `timeout` seconds."""
    start = time.monotonic()
    _wait_for_the_run(path, start, timeout)
    last_said = time.monotonic()
    rundir = RunDir(path)
    manifest = rundir.read_manifest()
    ids = problem_ids(manifest)
    methods = [m["id"] for m in manifest.get("methods", [])]
    wanted = {(p, m) for p in ids for m in methods}
    seen: tuple[tuple[str, int], ...] | None = None
    have: set[tuple[str, str]] = set()
    while True:
        busy = running_shares(path)
        sizes = tuple((f.name, f.stat().st_size) for f in rundir.samples_files())
        if sizes != seen:  # records are read again only when a samples file grew
            seen = sizes
            have = {(r["problem"], r["method"]) for r in rundir.read_records()}
        if not busy and wanted <= have:
            return
        _refuse_the_dead(path, ids)
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            what = ", ".join(f"share {s.label}" for s in busy) or (
                f"{len(wanted - have)} of {len(wanted)} records"
            )
            raise UserError(
                f"{path} is not complete after --wait-timeout {timeout:g} s (waiting for "
                f"{what}); merge again later"
            )
        if time.monotonic() - last_said >= SAY_EVERY:
            print(
                f"dllmbench: waiting: {len(have & wanted)}/{len(wanted)} records"
                + (f"; share {', '.join(s.label for s in busy)} running" if busy else ""),
                file=sys.stderr,
                flush=True,
            )
            last_said = time.monotonic()
        time.sleep(POLL_SECONDS)


def _wait_for_the_run(path: Path, start: float, timeout: float | None) -> None:
    """Return when `path` holds a run (its manifest.json: the first share to start writes it
    once its plugins are built), as for a merge job that starts with the array it merges;
    one line after `timeout` seconds, or when a share that began died before it."""
    last_said = start
    while not (path / "manifest.json").is_file():
        if path.exists() and not path.is_dir():
            raise UserError(f"{path} is not a directory; give a run directory")
        if path.is_dir():
            _refuse_the_dead(path, [])
        if timeout is not None and time.monotonic() - start >= timeout:
            raise UserError(
                f"{path} holds no run after --wait-timeout {timeout:g} s (no manifest.json: no "
                "share has started); check that the shares run with --out "
                f"{path}, then merge again"
            )
        if time.monotonic() - last_said >= SAY_EVERY:
            print(
                f"dllmbench: waiting for a share to start a run in {path}",
                file=sys.stderr,
                flush=True,
            )
            last_said = time.monotonic()
        time.sleep(POLL_SECONDS)


def _refuse_the_dead(path: Path, ids: list[str]) -> None:
    """One line naming a share whose process died without finishing, or a chunk held by a
    process that is gone."""
    beats = read_beats(path)
    if (path / CLAIMS).exists():
        gone = abandoned(Claims(path, ids).chunks(), beats)
        if gone:
            chunk = gone[0]
            holder = beats.get(chunk.share)
            who = f" ({holder.who})" if holder is not None else ""
            raise UserError(
                f"chunk {chunk.index + 1} (problems {chunk.problems[0]} to "
                f"{chunk.problems[-1]}) is held by share {chunk.share}{who}, which is gone; "
                "launch the run again to finish it, then merge"
            )
        return
    for label, beat in beats.items():
        if label is not None and beat.state != "finished" and not beat.alive():
            how = "stopped" if beat.state == "stopped" else "died"
            raise UserError(
                f"share {label} ({beat.who}) {how} without finishing; run it again with "
                f"--shard {label} (it resumes), then merge"
            )
