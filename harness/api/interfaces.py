"""Typed interfaces of the five plugin kinds, and the optional capabilities the core reads.

A plugin implements one of the five kind Protocols (`Backbone`, `Scorer`, `SearchStrategy`,
`Selector`, `Task`); its factory takes keyword configuration (a dataclass per plugin) and
returns the object. The registry checks every built object against its kind's Protocol.

Beyond the five, a plugin may offer optional capabilities, each a Protocol of its own: a
backbone built on a transformers model (`TransformerBackbone`, which the reward scorers share),
a scorer that can be trained (`TrainableScorer`), a backbone or Config that costs more than one
forward per step (`MultiPass`), and so on. The core never probes a plugin with getattr/hasattr:
it asks `isinstance(obj, Capability)` or calls one of the small readers at the bottom
(`passes_per_step`, `shipped_scorers`, ...), which do so. The core only talks to these interfaces.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from dllmbench.core.flops import ModelShape, Work, shape_of
from dllmbench.core.types import Candidate, Pool, Problem, Prompt

if TYPE_CHECKING:  # in annotations only: the command line reads these without loading torch
    import numpy as np
    import torch

    from dllmbench.api.ops import Ops


@dataclass(frozen=True)
class StepBatch:
    """Rows to advance by one denoising step. Canvases may differ in length.

    Rows may differ in their sampler settings and their T: `settings[i]` holds the settings
    row i overrides (only names its backbone lists in `row_settings`; empty: the backbone's
    own), `totals[i]` its T. `edited[i]` says row i carries canvas edits: re-masked
    positions a quota computed for an unedited canvas would not fill. `predict[i]` says row i
    asks for its prediction (`ReportsPredictions`): the step computes the head at every masked
    position its forward covers, and `step_work` charges it. Empty sequences mean every row
    at the backbone's settings, at `total_steps`, unedited, asking for no prediction.
    """

    tokens: Sequence[torch.Tensor]  # one 1-D long tensor per row
    prompt_lens: Sequence[int]
    steps: Sequence[int]  # each row's current step t (0-based) of its T
    keys: Sequence[int]
    total_steps: int  # the run's T
    totals: Sequence[int] = ()
    settings: Sequence[Mapping[str, Any]] = ()
    edited: Sequence[bool] = ()
    predict: Sequence[bool] = ()

    def total(self, i: int) -> int:
        """Row i's T."""
        return int(self.totals[i]) if self.totals else self.total_steps

    def setting(self, i: int) -> Mapping[str, Any]:
        """The sampler settings row i overrides (empty: none)."""
        return self.settings[i] if self.settings else {}

    def was_edited(self, i: int) -> bool:
        return bool(self.edited[i]) if self.edited else False

    def predicts(self, i: int) -> bool:
        """Whether row i asks for its prediction (`ReportsPredictions`)."""
        return bool(self.predict[i]) if self.predict else False


@dataclass(frozen=True)
class ScoreBatch:
    """Rows to score: partial or final canvases. `totals[i]` is row i's T (empty: every row
    at `total_steps`)."""

    tokens: Sequence[torch.Tensor]
    prompt_lens: Sequence[int]
    steps: Sequence[int]
    total_steps: int
    totals: Sequence[int] = ()

    def total(self, i: int) -> int:
        return int(self.totals[i]) if self.totals else self.total_steps


