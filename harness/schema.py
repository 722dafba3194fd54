"""The run directory's records, typed once: what docs/results-schema.md describes field by field.

Records and results are plain JSON objects on disk; these TypedDicts name their keys and types
so that the engine that writes a record, the summary that reads it, the leaderboard and the
collector agree on one definition. Key order here is the order the files are written in.
"""

# no `from __future__ import annotations`: `NotRequired` must be seen when the classes are made,
# so that `__required_keys__` and `__optional_keys__` are right at run time
from typing import Any, NotRequired, TypedDict

SCHEMA_VERSION = 1  # `schema_version` of results.json


class CandidateRecord(TypedDict):
    """One candidate of a record's pool (`samples.jsonl`, `candidates[i]`)."""

    text: str
    answer: str | None
    valid: bool  # an answer was extracted
    key: str | None  # str(task.answer_key(answer)); None when invalid
    correct: bool
    scores: dict[str, float]  # scorer run name → logit; only the scorers the method paid for
    weight: float | None
    lineage: list[int]


class LedgerEntry(TypedDict):
    """What one method spent on one problem (`Ledger.entry`)."""

    passes: dict[str, int]  # kind → passes charged
    total_passes: int
    forwards: dict[str, int]  # kind → physical calls holding a row of the method
    seconds: dict[str, float]  # kind → seconds attributed to the method


class Record(TypedDict):
    """One line of `samples.jsonl`: one method on one problem."""

    problem: str
    method: str
    selected: int | None
    answer: str | None
    correct: bool
    ceiling: bool
    candidates: list[CandidateRecord]
    ledger: LedgerEntry
    info: dict[str, Any]  # what the strategy put in its pool's `info`


class PluginEntry(TypedDict):
    """A plugin of a manifest method (`strategy`, `selector`)."""

    name: str
    config: dict[str, Any]
    distribution: NotRequired[str | None]
    version: NotRequired[str | None]


class MethodEntry(TypedDict):
    """One entry of the manifest's `methods` (the summary reads `id`, `family`, `spec`,
    `ceiling` and `cost`)."""

    id: str
    family: str | None
    spec: str
    strategy: PluginEntry
    selector: PluginEntry
    ceiling: bool
    cost: NotRequired[dict[str, int]]


class IntervalEntry(TypedDict):
    value: float
    low: float
    high: float


class DeltaEntry(IntervalEntry):
    problems: int  # problems both methods have


class PoolEntry(TypedDict):
    size: float
    oracle: IntervalEntry
    unique_answers: float
    entropy_bits: float


class MethodResult(TypedDict):
    """One entry of `results.json`'s `methods`."""

    id: str
    family: str | None
    spec: str
    ceiling: bool
    problems: int
    accuracy: IntervalEntry | None
    passes_per_problem: float | None
    planned_passes: int
    share_of_budget: float
    pool: NotRequired[PoolEntry]
    delta_vs_reference: NotRequired[DeltaEntry]


class TaskEntry(TypedDict):
    name: str
    split: str
    problems: int


class Results(TypedDict):
    """`results.json`; the runner adds `task` and `steps` to what the summary returns."""

    schema_version: int
    budget: int
    reference: str | None
    resamples: int
    level: float
    methods: list[MethodResult]
    task: NotRequired[TaskEntry]
    steps: NotRequired[int]


class TrajectoryLine(TypedDict):
    """One line of a collection's `trajectories.jsonl`."""

    problem: str
    index: int
    text: str
    answer: str | None
    correct: bool
    prompt_len: int
    shard: int
    row: int  # the trajectory's first snapshot row in its shard
    snapshots: int  # consecutive rows, in step order
