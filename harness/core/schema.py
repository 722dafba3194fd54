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
    grade_note: NotRequired[str]  # what the task said of this grade (`NotesGrades`), if anything
    settings: NotRequired[dict[str, Any]]  # its own sampler settings and T, when it had any
    edits: NotRequired[list[list[Any]]]  # its canvas edits, [step, [positions]], when any


class LedgerEntry(TypedDict):
    """What one method spent on one problem (`Ledger.entry`)."""

    passes: dict[str, int]  # kind → passes charged
    total_passes: int
    flops: NotRequired[dict[str, int]]  # kind → FLOPs charged (kinds of known shape)
    total_flops: NotRequired[int | None]  # None when a kind's model shape is unknown
    forwards: dict[str, int]  # kind → physical calls holding a row of the method
    seconds: dict[str, float]  # kind → seconds attributed to the method


class Record(TypedDict):
    """One line of `samples.jsonl`: one method on one problem."""

    problem: str
    method: str
    budgets: list[int]  # the budgets the method is planned at (its manifest entry's)
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


class EvidenceEntry(TypedDict):
    """A strategy's declared evidence (`dllmbench.interfaces.Evidence`)."""

    nested: str | None
    plain: bool
    cuts: str | None
    particles: str | None


class MethodEntry(TypedDict):
    """One entry of the manifest's `methods` (the summary reads `id`, `family`, `spec`,
    `ceiling`, `cost` and `budgets`)."""

    id: str
    family: str | None
    spec: str
    strategy: PluginEntry
    selector: PluginEntry
    ceiling: bool
    evidence: NotRequired[EvidenceEntry]  # what its records hold for the analysis
    cost: dict[str, int]  # declared passes per problem by kind
    capped: NotRequired[bool]  # the cost is a cap: the method may spend less
    approximate: NotRequired[bool]  # decoded with an approximate cache (Fast-dLLM's)
    flops: NotRequired[int]  # planned FLOPs per problem, priced at the reference row
    budgets: NotRequired[list[int]]  # the budgets it is planned at, ascending


class SamplingEntry(TypedDict):
    """The manifest's `sampling`: the protocol every method of a run shares."""

    total_steps: int
    gen_length: int
    prompt_style: str
    seed: int


class ManifestTask(TypedDict):
    """The manifest's `task` (what resume, merge and the report read of it)."""

    name: str
    config: dict[str, Any]
    split: str
    problems: int
    problem_ids: NotRequired[list[str]]


class ManifestPlugin(TypedDict):
    """The manifest's `backbone` and each of its `scorers`."""

    name: str
    config: dict[str, Any]


# the most bootstrap resamples a run takes: their counts are a resamples × problems array
# (100,000 × 1,319 GSM8K problems: 1 GB), made again for every method
MOST_RESAMPLES = 100_000


class StatisticsEntry(TypedDict):
    resamples: int  # 1 to MOST_RESAMPLES
    level: float  # between 0 and 1


class MethodsManifest(TypedDict):
    """What the evidence of a run reads of its manifest: the methods."""

    methods: list[MethodEntry]


class Manifest(TypedDict):
    """`manifest.json`: the keys the summary, `merge` and `report` read (a damaged manifest
    lacking one is one line, `dllmbench.core.shape`); the runner writes more (provenance)."""

    created: str
    sampling: SamplingEntry
    task: ManifestTask
    backbone: ManifestPlugin
    scorers: NotRequired[dict[str, ManifestPlugin]]
    budget: int
    budgets: list[int]
    budget_unit: NotRequired[str]  # "passes" or "flops"; absent in older runs: passes
    reference_row: NotRequired[dict[str, Any] | None]  # what a pass is priced at in FLOPs
    methods: list[MethodEntry]
    reference: NotRequired[str | None]
    statistics: StatisticsEntry


class IntervalEntry(TypedDict):
    value: float
    low: float
    high: float
    # true: the ends are quantiles of the exact bootstrap law (0/1 outcomes); false: resampled
    exact: NotRequired[bool]
    mc_error: NotRequired[float]  # Monte-Carlo error of a resampled interval's ends
    # a paired difference of 0/1 outcomes: problems a solved and b did not, the reverse, and
    # the exact McNemar p-value
    better: NotRequired[int]
    worse: NotRequired[int]
    mcnemar_p: NotRequired[float]
    # whether the interval and McNemar's test say the same at `level`: the interval excludes
    # 0 exactly when mcnemar_p < 1 − level (they can disagree: docs/results-schema.md)
    mcnemar_agrees: NotRequired[bool]