@dataclass(frozen=True)
class Evidence:
    """What a strategy's records hold for the report and the diagnostics, declared in typed
    form (docs/results-schema.md, "Evidence"). The analysis reads these declarations, which
    the manifest keeps per method, and never a strategy's name.

    - `nested`: the size field whose pool of n is the first n candidates of any larger pool
      (pooled @k curves, shared runs); None when pools do not nest.
    - `plain`: candidate i (lineage (i,)) is row i sampled from the fully masked canvas at the
      run's sampler settings with no guidance, so it continues a guided run's first-segment
      child i under common random numbers (continuation labels, removal risk).
    - `cuts`: the scorer whose pruning cuts the record's `info` holds in the segment layout
      (`step`, `mask`, `scores`, `parent`, `kept` per segment; first-segment children are
      rows (i,) of the plain stream): scored states, AUC, Kendall τ, removal risk.
    - `particles`: the scorer whose particle checkpoints `info` holds in the checkpoint layout
      (`beta`, `resampled`, `weights`, `ancestors`): ESS and resampling diagnostics.
    """

    nested: str | None = None
    plain: bool = False
    cuts: str | None = None
    particles: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class Backbone(Protocol):
    """A diffusion LM and its sampler."""

    mask_id: int

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt token ids, formatted the model's way (chat template or raw)."""

    def canvas(self, prompt_ids: Sequence[int], gen_length: int) -> torch.Tensor:
        """The prompt followed by gen_length masks, as a 1-D long tensor."""

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        """One forward over the batch; each row commits tokens by the backbone's rule.

        The noise of a row comes from its key and step only.
        """

    def decode(self, tokens: torch.Tensor, prompt_len: int) -> str:
        """Generated text: up to the first end-of-sequence token, masks removed."""


@runtime_checkable
class Scorer(Protocol):
    """Maps rows to one float each (a logit), higher meaning more likely correct."""

    reads_partial: bool  # True for a process scorer (PRM), False for an outcome scorer (ORM)

    def score(self, batch: ScoreBatch) -> np.ndarray: ...


@runtime_checkable
class SearchStrategy(Protocol):
    """Per-problem search written as a coroutine over `ops`."""

    scorers: tuple[str, ...]  # scorer names it calls
    prefix_field: ClassVar[str | None]  # a size field whose smaller pools are prefixes

    def cost(self, total_steps: int) -> dict[str, int]:
        """Passes per problem by kind (`denoise`, `score:<name>`), declared before running."""

    def pool_size(self) -> int: ...

    def pool_scores(self) -> frozenset[str]:
        """Scorers whose values on the final candidates the returned pool carries."""

    async def search(self, problem: Problem, ops: Ops) -> Pool: ...


@runtime_checkable
class Selector(Protocol):
    """Picks one candidate of a pool; a ceiling reads labels and is never a contender."""

    needs: tuple[str, ...]  # scorers it reads on every candidate
    ceiling: bool

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        rng: np.random.Generator,
        labels: Sequence[bool] | None = None,
    ) -> int | None:
        """Index of the chosen candidate, or None when there is nothing valid to choose."""


@runtime_checkable
class Task(Protocol):
    """Loads problems, formats questions, extracts and grades answers."""

    def splits(self) -> dict[str, int]:
        """Split name → number of problems."""

    def problems(self, split: str) -> list[Problem]: ...

    def prompt(self, problem: Problem, style: str) -> Prompt: ...

    def extract(self, text: str) -> str | None: ...

    def answer_key(self, answer: str) -> Any:
        """A hashable normal form: two answers vote together when their keys are equal."""

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool: ...

    def data_files(self) -> dict[str, str]:
        """Data files read, path → sha256, for the manifest."""


# -- optional capabilities ----------------------------------------------------------------------


