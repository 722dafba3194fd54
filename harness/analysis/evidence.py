"""A run directory's evidence, as the plain inputs of `pooled` and `diagnostics`.

API (every function is pure over the loaded run; nothing is written)::

    run = load_run(run_dir)                  # RunData: path, manifest, records, results
    run = run_data(path, manifest, records)  # the same from data already read
    run.problems                             # problem ids with a record, in natural order
    independent_pools(run)                   # {pool key: PoolSet}, plain pools, largest
    nested_pools(run)                        # {pool key: PoolSet}, every nested pool
    pools_by_method(run)                     # {method id: PoolSet}, every method's final pool
    scored_states(run, scorer="prm", labels="continuation", method=None)
                                             # [ScoredState]: scored states of guided runs
    guided_states(run, ...)                  # [State]: the same, with identity and kind
    final_states(run, scorer)                # [ScoredState]: a scorer on final candidates
    candidate_states(run, scorer)            # [State]: the same, with identity and kind
    merge_states([states, ...])              # [State]: each distinct state once
    pruning_events(run, method=None)         # [PruningEvent]: the first cut of guided runs
    smc_checkpoints(run, method=None, final=False)   # [SMCCheckpoint]
    recorded_ess(run, method=None)           # the ESS each checkpoint recorded, or None
    read_method(run, method_id)              # UnreadableEvidence unless the report can read it
    unreadable(run)                          # {method id: why}: what read_method refuses
    leave_out(run, method_ids)               # the run without those methods
    guided_methods(run)                      # method ids declaring cuts or particles
    pool_key(run.methods[method_id])         # the method's strategy without its size

`PoolSet` holds `problems` (ids, in `run.problems` order) and `pools` (one tuple of
`pooled.PooledCandidate` per problem, in pool order); `scorers` names the scorers every
candidate carries and `prefix(n)` cuts every pool to its first n candidates. Feed
`pool_set.pools` to `pooled.pooled_curves`, `diagnostics.pool_diversity` or
`diagnostics.scorer_swap`.

Declarations, not names. Every function reads what each method's strategy declared it
records (the manifest's `evidence`, `dllmbench.interfaces.Evidence`), never a strategy's
name: "independent pools" are those of strategies declaring nested plain samples
(`independent`), "guided runs" those declaring pruning cuts in the segment layout
(`prm_guided`, or any third-party strategy declaring `cuts`) or particle checkpoints (`smc`,
`particles`). A run made before declarations were recorded has none, and gets no
diagnostics.

Pool keys and shared runs. The pool key of a method is its strategy without its size:
`independent` for `independent:n=8` (other options kept, `independent:x=1`), and the whole
strategy spec for any other strategy (`prm_guided:every=64,final=keep,k=8,keep=1,scorer=prm`).
Methods with the same key share one strategy run (docs/architecture.md, "Shared strategy
runs"): `independent_pools` merges their records into one pool per problem, the largest
any of them holds (candidate i is the same candidate in each), each candidate carrying the
scores of every record that scored it (ORM Rerank@8 scores the first 8 of a pool of 32, so
`orm` is on those 8 only: `PoolSet.scorers` lists what every candidate carries). Diagnostics
of guided runs count each (pool key, problem) once, whichever methods share it.

Which states get labels (`scored_states`). A guided run records, at each segment, the step
reached, every child's mask ratio and score, its parent and which children were kept
(docs/results-schema.md, `info`). A state's label must be the correctness of a final answer
the state leads to, and a state's future is observed only in some cases:

- `labels="continuation"` (default): a state is labelled by the final answer of its own
  trajectory continued without guidance. Under common random numbers the first segment's
  child i (lineage (i,)) is the first `every` steps of independent candidate i, which
  continues it with the same noise to step T (docs/architecture.md, "Common random
  numbers"); so every first-segment child, kept or removed, gets the correctness of
  independent candidate i of the same problem, when the run holds that candidate. The final
  segment's children of a `final=keep` run are final candidates: each gets its own
  correctness (mask ratio 0). Left out: children of later segments (they start from a
  parent chosen by the scorer and continue under new keys; no unguided continuation of them
  is recorded), the final segment of `final=prune` runs (only the argmax is graded), and
  first-segment children with no independent candidate of the same lineage.
- `labels="lineage"`: a state is labelled True when some final candidate descending from it
  is correct, only when every final descendant it has is recorded and it has at least one:
  in `final=keep` runs, the kept children of each segment and all final children; removed
  children (no future) and every non-final state of `final=prune` runs (their other final
  children are not graded) are left out; the argmax of a `final=prune` run is labelled.
  These labels are selection-biased: a kept state carries the search's later choices.

What a state is (`State.key`). A state is identified by its problem, its history and its
content, and two states are one only when all three agree. Its history: the steps of the cuts
before it, its step, its lineage and, when its strategy run had edited canvases by then (a
candidate of the record carries an edit, `edits`, at or before that step), that strategy run
(its pool key). Its content: its mask ratio and score and, for a recorded candidate, its text
and edits. Scores are compared within `SAME_SCORE` (relative, or absolute near zero), not bit
for bit: the same row scored in another batch (a resumed run, another share, other batch
caps) differs in the last bits, and would otherwise count twice. So the first segment of PRM
Guided and Top-M at the same `every` (the same rows under common random numbers) is counted
once, within a run and across runs, while the states
of a strategy that edits (re-masks) canvases are never merged with another strategy's, even
at the same step and lineage. `State.kind` says which states it is of: `first_segment` (the
first segment's children, before the first cut), `later_segment`, and `final` (the last
segment's children: the kept branch's final states; every candidate of `final_states`).

Removal risk (`pruning_events`). The first cut of a guided run (after its first segment,
when it has more than one) keeps some first-segment children and removes the rest. A removed
child's future is not observed in the guided run, but under common random numbers its own
unguided continuation is independent candidate i; `reaches_correct[(i,)]` is that
candidate's correctness, for kept and removed children alike. A cut is left out when the run
lacks any of those K independent candidates. Later cuts are left out: the children they
remove have no recorded future. So removal risk measures how often the first cut discards
every first-segment prefix whose own continuation is correct.

SMC (`smc_checkpoints`): one `SMCCheckpoint` per intermediate checkpoint of each SMC run
(weights before resampling, normalized; β; whether it resampled; the ancestors after
resampling, None when it did not). The final checkpoint (β = 1, never resampled) is included
only with `final=True`. The weights are recorded to 6 digits, so an ESS recomputed from them
is not the strategy's: `recorded_ess` gives, checkpoint for checkpoint, the ESS the strategy
computed from its unrounded weights (its `info["ess"]`), None where a record lacks it.

`final_states(run, scorer)`: the scorer's score on each candidate of the independent pools
that carries it, labelled by its correctness, mask ratio 0.

`method=` restricts a function to the strategy runs of one method id (its pool key); an
unknown method id is a ValueError. Records whose `info` lacks the segment fields (made
before they were recorded) are skipped.

Evidence that cannot be read (`read_method`, `unreadable`, `leave_out`). Records whose `info`
holds the segment or checkpoint fields but not in their layout (lists of one entry per segment
or checkpoint, one number per child, `kept` and `parent` naming children that exist, children
of one parent consecutive and continuing a child the cut before kept, the last `kept` giving
the candidates' lineages in pool order), or whose shared pool differs between methods, raise
`UnreadableEvidence` (a ValueError) in one line. `read_method(run, method)` reads all a
method declared as the report does; `unreadable(run)` gives each method it refuses with why;
`leave_out(run, methods)` is the run without them. The report leaves such a method out of its
pooled curves and diagnostics; the contract kit fails a strategy whose records it refuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllmbench.analysis.diagnostics import (
    PruningEvent,
    ScoredState,
    SMCCheckpoint,
    checkpoint_stats,
)
from dllmbench.analysis.pooled import PooledCandidate, shared_scorers
from dllmbench.core.errors import UserError
from dllmbench.core.jsonfile import read_object
from dllmbench.core.schema import MethodsManifest
from dllmbench.core.shape import MANIFEST_FIX, require, require_results
from dllmbench.storage.rundir import RunDir

SEGMENT_FIELDS = ("step", "mask", "scores", "parent", "kept")
CHECKPOINT_FIELDS = ("beta", "resampled", "weights", "ancestors")
LABELS = ("continuation", "lineage")
# the kinds of scored state, in the order the report lists them
STATE_KINDS = ("first_segment", "later_segment", "final")

Lineage = tuple[int, ...]
Edits = tuple[tuple[int, tuple[int, ...]], ...]


class UnreadableEvidence(ValueError):
    """A method's records do not hold what its strategy declared in the layout this module
    reads (one line saying what; see the module docstring)."""


# Two scores of one state (the same problem, history and content but the score) within this,
# relative (absolute near zero), are one state: a row scored in another batch differs in the
# last bits, and `info` rounds scores to 6 decimals
SAME_SCORE = 1e-5


@dataclass(frozen=True)
class State:
    """A labelled scored state with what identifies it: `key` is (problem, history, content)
    (see the module docstring) without the score, which `merge_states` compares within
    `SAME_SCORE`; `kind` one of `STATE_KINDS`."""

    scored: ScoredState
    kind: str
    key: tuple[Any, ...]


def merge_states(lists: Sequence[Sequence[State]]) -> list[State]:
    """Every distinct state of the lists once (the first of each key), in order: a state two
    run directories, or two strategy runs, share counts once; different states never merge."""
    seen: dict[tuple[Any, ...], list[float]] = {}
    out = []
    for states in lists:
        for state in states:
            scores = seen.setdefault(state.key, [])
            score = state.scored.score
            if not any(_same_score(score, other) for other in scores):
                scores.append(score)
                out.append(state)
    return out


def _same_score(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=SAME_SCORE, abs_tol=SAME_SCORE)


def _edits(candidate: dict[str, Any], until: int | None = None) -> Edits:
    """A candidate's canvas edits, (step, positions), those at or before `until` if given."""
    return tuple(
        (int(step), tuple(int(p) for p in positions))
        for step, positions in candidate.get("edits") or ()
        if until is None or int(step) <= until
    )