class DeltaEntry(IntervalEntry):
    problems: int  # problems both methods have


class PoolEntry(TypedDict):
    size: float
    oracle: IntervalEntry
    unique_answers: float
    entropy_bits: float


class SpendEntry(TypedDict):
    """What a method spent per problem, measured: the mean over problems of its records'
    ledgers with a bootstrap interval, in passes and in FLOPs (None when a record's FLOPs are
    unknown)."""

    passes: IntervalEntry
    flops: IntervalEntry | None


class MethodResult(TypedDict):
    """One entry of `results.json`'s `methods`. The spend keys (`flops_per_problem`, `spend`,
    `planned_flops`, `capped`) are absent from a results.json written before they were
    measured; the summary always writes them."""

    id: str
    family: str | None
    spec: str
    ceiling: bool
    budget: int  # the budget this entry ranks the method at (one entry per budget)
    problems: int
    accuracy: IntervalEntry | None
    passes_per_problem: float | None  # measured: the mean of the records' total_passes
    flops_per_problem: NotRequired[float | None]  # of their total_flops; None: one unknown
    spend: NotRequired[SpendEntry | None]  # both means with their intervals; None: no records
    planned_passes: int
    planned_flops: NotRequired[int | None]  # the manifest's `flops`; None when it has none
    share_of_budget: float
    capped: NotRequired[bool]  # its declared cost is a cap: it may spend less
    approximate: NotRequired[bool]  # the manifest's `approximate`: decoding is approximate
    pool: NotRequired[PoolEntry]
    delta_vs_reference: NotRequired[DeltaEntry]


class TaskEntry(TypedDict):
    name: str
    split: str
    problems: int


class Results(TypedDict):
    """`results.json`; the runner adds `task` and `steps` to what the summary returns."""

    schema_version: int
    budget: int  # the largest budget
    budgets: list[int]  # every budget of the run, ascending
    budget_unit: NotRequired[str]  # of the budgets: "passes" or "flops" (absent: passes)
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


REPORT_SCHEMA_VERSION = 1  # `schema_version` of report.json


class ReportMethod(MethodResult):
    """One entry of report.json's `methods`: a results.json method entry and the index of its
    run in `runs`."""

    run: int


class PooledPointEntry(TypedDict):
    k: int
    passes: int  # passes per problem of the same selector run on k independent candidates
    accuracy: IntervalEntry  # the pooled estimate with its bootstrap interval over problems
    exact: bool  # false when some problem's estimate is a Monte-Carlo mean
    stderr: float  # Monte-Carlo standard error of the mean (0 when exact)


class PooledCurve(TypedDict):
    # oracle, random, majority, majority:invalid=vote, argmax:<scorer>,
    # weighted_majority:<scorer>
    selector: str
    pool_size: int  # n: the candidates per problem the curve is estimated from
    points: list[PooledPointEntry]  # k = 1..pool_size


class PooledAgreement(TypedDict):
    """A planned method of the pool at k = n against its pooled estimate."""

    method: str
    selector: str
    k: int
    pooled: float
    run: float
    equal: bool  # equal problem by problem


class PooledSection(TypedDict):
    pool: str  # pool key of the independent pool (evidence.pool_key)
    run: int
    size: int
    problems: int
    samples: int
    exact_limit: int
    count_limit: int
    curves: list[PooledCurve]
    agreement: list[PooledAgreement]


class BucketEntry(TypedDict):
    low: float
    high: float
    n: int
    positives: int
    auc: float | None
    interval: IntervalEntry | None


class KendallEntry(TypedDict):
    """Within-problem Kendall τ-b over the states of one kind."""

    # "first_segment", "later_segment" or "final" (fully decoded); on the final candidates
    # of independent pools ("final" entries) the paper's statistic
    states: str
    count: int  # states of this kind
    median: float | None
    interval: IntervalEntry | None  # the median's bootstrap interval over problems
    mean: float | None
    problems: int
    undefined: int


class DiscriminationEntry(TypedDict):
    scorer: str
    states: str  # "guided" (partial states of guided runs) or "final" (final candidates)
    count: int
    positives: int
    roc_auc_by_mask: list[BucketEntry]
    kendall_tau: list[KendallEntry]  # one per kind of state, never mixed


class PoolDiversityEntry(TypedDict):
    pool: str  # the strategy spec
    kind: str  # "plain", "guided" or "other"
    methods: list[str]
    size: int
    problems: int
    oracle: IntervalEntry
    unique_answers: IntervalEntry
    entropy_bits: IntervalEntry