@runtime_checkable
class TransformerBackbone(Backbone, Protocol):
    """A backbone on a transformers model whose weights a scorer may share (dream, llada)."""

    # a transformers model: its body, `base_model(...)`, gives the hidden states (`.model` of
    # Qwen2 or Llama, `.bert` of a BertForMaskedLM); `.config.hidden_size`
    transformer: torch.nn.Module
    device: torch.device | str
    stop_ids: set[int]  # tokens that end an answer: EOS and chat turn ends
    eos_id: int | None  # the tokenizer's end-of-sequence token

    def pad(self, rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Left-padded ids [B, L], attention mask [B, L] and each row's left offset."""

    def logits(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, V] of a padded batch, as the sampler reads them."""


@runtime_checkable
class TrainableScorer(Scorer, Protocol):
    """A scorer `dllmbench train-scorer` can train: differentiable logits and checkpoints."""

    trained: bool  # False for fresh weights, which a run refuses

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters training updates."""

    def logits(self, tokens: list[torch.Tensor], prompt_lens: list[int]) -> torch.Tensor:
        """One logit per row, differentiable in `trainable()`."""

    def train_mode(self, flag: bool) -> None: ...

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None: ...

    def load_weights(self, path: str | Path) -> None: ...


@runtime_checkable
class SetsPerRow(Protocol):
    """A strategy whose rows set sampler settings of their own (`ops.start(settings=...)`)
    says which, by its config: the planner leaves it out of a run whose backbone cannot vary
    them (`VariesPerRow`), with the reason, instead of the run stopping when it starts."""

    def sets_per_row(self) -> frozenset[str]: ...


@runtime_checkable
class SettingsByConfig(Protocol):
    """A strategy whose rows' sampler settings its config alone fixes (not what it reads
    from `ops` as it runs) lists them, each distinct one once: a run checks them against the
    backbone's Config (`RefusesRowSettings`) before any model loads, instead of the first
    problem refusing them."""

    def settings_by_config(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class RefusesRowSettings(Protocol):
    """A backbone Config that can say, before the model loads, why rows with these sampler
    settings could not sample under it (None: they can): the reason the built backbone's
    `check_row_settings` gives, for values the Config itself refuses (a threshold under a
    commit order that ranks no drawn token's probability)."""

    def row_refusal(self, settings: Mapping[str, Any]) -> str | None: ...


def row_settings_line(backbone: str, settings: Mapping[str, Any], reason: str) -> str:
    """The one line refusing a row's sampler `settings` on `backbone`, whether the Config
    refuses them before the model loads or the built backbone when a row starts."""
    return f"{backbone}: a row's sampler settings {dict(settings)}: {reason}"


def settings_by_config(strategy: object) -> list[dict[str, Any]]:
    """The sampler settings a strategy's config fixes for its rows (`SettingsByConfig`; else
    none said)."""
    if not isinstance(strategy, SettingsByConfig):
        return []
    return [dict(s) for s in strategy.settings_by_config()]


def row_refusal(config: object, settings: Mapping[str, Any]) -> str | None:
    """Why a backbone Config refuses rows with `settings` (`RefusesRowSettings`); None when it
    does not, or cannot say before the model loads."""
    return config.row_refusal(settings) if isinstance(config, RefusesRowSettings) else None


@runtime_checkable
class VariesPerRow(Protocol):
    """A backbone whose rows may carry their own sampler settings (`StepBatch.settings`).

    `row_settings` names what a strategy may set per row (`ops.start(settings=...)`); the
    name `steps` (a row's own T) is honoured through `StepBatch.totals`. Rows whose settings
    differ share one forward. `check_row_settings` refuses a setting it cannot vary, or a
    value its sampler cannot take, with a `UserError` naming what would work."""

    row_settings: frozenset[str]

    def check_row_settings(
        self, settings: Mapping[str, Any], gen_length: int, total_steps: int
    ) -> None: ...


@runtime_checkable
class ReopensPositions(Protocol):
    """A backbone whose sampler decodes again only some committed positions of a row: a block
    model re-opens its current block, never the committed blocks its cache holds.
    `reopenable(tokens, prompt_len, settings)` is a bool tensor over the row's generated
    positions; `ops.remask` picks among those (a backbone without it: every committed one)."""

    def reopenable(
        self, tokens: torch.Tensor, prompt_len: int, settings: Mapping[str, Any]
    ) -> torch.Tensor: ...


@runtime_checkable
class MixesOrders(Protocol):
    """A `VariesPerRow` backbone with more than one commit order (the rule that picks which
    masked positions a step fills): `commit_orders` maps the per-row setting that chooses it
    to the orders worth mixing (sampler ensembles' `orders=auto`), each a value that setting
    takes. Dream: `alg`; LLaDA and block diffusion: `remasking`."""

    commit_orders: Mapping[str, tuple[str, ...]]


@runtime_checkable
class ReportsConfidence(Protocol):
    """A backbone that says, with each denoising step, the confidence of every token it
    committed (NaN elsewhere): `ops.remask(rows, least_confident=k)` reads it."""

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]: ...


@runtime_checkable
class ReportsPredictions(Protocol):
    """A backbone that says, with each denoising step, each asking row's prediction of the
    whole canvas (Temporal Self-Consistency Voting reads them; `ops.predictions`): the row's
    committed and prompt tokens, and the token the step drew (x0, before it chose which to
    commit) at every masked position whose logits its forward computed; the mask elsewhere.
    A row asks through `StepBatch.predict`; the head it computes beyond the positions the step
    may commit is charged in `step_work`, and a row that does not ask steps, and is charged,
    exactly as through `denoise_step`. `predicts` says whether this backbone, as configured,
    reports them (a class says so before it loads: the planner reads it)."""

    predicts: bool

    def denoise_step_with_predictions(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """Each row after one step, the confidence of every token it committed (as
        `ReportsConfidence`; None from a backbone that does not report them) and, for a row
        that asks, its prediction (None for a row that does not)."""


@runtime_checkable
class ReadsPredictions(Protocol):
    """A strategy that starts rows with `ops.start(..., predictions=True)`: the planner leaves
    it out of a run whose backbone does not report them (`ReportsPredictions`), with the
    reason, instead of the run stopping when it starts."""

    reads_predictions: bool


@runtime_checkable
class SizedBySteps(Protocol):
    """A strategy whose pool size depends on T (a candidate per step: Temporal Self-Consistency
    Voting's predictions): `pool_size_at(T)` is its size at the run's T, which the engine, the
    ledger's declared costs and the contract kit read (`pool_size_of`); `pool_size()` is then
    the rows it denoises at once."""

    def pool_size_at(self, total_steps: int) -> int: ...


@runtime_checkable
class DeclaresEvidence(Protocol):
    """A strategy that declares what its records hold (`Evidence`); one that does not
    declares only its `prefix_field` as `Evidence.nested`."""

    def evidence(self) -> Evidence: ...


@runtime_checkable
class MultiPass(Protocol):
    """A backbone, or its Config, spending more than one forward per row-step (guidance)."""

    passes_per_step: int


@runtime_checkable
class KnowsPositions(Protocol):
    """A backbone Config knowing, before any weights load, how many positions its model has
    (prompt and canvas together); None when it cannot tell (a Hub model not yet fetched)."""

    positions: int | None


@runtime_checkable
class ShipsScorers(Protocol):
    """A backbone Config naming scorers trained for its weights: run name → (plugin, options)."""

    shipped_scorers: dict[str, tuple[str, dict[str, Any]]]


@runtime_checkable
class CountsTokens(Protocol):
    """A backbone that says how many tokens its denoising forward computes over rows of these
    widths (a packing backbone computes the rows' own, not rows × the widest); compute.json's
    padding ratio reads it. Without it a forward computes rows × the widest row."""

    def computed_tokens(self, widths: Sequence[int]) -> int: ...


@runtime_checkable
class SharesCanvases(Protocol):
    """A backbone that computes the forward of each distinct canvas of a denoising batch
    once: rows with the same tokens share it (a row's forward is a function of its canvas
    alone), and each is still sampled with its own key. `computed_rows`: the rows whose
    forward it computes, the first of each canvas. compute.json's physical tokens and FLOPs
    count those; what each method is charged does not change (every row its passes, as if it
    ran alone)."""

    def computed_rows(self, batch: StepBatch) -> list[int]: ...


@runtime_checkable
class HasModelShape(Protocol):
    """A backbone or scorer that states its `ModelShape` (matmul parameters, head, layers,
    attention width) for the FLOP ledger. A `TransformerBackbone` without it is read from its
    transformer (`dllmbench.core.flops.shape_of`); any other model's FLOPs are unknown."""

    model_shape: ModelShape


@runtime_checkable
class CountsStepWork(Protocol):
    """A backbone that says what its denoising forward computes for each row of a batch
    (query tokens, keys attended, head positions), given the rows before the step. Without
    it a row's step is a bidirectional forward over its whole canvas with the head at every
    position (`Work.full`)."""

    def step_work(self, batch: StepBatch) -> list[Work]: ...


@runtime_checkable
class CountsScoreWork(Protocol):
    """A scorer that says what its forward computes for each row (without it: `Work.full`
    with the head read once per row)."""

    def score_work(self, batch: ScoreBatch) -> list[Work]: ...


@runtime_checkable
class PricesSteps(Protocol):
    """A backbone whose steps differ in cost along a row (a KV cache: most steps run one
    block, some also store the block before it, the first the prompt): `row_works` says what
    each step of a whole row computes when no step ends it early, from the fully masked
    canvas. The planner prices a denoising pass as their mean. Without it a pass is priced
    as the row's first step (`CountsStepWork`)."""

    def row_works(self, canvas: torch.Tensor, prompt_len: int, total_steps: int) -> list[Work]: ...


@runtime_checkable
class FinishesEarly(Protocol):
    """A backbone whose sampler may fill a row's canvas before its T (confidence-threshold
    decoding): `finishes_early(settings)` says whether a row under these settings (empty: the
    backbone's own) ends once no generated position is masked. Such a row takes no further
    forward and is charged only the steps it took; its method's cost is a cap."""

    def finishes_early(self, settings: Mapping[str, Any]) -> bool: ...


@runtime_checkable
class KeepsState(Protocol):
    """A backbone that keeps state across a problem's steps (a KV cache of committed blocks,
    shared by every row whose canvas starts with them). The engine holds a problem's prompt
    while the problem runs and releases it when its last strategy run ends: what the backbone
    keeps for that prompt may then be freed. Holds of one prompt are counted."""

    def hold(self, prompt_ids: Sequence[int]) -> None: ...

    def release(self, prompt_ids: Sequence[int]) -> None: ...


@runtime_checkable
class Capped(Protocol):
    """A strategy whose `cost(T)` is a cap, not an exact spend: it decides at run time how
    much to spend (adaptive sampling, early-stopping rows) and may return a pool smaller than
    `pool_size()` (at least one candidate). The ledger refuses any charge over the cap."""

    capped: bool


@runtime_checkable
class CountsForwardMemory(Protocol):
    """A backbone whose denoising forward needs memory beyond the per-token activations that
    `sized_to_memory` counts (a packing backbone's document mask and FlexAttention's per-token
    statistics); the batch sizing adds it. Without it a forward needs nothing more."""

    def forward_extra_bytes(self, tokens: int) -> int:
        """Bytes beyond the activations for a forward over at most `tokens` rows × width."""


@runtime_checkable
class CountsCacheMemory(Protocol):
    """A backbone that keeps a KV cache across steps (`KeepsState`): `cache_bytes(tokens)` is
    the memory of the cached keys and values of that many tokens, and `limit_cache(nbytes)`
    bounds what it may hold. The engine's sizing sets aside the cache of every problem in
    flight before it sizes a forward, and admits fewer problems when they would not fit."""

    def cache_bytes(self, tokens: int) -> int: ...

    def limit_cache(self, nbytes: int) -> None: ...


@runtime_checkable
class MaybeDeterministic(Protocol):
    """A backbone Config that can say its samples do not depend on the key."""

    deterministic: bool


@runtime_checkable
class EndsEarly(Protocol):
    """A backbone Config that can say, before the model loads, whether its rows may end before
    their T (a confidence threshold, a block model): every method on it is then capped."""

    ends_early: bool


@runtime_checkable
class MaybeApproximate(Protocol):
    """A backbone, or its Config, that can say its decoding approximates the model's own (an
    approximate KV cache refreshed once per block): its runs are flagged, and the report can
    set their answers beside an exact run's (`dllmbench report RUN --exact EXACT_RUN`)."""

    approximate: bool


@runtime_checkable
class MaybeTrained(Protocol):
    """A scorer, or its Config, that can say it has no trained weights."""

    trained: bool


@runtime_checkable
class LocatesWeights(Protocol):
    """A plugin that read weight files (the manifest records their hashes)."""

    def weight_files(self) -> dict[str, list[Path]]:
        """Config field → the files it located."""


@runtime_checkable
class GradesMany(Protocol):
    """A task that grades a whole pool at once (sandboxes or workers in parallel)."""

    def grade_many(self, items: Sequence[tuple[Problem, str | None, str]]) -> Sequence[bool]: ...


@runtime_checkable
class NotesGrades(Protocol):
    """A task that can say more about a grade than true or false: a line kept in the record
    (`candidates[i].grade_note`), e.g. that a program timed out beside others and was graded
    on a second run alone. None when there is nothing to say."""

    def grade_note(self, problem: Problem, answer: str) -> str | None: ...


@runtime_checkable
class Configured(Protocol):
    """A built plugin that keeps its configuration (a dataclass) as `config`."""

    config: Any


# -- what a factory may declare ------------------------------------------------------------------


@runtime_checkable
class HasConfig(Protocol):
    """A factory declaring its options as a dataclass `Config` (types, defaults, checks)."""

    Config: type


@runtime_checkable
class HasContractConfigs(Protocol):
    """A factory naming the configurations the contract kit runs it with."""

    contract_configs: list[dict[str, Any]]


@runtime_checkable
class HasContractBackbone(Protocol):
    """A scorer factory naming the backbone the contract kit builds it on: (name, options)."""

    contract_backbone: tuple[str, dict[str, Any]]


@runtime_checkable
class HasCostFormula(Protocol):
    """A strategy factory stating its cost in words, e.g. "denoise: n·T"."""

    cost_formula: str


@runtime_checkable
class _Costed(Protocol):
    def cost(self, total_steps: int) -> dict[str, int]: ...


KIND_PROTOCOLS: dict[str, type] = {
    "backbone": Backbone,
    "scorer": Scorer,
    "strategy": SearchStrategy,
    "selector": Selector,
    "task": Task,
}


def protocol_members(protocol: type) -> list[str]:
    """The attribute and method names a Protocol declares (its bases' included)."""
    return list(_protocol_members(protocol))


@functools.cache
def _protocol_members(protocol: type) -> tuple[str, ...]:
    """`protocol_members`, read once per Protocol (a plugin is held to one at every build)."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (Protocol, object) or base.__name__ == "Generic":
            continue
        names |= set(inspect.get_annotations(base))
        names |= {k for k, v in base.__dict__.items() if callable(v) and not k.startswith("_")}
    return tuple(sorted(names))


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of `protocol` that `obj` lacks (empty: it conforms)."""
    return [name for name in protocol_members(protocol) if not hasattr(obj, name)]


# -- readers of the optional capabilities ---------------------------------------------------------


def passes_per_step(obj: object) -> int:
    """Forwards per row-step of a backbone or its Config (1 unless it is `MultiPass`)."""
    return int(obj.passes_per_step) if isinstance(obj, MultiPass) else 1


def model_shape(obj: object) -> ModelShape | None:
    """A backbone's or scorer's shape for the FLOP ledger (`HasModelShape`, else read from a
    `TransformerBackbone`'s transformer), or None when it cannot be known."""
    if isinstance(obj, HasModelShape):
        return obj.model_shape
    if isinstance(obj, TransformerBackbone):
        return shape_of(obj.transformer)
    return None


def is_capped(strategy: object) -> bool:
    """Whether a strategy's cost is a cap (`Capped`)."""
    return bool(strategy.capped) if isinstance(strategy, Capped) else False


def reports_predictions(backbone: object) -> bool:
    """Whether a backbone (or its class) reports each step's predictions
    (`ReportsPredictions` and its `predicts`)."""
    return bool(backbone.predicts) if isinstance(backbone, ReportsPredictions) else False


def reads_predictions(strategy: object) -> bool:
    """Whether a strategy's rows ask for their predictions (`ReadsPredictions`)."""
    return bool(strategy.reads_predictions) if isinstance(strategy, ReadsPredictions) else False


def pool_size_of(strategy: Any, total_steps: int) -> int:
    """A strategy's pool size at T: `pool_size_at(T)` (`SizedBySteps`), else `pool_size()`."""
    if isinstance(strategy, SizedBySteps):
        return int(strategy.pool_size_at(total_steps))
    return int(strategy.pool_size())


def finishes_early(backbone: object, settings: Mapping[str, Any]) -> bool:
    """Whether rows under `settings` may end before their T on this backbone."""
    return bool(backbone.finishes_early(settings)) if isinstance(backbone, FinishesEarly) else False


def sets_per_row(strategy: object) -> frozenset[str]:
    """The sampler settings a strategy's rows set, by its config (`SetsPerRow`; else none
    said)."""
    return frozenset(strategy.sets_per_row()) if isinstance(strategy, SetsPerRow) else frozenset()


STEPS = "steps"  # the setting that gives a row its own T: every backbone honours it


def row_settings(backbone: object) -> frozenset[str]:
    """The sampler settings a backbone lets rows vary: `steps` (a row's own T, which the
    engine gives every backbone through `StepBatch.totals`), and those it lists if it is
    `VariesPerRow`. A backbone need not list `steps` for a strategy to set it."""
    own = frozenset(backbone.row_settings) if isinstance(backbone, VariesPerRow) else frozenset()
    return own | {STEPS}


def reopenable(
    backbone: object,
) -> Callable[[torch.Tensor, int, Mapping[str, Any]], torch.Tensor] | None:
    """Which committed positions of a row a canvas edit may re-mask (`ReopensPositions`);
    None: every one."""
    return backbone.reopenable if isinstance(backbone, ReopensPositions) else None


def commit_orders(backbone: object) -> dict[str, tuple[str, ...]]:
    """The commit orders a backbone's rows may mix, by the setting that picks them (none unless
    it is `MixesOrders`)."""
    if not isinstance(backbone, MixesOrders):
        return {}
    return {name: tuple(values) for name, values in backbone.commit_orders.items()}


def evidence_of(strategy: object) -> Evidence:
    """A strategy's declared evidence (`DeclaresEvidence`), else its `prefix_field` alone."""
    if isinstance(strategy, DeclaresEvidence):
        declared = strategy.evidence()
        if not isinstance(declared, Evidence):
            raise TypeError(f"evidence() returned a {type(declared).__name__}, not an Evidence")
        return declared
    return Evidence(nested=strategy.prefix_field)  # type: ignore[attr-defined]


def shipped_scorers(config: object) -> dict[str, tuple[str, dict[str, Any]]]:
    """The scorers a backbone Config ships with (none unless it is `ShipsScorers`)."""
    return dict(config.shipped_scorers or {}) if isinstance(config, ShipsScorers) else {}


def positions(config: object) -> int | None:
    """The positions a backbone Config's model has (None unless it is `KnowsPositions` and can
    tell): a canvas as long leaves none for the prompt."""
    known = config.positions if isinstance(config, KnowsPositions) else None
    return int(known) if known else None


def ends_early(config: object) -> bool:
    """Whether a backbone Config's rows may end before their T (`EndsEarly`)."""
    return bool(config.ends_early) if isinstance(config, EndsEarly) else False


def is_deterministic(config: object) -> bool:
    return bool(config.deterministic) if isinstance(config, MaybeDeterministic) else False


def is_approximate(backbone: object) -> bool:
    """Whether a backbone (or its Config) decodes approximately (`MaybeApproximate`)."""
    if isinstance(backbone, MaybeApproximate):
        return bool(backbone.approximate)
    config = getattr(backbone, "config", None)
    return bool(config.approximate) if isinstance(config, MaybeApproximate) else False


def is_trained(obj: object) -> bool:
    """False only for a scorer (or its Config) that says it has no trained weights."""
    return bool(obj.trained) if isinstance(obj, MaybeTrained) else True


def weight_files(obj: object) -> dict[str, list[Path]]:
    return obj.weight_files() if isinstance(obj, LocatesWeights) else {}


def config_class(factory: object) -> type | None:
    """A factory's `Config` dataclass, or None when it declares none (`HasConfig`, read
    with getattr: a runtime Protocol's isinstance costs more than the build it checks)."""
    config = getattr(factory, "Config", None)
    return config if config is not None and dataclasses.is_dataclass(config) else None


def contract_configs(factory: object) -> list[dict[str, Any]]:
    """The configurations the contract kit runs a factory with (default: its defaults)."""
    if isinstance(factory, HasContractConfigs):
        return [dict(c) for c in factory.contract_configs] or [{}]
    return [{}]


def contract_backbone(factory: object) -> tuple[str, dict[str, Any]] | None:
    """The backbone (name, options) a scorer's contract checks build it on (None: the toy)."""
    return factory.contract_backbone if isinstance(factory, HasContractBackbone) else None


def cost_formula(factory: object) -> str | None:
    """A strategy's cost in words: its `cost_formula`, else the first line of its cost's doc."""
    if isinstance(factory, HasCostFormula):
        return factory.cost_formula
    if isinstance(factory, _Costed):  # a strategy class: its `cost` method
        doc = inspect.getdoc(factory.cost)
        return doc.splitlines()[0] if doc else None
    return None