@dataclass(frozen=True)
class RunData:
    """A loaded run directory. `by_method`: method id → problem id → record (methods of the
    manifest only); `results` is None when results.json is absent (an interrupted run)."""

    path: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    results: dict[str, Any] | None
    by_method: dict[str, dict[str, dict[str, Any]]]

    @property
    def methods(self) -> dict[str, dict[str, Any]]:
        """Method id → its manifest entry, in manifest order."""
        return {m["id"]: m for m in self.manifest["methods"]}

    @property
    def problems(self) -> tuple[str, ...]:
        """Every problem id with a record, in natural order (digit runs compared as numbers:
        test-2 before test-10)."""
        return tuple(sorted({r["problem"] for r in self.records}, key=_natural))


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory's manifest, records (a torn last line left out) and results."""
    path = Path(run_dir)
    fix = "give the directory a `dllmbench run` wrote (its --out)"
    if not (path / "manifest.json").is_file():
        raise UserError(f"{path} is not a run directory (it has no manifest.json); {fix}")
    manifest = require(
        read_object(path / "manifest.json", fix),
        MethodsManifest,
        path / "manifest.json",
        MANIFEST_FIX,
    )
    records = RunDir(path).read_records()
    results_file = path / "results.json"
    results = None
    if results_file.is_file():
        rewrite = f"rewrite it from the records with: dllmbench merge {path}"
        results = require_results(read_object(results_file, rewrite), results_file, rewrite)
    return run_data(path, manifest, records, results)