class RemovalRiskEntry(TypedDict):
    pool: str
    methods: list[str]
    events: int
    at_risk: int
    lost: int
    rate: float | None
    interval: IntervalEntry | None  # the rate's bootstrap interval over the cuts' problems


class SMCEntry(TypedDict):
    pool: str
    methods: list[str]
    checkpoints: int
    ess_before: float
    ess_after: float
    resample_rate: float
    beta: dict[str, float]  # mean, min, max
    distinct_ancestors: float | None
    ancestor_perplexity: float | None
    by_checkpoint: list[dict[str, float]]  # index, ess_before, ess_after (means over problems)


class ScorerSwapEntry(TypedDict):
    pool: str
    size: int
    accuracy: dict[str, IntervalEntry]
    differences: list[dict[str, Any]]  # a, b, value, low, high


class DiagnosticsSection(TypedDict):
    discrimination: list[DiscriminationEntry]
    pools: list[PoolDiversityEntry]
    removal_risk: list[RemovalRiskEntry]
    particles: list[SMCEntry]  # strategy runs declaring particle checkpoints (SMC)
    scorer_swap: ScorerSwapEntry | None


class RunEntry(TypedDict):
    path: str
    budgets: list[int]


CONTROLS_SCHEMA_VERSION = 2  # `schema_version` of controls.json


class Controls(TypedDict):
    """controls.json, written by `dllmbench diagnose` (docs/results-schema.md, "Scorer
    controls"): the paper's scorer controls over a collection's stored states."""

    schema_version: int
    collection: dict[str, Any]  # path, task, backbone, sampling, n, snapshot_steps, problems…
    backbone_weights: dict[str, Any] | None  # as a run's manifest records them
    scorers: dict[str, dict[str, Any]]  # name → plugin entry (name, config, weights)
    seed: int
    resamples: int
    level: float
    width: int  # K: trajectories per group of the removal-risk counterfactual
    slicing: str  # the snapshot slicing of auc_by_mask and removal_risk: paper or split
    auc_by_mask: list[dict[str, Any]]  # scorer, buckets (by `slicing`), final (decoded)
    kendall_tau: list[dict[str, Any]]  # scorer, median, interval, mean, problems, undefined
    removal_risk: list[dict[str, Any]]  # scorer, state, step, keep (M), width, rate, …
    alternative: dict[str, Any]  # the other slicing: slicing, auc_by_mask, removal_risk
    readout: list[dict[str, Any]]  # mean, last, mean_auc, last_auc, change
    suffix_ablation: list[dict[str, Any]]  # scorer, original, ablated, change
    reversed_input: list[dict[str, Any]]  # scorer, forward, reversed, averaged, reference
    reranker: list[dict[str, Any]]  # scorer, sign check, points (n, scorer, random, …)
    scorer_swap: dict[str, Any]  # size, accuracy, differences


class AgreementMethod(TypedDict):
    """One method of an approximately decoded run beside the same method decoded exactly."""

    id: str
    problems: int  # held by both runs
    same_answer: float  # share whose selected answer (its key) is the exact run's
    candidates: int  # candidates matched by lineage
    same_candidate: float | None  # share of them whose answer is the exact run's
    accuracy: float  # of this run, on those problems
    exact_accuracy: float  # of the exact run, on those problems


class AgreementEntry(TypedDict):
    """`report --exact EXACT_RUN`: how often the run's answers are exact decoding's."""

    exact_run: str
    methods: list[AgreementMethod]


class SkippedMethod(TypedDict):
    """A method the report's pooled curves and diagnostics leave out: its records do not hold
    what its strategy declared (`evidence.unreadable`)."""

    run: int  # the index of its run in `runs`
    method: str  # its id
    strategy: str  # its strategy spec
    reason: str  # one line: what could not be read


class Report(TypedDict):
    """report.json, written by `dllmbench report` (`report.build_report`)."""

    schema_version: int
    task: TaskEntry
    backbone: str
    steps: int
    seed: int
    level: float
    resamples: int
    reference: str | None
    runs: list[RunEntry]
    budgets: list[int]
    budget_unit: str  # of the budgets: "passes" or "flops"
    methods: list[ReportMethod]
    pooled: PooledSection | None
    diagnostics: DiagnosticsSection
    # methods left out of `pooled` and `diagnostics`: evidence that cannot be read
    skipped: NotRequired[list[SkippedMethod]]
    # the scorer controls of `dllmbench report --controls DIR` (controls.json), or None
    controls: Controls | None
    # with `report --exact EXACT_RUN`: the first run's answers beside exact decoding's
    agreement: NotRequired[AgreementEntry | None]
    figures: dict[str, str]