def run_data(
    path: Path,
    manifest: dict[str, Any],
    records: list[dict[str, Any]],
    results: dict[str, Any] | None = None,
) -> RunData:
    """A run from its manifest and records as the run directory holds them (JSON data; the
    contract kit reads a strategy's records through this)."""
    by_method: dict[str, dict[str, dict[str, Any]]] = {m["id"]: {} for m in manifest["methods"]}
    for record in records:
        if record["method"] in by_method:
            by_method[record["method"]][record["problem"]] = record
    return RunData(path, manifest, records, results, by_method)


def declared(method: dict[str, Any]) -> dict[str, Any]:
    """What a manifest method entry's strategy declared it records (`Evidence`); nothing for
    a run made before declarations were recorded."""
    return dict(method.get("evidence") or {})


def pool_key(method: dict[str, Any]) -> str:
    """A manifest method entry's strategy without its size: methods with one key share a run."""
    strategy = method["strategy"]
    size = declared(method).get("nested")
    options = [f"{k}={v}" for k, v in sorted(strategy["config"].items()) if k != size]
    return ":".join([strategy["name"], ",".join(options)]) if options else strategy["name"]


@dataclass(frozen=True)
class PoolSet:
    """One pool per problem: `problems` (ids, in run order) and `pools` (candidates in pool
    order), ready for pooled.pooled_curves, diagnostics.pool_diversity and scorer_swap."""

    problems: tuple[str, ...]
    pools: tuple[tuple[PooledCandidate, ...], ...]

    @property
    def scorers(self) -> tuple[str, ...]:
        """The scorers every candidate of every pool carries, sorted."""
        return tuple(shared_scorers(self.pools))

    def prefix(self, n: int) -> PoolSet:
        """Every pool cut to its first n candidates (shorter pools kept whole)."""
        return PoolSet(self.problems, tuple(pool[:n] for pool in self.pools))


def _pooled(candidate: dict[str, Any]) -> PooledCandidate:
    scores = {name: float(v) for name, v in candidate["scores"].items()}
    return PooledCandidate(
        candidate["key"], bool(candidate["correct"]), scores, candidate["weight"]
    )


def _merge(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pool from the records of methods sharing it: candidate i is the same in each; the
    pool is the longest, each candidate with every score some record gave it."""
    merged: list[dict[str, Any]] = []
    for record in records:
        for i, cand in enumerate(record["candidates"]):
            if i == len(merged):
                merged.append({**cand, "scores": dict(cand["scores"])})
            elif (merged[i]["lineage"], merged[i]["text"]) != (cand["lineage"], cand["text"]):
                raise UnreadableEvidence(
                    f"records of one pool differ at candidate {i} of problem {record['problem']}"
                )
            else:
                merged[i]["scores"].update(cand["scores"])
    return merged


def plain(method: dict[str, Any]) -> bool:
    """A method whose pools nest and hold plain samples (`Evidence.nested` and `plain`)."""
    found = declared(method)
    return bool(found.get("plain")) and found.get("nested") is not None


def _shared_pools(
    run: RunData, keep: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Pool key → problem → merged candidates, for every method `keep` accepts."""
    groups: dict[str, list[str]] = {}
    for mid, entry in run.methods.items():
        if keep(entry):
            groups.setdefault(pool_key(entry), []).append(mid)
    out = {}
    for key, mids in groups.items():
        out[key] = {
            pid: _merge([run.by_method[m][pid] for m in mids if pid in run.by_method[m]])
            for pid in run.problems
            if any(pid in run.by_method[m] for m in mids)
        }
    return out


def _pool_set(pools: dict[str, list[dict[str, Any]]]) -> PoolSet:
    return PoolSet(tuple(pools), tuple(tuple(_pooled(c) for c in p) for p in pools.values()))


def independent_pools(run: RunData) -> dict[str, PoolSet]:
    """Pool key → the largest pool of each problem, for every strategy declaring nested plain
    samples (`independent`; see the module docstring)."""
    return {key: _pool_set(pools) for key, pools in _shared_pools(run, plain).items()}


def nested_pools(run: RunData) -> dict[str, PoolSet]:
    """Pool key → the largest pool of each problem, for every strategy declaring nested
    pools (independent sampling, HEX, ensembles, ReMDM, ...)."""
    nested = lambda m: declared(m).get("nested") is not None  # noqa: E731
    return {key: _pool_set(pools) for key, pools in _shared_pools(run, nested).items()}


def pools_by_method(run: RunData) -> dict[str, PoolSet]:
    """Method id → its final pool on each problem it has a record for, in manifest order."""
    return {
        mid: _pool_set({pid: recs[pid]["candidates"] for pid in run.problems if pid in recs})
        for mid, recs in run.by_method.items()
    }


def final_states(run: RunData, scorer: str) -> list[ScoredState]:
    """`scorer` on every candidate of the independent pools that carries it (mask ratio 0)."""
    return [state.scored for state in candidate_states(run, scorer)]


def candidate_states(run: RunData, scorer: str) -> list[State]:
    """`final_states` with their identity, kind `final`: the problem; the pool key and
    lineage (history); the text and edits (content)."""
    out = []
    for key, pools in _shared_pools(run, plain).items():
        for pid, pool in pools.items():
            out.extend(
                State(
                    ScoredState(pid, float(c["scores"][scorer]), bool(c["correct"]), 0.0),
                    "final",
                    (pid, (key, tuple(c["lineage"])), (c["text"], _edits(c))),
                )
                for c in pool
                if scorer in c["scores"]
            )
    return out


@dataclass(frozen=True)
class GuidedRun:
    """One strategy run of a guided method on one problem: its pool key, the scorer of the
    cuts or checkpoints it declares and one record of it (methods sharing the run share its
    info and pool)."""

    key: str
    problem: str
    scorer: str
    record: dict[str, Any]


def guided_methods(run: RunData) -> list[str]:
    """Method ids whose strategy declares pruning cuts or particle checkpoints."""
    return [
        mid for mid, m in run.methods.items() if _records(m, "cuts") or _records(m, "particles")
    ]


def _records(method: dict[str, Any], what: str) -> str | None:
    """The scorer of the cuts or particles (`what`) a method's strategy declares, or None."""
    return declared(method).get(what)


def _guided_runs(run: RunData, what: str, method: str | None) -> Iterator[GuidedRun]:
    """Each (pool key, problem) of the strategies declaring `what` (cuts, particles) once,
    optionally only `method`'s pool key."""
    if method is not None and method not in run.methods:
        raise ValueError(f"no method {method!r} in this run (methods: {', '.join(run.methods)})")
    only = pool_key(run.methods[method]) if method is not None else None
    seen: set[tuple[str, str]] = set()
    for mid, entry in run.methods.items():
        key = pool_key(entry)
        scorer = _records(entry, what)
        if scorer is None or only not in (None, key):
            continue
        for pid in run.problems:
            record = run.by_method[mid].get(pid)
            if record is not None and (key, pid) not in seen:
                seen.add((key, pid))
                yield GuidedRun(key, pid, scorer, record)


@dataclass(frozen=True)
class Segment:
    """One segment of a prm_guided run: each child's lineage, parent, mask ratio and score,
    and the indices of the children kept."""

    step: int
    lineage: tuple[Lineage, ...]
    parent: tuple[int, ...]
    mask: tuple[float, ...]
    scores: tuple[float, ...]
    kept: tuple[int, ...]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _numbers(values: Any, *, ints: bool = False) -> bool:
    """A list of finite numbers (ints only with `ints`), bools excluded."""
    kinds = (int,) if ints else (int, float)
    return isinstance(values, list) and all(
        isinstance(v, kinds) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


def _layout_error(
    info: dict[str, Any], fields: Sequence[str], entries: int, each: str
) -> str | None:
    """Why `fields` of `info` are not lists of `entries` entries each (one per `each`), or None."""
    lengths = {name: len(info[name]) for name in fields if isinstance(info[name], list)}
    if len(lengths) < len(fields) or set(lengths.values()) != {entries}:
        return f"its {', '.join(fields)} are not lists of {entries} each (one per {each})"
    return None


def _segment_error(info: dict[str, Any]) -> str | None:
    """What in a record's segment layout cannot be read (docs/results-schema.md), or None."""
    count = len(info["step"]) if isinstance(info["step"], list) else 0
    if not count:
        return f"its step {_short(info['step'])} is not a list of one int per segment"
    wrong = _layout_error(info, SEGMENT_FIELDS, count, "segment")
    if wrong is not None:
        return wrong
    if not _numbers(info["step"], ints=True):
        return f"its step {_short(info['step'])} is not a list of ints"
    for s, parents in enumerate(info["parent"]):
        at = f"segment {s}"
        if not _numbers(parents, ints=True) or not parents:
            return f"{at}'s parent {_short(parents)} is not a list of ints, one per child"
        n = len(parents)
        mask, scores, kept = (info[name][s] for name in ("mask", "scores", "kept"))
        if not _numbers(mask) or len(mask) != n or not all(0 <= m <= 1 for m in mask):
            return f"{at}'s mask {_short(mask)} is not one ratio in [0, 1] per child ({n})"
        if not _numbers(scores) or len(scores) != n:
            return f"{at}'s scores {_short(scores)} are not one finite number per child ({n})"
        if not _numbers(kept, ints=True) or len(set(kept)) != len(kept):
            return f"{at}'s kept {_short(kept)} is not a list of distinct children"
        if not all(0 <= i < n for i in kept):
            return f"{at}'s kept {_short(kept)} names a child it does not have (0 to {n - 1})"
        if s == 0:
            continue
        before = info["kept"][s - 1]
        if not all(p in before for p in parents):
            return (
                f"{at}'s parent {_short(parents)} names a child the cut before did not keep "
                f"(it kept {_short(before)})"
            )
        if any(p != parents[c - 1] and p in parents[:c] for c, p in enumerate(parents)):
            return f"{at}'s children of one parent are not consecutive (parent {_short(parents)})"
    return None


def segments(guided: GuidedRun) -> list[Segment] | None:
    """The segments recorded in a prm_guided run's info (None when it holds none), with each
    child's lineage rebuilt: (i,) in the first segment, then the parent's lineage extended by
    the child's place among its siblings, checked against the final candidates' lineages.
    Segment fields not in the segment layout raise `UnreadableEvidence`."""
    info = guided.record.get("info") or {}
    if not all(name in info for name in SEGMENT_FIELDS):
        return None
    where = f"the info of {guided.record['method']!r} on problem {guided.problem}"
    wrong = _segment_error(info)
    if wrong is not None:
        raise UnreadableEvidence(f"{where} is not in the segment layout: {wrong}")
    out: list[Segment] = []
    for s, parents in enumerate(info["parent"]):
        if s == 0:
            lineage = tuple((i,) for i in range(len(parents)))
        else:
            lineage = tuple(
                out[-1].lineage[p] + (c - parents.index(p),) for c, p in enumerate(parents)
            )
        fields = (info[name][s] for name in ("mask", "scores", "kept"))
        out.append(Segment(info["step"][s], lineage, tuple(parents), *map(tuple, fields)))
    finals = [list(out[-1].lineage[i]) for i in out[-1].kept]
    candidates = [c["lineage"] for c in guided.record["candidates"]]
    if finals != candidates:
        raise UnreadableEvidence(
            f"{where} does not match its candidates' lineages: its last kept "
            f"{_short(list(out[-1].kept), 40)} gives {_short(finals, 60)}, its candidates "
            f"have {_short(candidates, 60)}"
        )
    return out


def _continuations(run: RunData) -> dict[tuple[str, Lineage], bool]:
    """(problem, lineage) → correctness of the independent candidate with that lineage."""
    return {
        (pid, tuple(c["lineage"])): bool(c["correct"])
        for pools in _shared_pools(run, _unoptioned_plain).values()
        for pid, pool in pools.items()
        for c in pool
    }


def _unoptioned_plain(method: dict[str, Any]) -> bool:
    """A plain strategy with no option but its size: rows at the run's own settings."""
    size = declared(method).get("nested")
    options = {k for k in method["strategy"]["config"] if k != size}
    return plain(method) and not options


def _final_correct(guided: GuidedRun, segs: list[Segment], child: int) -> bool:
    """Correctness of a final-segment child that is a recorded candidate."""
    return bool(guided.record["candidates"][segs[-1].kept.index(child)]["correct"])


def _continuation_label(
    guided: GuidedRun, segs: list[Segment], s: int, child: int, crn: dict
) -> bool | None:
    last = s == len(segs) - 1
    if last and len(segs[-1].kept) == len(segs[-1].lineage):  # every child is a candidate
        return _final_correct(guided, segs, child)
    if s == 0:
        return crn.get((guided.problem, segs[0].lineage[child]))
    return None


def _lineage_label(guided: GuidedRun, segs: list[Segment], s: int, child: int) -> bool | None:
    frontier = {child}
    for t in range(s + 1, len(segs)):
        kept = set(segs[t - 1].kept)
        frontier = {c for c, p in enumerate(segs[t].parent) if p in frontier and p in kept}
    if not frontier or not frontier <= set(segs[-1].kept):
        return None
    return any(_final_correct(guided, segs, f) for f in frontier)


def scored_states(
    run: RunData, scorer: str = "prm", labels: str = "continuation", method: str | None = None
) -> list[ScoredState]:
    """Every labelled state the prm_guided runs scored with `scorer`, each distinct state once
    (which states get labels, and how, and what makes two states one: see the module
    docstring)."""
    return [state.scored for state in guided_states(run, scorer, labels, method)]


def state_kind(segment: int, count: int) -> str:
    """The kind of the states of segment `segment` of `count` (`STATE_KINDS`)."""
    if segment == count - 1:
        return "final"
    return "first_segment" if segment == 0 else "later_segment"


def _identity(guided: GuidedRun, segs: list[Segment], s: int, child: int) -> tuple[Any, ...]:
    """(problem, history, content) of child `child` of segment `s` (the module docstring)."""
    seg, candidates = segs[s], guided.record["candidates"]
    before = tuple(earlier.step for earlier in segs[:s])  # the cuts that led here
    # a strategy run that had edited canvases by this step: its states are its own
    edited = any(_edits(c, seg.step) for c in candidates)
    history = (before, seg.step, seg.lineage[child], guided.key if edited else None)
    content: tuple[Any, ...] = (seg.mask[child],)  # and the score, compared within SAME_SCORE
    if s == len(segs) - 1 and child in seg.kept:  # a recorded candidate
        candidate = candidates[seg.kept.index(child)]
        content = (*content, candidate["text"], _edits(candidate))
    return (guided.problem, history, content)


def guided_states(
    run: RunData, scorer: str = "prm", labels: str = "continuation", method: str | None = None
) -> list[State]:
    """`scored_states` with each state's identity and kind (see the module docstring)."""
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}, got {labels!r}")
    crn = _continuations(run) if labels == "continuation" else {}
    out = []
    for guided in _guided_runs(run, "cuts", method):
        segs = segments(guided)
        if segs is None or guided.scorer != scorer:
            continue
        for s, seg in enumerate(segs):
            for child in range(len(seg.lineage)):
                if labels == "continuation":
                    label = _continuation_label(guided, segs, s, child, crn)
                else:
                    label = _lineage_label(guided, segs, s, child)
                if label is None:
                    continue
                scored = ScoredState(guided.problem, seg.scores[child], label, seg.mask[child])
                kind = state_kind(s, len(segs))
                out.append(State(scored, kind, _identity(guided, segs, s, child)))
    return merge_states([out])


def pruning_events(run: RunData, method: str | None = None) -> list[PruningEvent]:
    """The first cut of every prm_guided run with more than one segment, each lineage's
    reaches_correct from its independent continuation (see the module docstring)."""
    crn = _continuations(run)
    out = []
    for guided in _guided_runs(run, "cuts", method):
        segs = segments(guided)
        if segs is None or len(segs) < 2:
            continue
        first = segs[0]
        reaches = {lin: crn.get((guided.problem, lin)) for lin in first.lineage}
        if None in reaches.values():
            continue
        kept = frozenset(first.lineage[i] for i in first.kept)
        out.append(PruningEvent(kept, frozenset(first.lineage) - kept, reaches))
    return out


def _checkpoint_error(info: dict[str, Any]) -> str | None:
    """What in a record's checkpoint layout cannot be read (docs/results-schema.md), or None."""
    count = len(info["weights"]) if isinstance(info["weights"], list) else 0
    if not count:
        return f"its weights {_short(info['weights'])} are not one list per checkpoint"
    wrong = _layout_error(info, ("beta", "weights"), count, "checkpoint")
    wrong = wrong or _layout_error(
        info, ("resampled", "ancestors"), count - 1, "checkpoint but the last"
    )
    if wrong is not None:
        return wrong
    if not _numbers(info["beta"]):
        return f"its beta {_short(info['beta'])} is not a list of finite numbers"
    if not all(isinstance(r, bool) for r in info["resampled"]):
        return f"its resampled {_short(info['resampled'])} is not a list of bools"
    ess = info.get("ess")
    if ess is not None and not _numbers(ess):
        return f"its ess {_short(ess)} is not a list of finite numbers"
    for j, weights in enumerate(info["weights"]):
        if not _numbers(weights) or any(w < 0 for w in weights) or not sum(weights) > 0:
            return (
                f"checkpoint {j}'s weights {_short(weights)} are not non-negative with a "
                "positive sum"
            )
        if j < count - 1 and info["resampled"][j]:
            ancestors = info["ancestors"][j]
            if not _numbers(ancestors, ints=True) or not ancestors:
                return f"checkpoint {j}'s ancestors {_short(ancestors)} are not a list of ints"
            if not all(0 <= a < len(weights) for a in ancestors):
                return (
                    f"checkpoint {j}'s ancestors {_short(ancestors)} name a particle it does "
                    "not have"
                )
    return None


def _checkpoints(guided: GuidedRun) -> dict[str, Any] | None:
    """The checkpoint fields of an smc run's info (None when it holds none); fields not in the
    checkpoint layout raise `UnreadableEvidence`."""
    info = guided.record.get("info") or {}
    if not all(name in info for name in CHECKPOINT_FIELDS):
        return None
    wrong = _checkpoint_error(info)
    if wrong is not None:
        raise UnreadableEvidence(
            f"the info of {guided.record['method']!r} on problem {guided.problem} is not in "
            f"the checkpoint layout: {wrong}"
        )
    return info


def checkpoints_per_run(run: RunData, method: str) -> int:
    """Intermediate checkpoints of one strategy run of `method` (its first record's info)."""
    for guided in _guided_runs(run, "particles", method):
        info = _checkpoints(guided) or {}
        return len(info.get("resampled", []))
    return 0


def recorded_ess(run: RunData, method: str | None = None) -> list[float | None]:
    """The ESS each intermediate checkpoint of `smc_checkpoints` recorded (from the
    strategy's unrounded weights), in the same order; None where a record lacks it."""
    out: list[float | None] = []
    for guided in _guided_runs(run, "particles", method):
        info = _checkpoints(guided)
        if info is None:
            continue
        ess = info.get("ess") or []
        out.extend(float(ess[j]) if j < len(ess) else None for j in range(len(info["resampled"])))
    return out


def smc_checkpoints(
    run: RunData, method: str | None = None, final: bool = False
) -> list[SMCCheckpoint]:
    """Every intermediate checkpoint of every smc run (and the final one with `final`)."""
    out = []
    for guided in _guided_runs(run, "particles", method):
        info = _checkpoints(guided)
        if info is None:
            continue
        for j, resampled in enumerate(info["resampled"]):
            ancestors = info["ancestors"][j] if resampled else None
            out.append(SMCCheckpoint(info["weights"][j], resampled, info["beta"][j], ancestors))
        if final:
            out.append(SMCCheckpoint(info["weights"][-1], False, info["beta"][-1]))
    return out


# -- evidence that cannot be read -----------------------------------------------------------


def leave_out(run: RunData, methods: Collection[str]) -> RunData:
    """`run` without `methods`: their manifest entries and records left out."""
    if not methods:
        return run
    manifest = {
        **run.manifest,
        "methods": [m for m in run.manifest["methods"] if m["id"] not in methods],
    }
    records = [r for r in run.records if r["method"] not in methods]
    by_method = {mid: recs for mid, recs in run.by_method.items() if mid not in methods}
    return RunData(run.path, manifest, records, run.results, by_method)


def read_method(run: RunData, method: str) -> None:
    """Read what `method`'s strategy declared as the report reads it: its candidates, its
    shared pool (`nested`), its states and first cuts (`cuts`), its checkpoints
    (`particles`); `UnreadableEvidence` in one line says what cannot be read."""
    entry = run.methods[method]
    found = declared(entry)
    try:
        for record in run.by_method[method].values():
            for candidate in record["candidates"]:
                _pooled(candidate)
        if found.get("nested") is not None:  # merged with the methods sharing its pool
            key = pool_key(entry)
            _shared_pools(
                run, lambda m: declared(m).get("nested") is not None and pool_key(m) == key
            )
        if found.get("cuts"):
            for labels in LABELS:
                guided_states(run, found["cuts"], labels, method)
            pruning_events(run, method)
        if found.get("particles"):
            checkpoints = smc_checkpoints(run, method)
            for checkpoint in checkpoints:
                checkpoint_stats(checkpoint)
            if len(recorded_ess(run, method)) != len(checkpoints):
                raise UnreadableEvidence("its checkpoints and their recorded ESS differ in number")
    except UnreadableEvidence:
        raise
    except (LookupError, TypeError, ValueError, ArithmeticError) as exc:
        text = " ".join(str(exc).split())
        text = text if len(text) <= 160 else text[:159] + "…"
        raise UnreadableEvidence(
            f"its records cannot be read as its strategy declares ({type(exc).__name__}: {text})"
        ) from exc


def unreadable(run: RunData) -> dict[str, str]:
    """Method id → why (one line) for each method of `run` whose declared evidence
    `read_method` refuses, in manifest order. The methods with nested pools are read first,
    and a guided method beside the rest, since guided runs' labels read the plain pools."""
    bad: dict[str, str] = {}
    pools_first = sorted(
        run.methods, key=lambda mid: declared(run.methods[mid]).get("nested") is None
    )
    for mid in pools_first:
        try:
            read_method(leave_out(run, bad), mid)
        except UnreadableEvidence as exc:
            bad[mid] = str(exc)
    return {mid: bad[mid] for mid in run.methods if mid in bad}
