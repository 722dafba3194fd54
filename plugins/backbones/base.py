"""What Dream and LLaDA share: prompts, canvases, the padded bidirectional forward, decoding.

A batch may mix rows of different problems and lengths. Rows are left-padded to the longest,
with a key-padding attention mask and positions re-based so every row's first real token is
at position 0: each row then sees exactly what it would see alone. With `attention=packed` the
denoising forward lays the rows end to end instead, under a FlexAttention document mask
(packing.py): the same tokens, no padding computed. Every random draw of a row
comes from a generator seeded by (row key, step) and salted by the draw's purpose (token draw,
commit order, position draw, tie-break), drawn at the row's own length: a row's noise depends
only on its key and step, never on the batch, and no two purposes share uniforms.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch

from dllmbench.api.interfaces import StepBatch, row_settings_line
from dllmbench.core.errors import Notice, UserError
from dllmbench.core.flops import Work
from dllmbench.core.keys import torch_generator
from dllmbench.core.types import Prompt
from dllmbench.plugins.backbones.cpu_linear import use_onednn
from dllmbench.plugins.backbones.loading import (
    char_tokenizer,
    checkpoint_files,
    device_and_dtype,
    load_checkpoint,
    mask_id_of,
    random_model,
    resolve,
)
from dllmbench.plugins.backbones.packing import (
    flex_available,
    packed_forward_bytes,
    packed_hidden,
    packed_length,
)

# tokens that end an answer besides the tokenizer's EOS: chat turn ends of each family
TURN_ENDS = ("<|im_end|>", "<|eot_id|>")

# what a row's uniforms are for; each purpose has its own generator ("predict": LLaDA's
# token draw at the positions a step predicts beyond those it may commit)
PURPOSES = ("token", "order", "position", "tie", "predict")

# how a batch's rows meet attention: left-padded to the widest (SDPA), or end to end (packing.py)
Attention = Literal["sdpa", "packed"]
ATTENTIONS: tuple[str, ...] = get_args(Attention)


def vocabulary_size(transformer: Any, tokenizer: Any) -> int:
    """Token ids the model embeds: its input embedding's rows, else the tokenizer's size."""
    try:
        return int(transformer.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError, ValueError):
        return len(tokenizer)


def _salt(purpose: str) -> int:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown noise purpose {purpose!r}")
    digest = hashlib.blake2b(f"noise:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def purpose_generator(
    key: int, step: int, purpose: str, device: str | torch.device = "cpu"
) -> torch.Generator:
    """The generator of one row's noise for one purpose at one step: the row key salted by the
    purpose, so the token draw, the commit order, the position draw and the tie-break never
    share uniforms."""
    return torch_generator(key ^ _salt(purpose), step, device)


def block_schedule(gen_length: int, block: int | None, total: int) -> tuple[int, int]:
    """(block length, steps per block) of a semi-autoregressive schedule: the generated
    region in blocks of `block` (None: one block), T split evenly over them, as LLaDA's
    reference asserts."""
    block = block or gen_length
    if gen_length % block:
        raise UserError(f"gen_length {gen_length} is not a multiple of block_length {block}")
    blocks = gen_length // block
    if total % blocks:
        raise UserError(
            f"{total} steps do not split over {blocks} blocks of {block}; "
            "choose steps divisible by gen_length / block_length"
        )
    return block, total // blocks


@dataclass(frozen=True)
class BlockStep:
    """Where one step of a semi-autoregressive schedule stands: positions before `end` (of the
    generated region) may commit; it is step `j` of the `per` steps its block spans."""

    end: int
    j: int
    per: int
    even: bool  # the blocks divide the canvas and T splits evenly over them (the reference)

    @property
    def last(self) -> bool:
        return self.j == self.per - 1


def block_step(gen_length: int, block: int | None, total: int, step: int) -> BlockStep:
    """The block schedule at `step`. When the blocks divide the canvas and T splits evenly
    over them this is the reference's schedule; otherwise the last block is shorter and
    block b starts at step ⌈b·T / blocks⌉ (with fewer steps than blocks, one step spans
    several blocks, and the last step every remaining one)."""
    block = max(1, min(block or gen_length, gen_length))
    blocks = -(-gen_length // block)
    if gen_length % block == 0 and total % blocks == 0:
        per = total // blocks
        b, j = divmod(step, per)
        return BlockStep((b + 1) * block, j, per, True)
    b = blocks - 1 if step == total - 1 else step * blocks // total
    first = -(-b * total // blocks)
    after = total if b == blocks - 1 else -(-(b + 1) * total // blocks)
    return BlockStep(min((b + 1) * block, gen_length), step - first, after - first, False)


def ranked_order(score: torch.Tensor, ties: torch.Tensor) -> torch.Tensor:
    """[B, L] each row's positions by descending score. Equal scores are ordered by the keyed
    uniforms `ties` [B, L], not by position: a tie goes to no position in particular."""
    shuffle = torch.argsort(ties, dim=-1)
    by_score = torch.argsort(score.gather(-1, shuffle), dim=-1, descending=True, stable=True)
    return shuffle.gather(-1, by_score)


def top_ranked(score: torch.Tensor, k: torch.Tensor, ties: torch.Tensor) -> torch.Tensor:
    """[B, L] mask of each row's k[b] highest scores, equal scores ordered as `ranked_order`."""
    order = ranked_order(score, ties)
    ranks = torch.arange(score.shape[-1], device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ranks)
    return rank < k.to(score.device)[:, None]


def check_finite(name: str, value: Any, works: str) -> None:
    """Refuse a sampler number that is not a finite number >= 0 (`nan`, `inf`, negative);
    `works` says what values mean, for the message."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{name} must be a finite number >= 0 ({works}), got {value!r}")


def check_temperature(temperature: Any) -> None:
    check_finite("temperature", temperature, "0 draws the most probable token; e.g. 0.5")


def check_seed(seed: int) -> None:
    """The seed of `model="random"`: >= 0, as `--seed`."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


# the parallel decoding rules a row may add to its schedule (docs/backbones.md), at most one
PARALLEL_RULES = ("threshold", "factor", "entropy_bound")


def rules_set(config: Any) -> list[str]:
    """The parallel decoding rules a Dream or LLaDA Config sets (at most one is valid)."""
    return [rule for rule in PARALLEL_RULES if getattr(config, rule) is not None]


def with_row_settings(config: Any, settings: Mapping[str, Any]) -> Any:
    """`config` with a row's own sampler settings, checked by the Config (its ValueError or
    TypeError says why it cannot be): a row's parallel decoding rule replaces the run's,
    whichever it is."""
    values = dict(settings)
    rules = all(hasattr(config, rule) for rule in PARALLEL_RULES)
    if rules and set(values) & set(PARALLEL_RULES):
        values = {**dict.fromkeys(PARALLEL_RULES), **values}
    return dataclasses.replace(config, **values)


class RowRefusals:
    """A backbone Config's `row_refusal` (`dllmbench.interfaces.RefusesRowSettings`): why
    rows with these settings cannot sample under it, read before the model loads, as the
    built backbone's `check_row_settings` would say when a row starts."""

    def row_refusal(self, settings: Mapping[str, Any]) -> str | None:
        try:
            with_row_settings(self, settings)
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None


def check_parallel(config: Any, order: tuple[str, str, str], ranked: tuple[str, ...]) -> None:
    """Refuse parallel decoding settings that cannot be: two rules at once, a value out of
    range, Fast-dLLM's rules beside a commit order other than by the drawn token's probability,
    or EB-Sampler's beside one that ranks no confidence (`order`: the setting, its value, the
    value Fast-dLLM's rules need; `ranked`: the values that rank positions by a confidence)."""
    setting, value, required = order
    threshold, factor = config.threshold, config.factor
    given = rules_set(config)
    if len(given) > 1:
        both = " and ".join(given)
        raise ValueError(f"set one of threshold, factor or entropy_bound, got {both}")
    if (threshold is not None or factor is not None) and value != required:
        raise ValueError(
            "threshold and factor compare the drawn token's probability, which only "
            f"{setting}={required} commits by; got {setting}={value}"
        )
    if config.entropy_bound is not None and value not in ranked:
        raise ValueError(
            "entropy_bound commits in the order of the sampler's confidence, which "
            f"{setting}={value} does not rank by; use {setting}={' or '.join(ranked)}"
        )
    if threshold is not None and not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if factor is not None and not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor!r}")
    check_entropy_bound(config.entropy_bound)


def check_entropy_bound(bound: Any) -> None:
    """Refuse an `entropy_bound` that is not a finite number > 0 (nats)."""
    number = isinstance(bound, (int, float)) and not isinstance(bound, bool)
    if bound is not None and not (number and 0 < bound < math.inf):
        raise ValueError(f"entropy_bound must be a finite number > 0 (e.g. 0.1), got {bound!r}")


def factor_count(confidence: torch.Tensor, factor: float) -> int:
    """How many of these confidences [n] Fast-dLLM's factor rule commits (the reference's
    `get_transfer_index_dynamic`): ranked in descending order, the first rank i >= 1 whose
    confidence is below 1 − factor / (i + 2), in float64; all n when no rank from 1 to n − 2
    is (a miss at the last rank counts as none, as in the reference); 0 when n is 0."""
    n = confidence.numel()
    ranked = confidence.double().sort(descending=True).values
    ranks = torch.arange(n, dtype=torch.float64, device=ranked.device)
    below = ranked < 1 - factor / (ranks + 2)
    misses = below[1 : n - 1].nonzero()
    return 1 + int(misses[0]) if len(misses) else n


def entropy_bound_count(entropy: torch.Tensor, bound: float) -> int:
    """How many positions EB-Sampler commits, from their entropies [n] in commit order (Ben-Hamu
    et al., arXiv 2505.24857): the longest prefix whose entropies' sum less their largest is at
    most `bound`, in float64. A lone position spends 0, so at least one commits when n >= 1;
    a non-finite entropy ends the run after the first position."""
    h = entropy.double()
    spent = h.cumsum(0) - h.cummax(0).values  # never decreases along the prefix
    spent[:1] = 0  # even when the first entropy is not finite
    return int(torch.cumprod(spent <= bound, 0).sum())


def model_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[M] the float64 entropy, in nats, of the model's distribution softmax(logits) [M, V] at
    each position: EB-Sampler's cost, before any temperature or top-p/top-k filter (tokens
    the sampler can never draw already at −inf)."""
    return torch.special.entr(torch.softmax(logits.double(), dim=-1)).sum(-1)


def parallel_commits(
    confidence: torch.Tensor,
    eligible: torch.Tensor,
    ties: torch.Tensor,
    config: Any,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """[L] the eligible positions of one row that its parallel decoding rule commits at this
    step, from their confidences [L] ranked in descending order (equal ones ordered by `ties`,
    as `top_ranked`): Fast-dLLM's, those at or above `threshold` or the `factor` rule's most
    confident (`factor_count`); EB-Sampler's, the longest ranked prefix within `entropy_bound`
    of the positions' entropies [L] (`entropy_bound_count`)."""
    if config.threshold is not None:
        return eligible & (confidence >= config.threshold)
    if config.factor is not None:
        k = factor_count(confidence[eligible], config.factor)
    elif config.entropy_bound is not None:
        assert entropy is not None, "entropy_bound needs the positions' entropies"
        order = ranked_order(confidence[None], ties[None])[0]
        k = entropy_bound_count(entropy[order[eligible[order]]], config.entropy_bound)
    else:
        return torch.zeros_like(eligible)
    ranked = top_ranked(confidence[None], torch.tensor([k]), ties[None])[0]
    return eligible & ranked


# Prophet's early exit (Li et al., arXiv 2508.19982) and the tokens it holds in the canvas: the
# sampler settings of its rule (docs/backbones.md, "Prophet's early exit")
PROPHET_SETTINGS = (
    "prophet",
    "answer_at",
    "answer_length",
    "early_gap",
    "mid_gap",
    "late_gap",
    "constraints",
)


def parse_constraints(text: Any) -> list[tuple[int, str]]:
    """`constraints` written as the reference's "200:The|201:answer" (generated positions, 0
    the first after the prompt) as (position, word) pairs, in order."""
    pairs = []
    for part in filter(None, (p.strip() for p in str(text).split("|"))):
        where, colon, word = part.partition(":")
        where = where.strip()
        if not (colon and word.strip() and where.isascii() and where.isdigit()):
            raise ValueError(
                "constraints must be position:word pairs separated by |, positions counted "
                f"from the first generated one (e.g. 20:The|21:answer|22:is), got {part!r}"
            )
        pairs.append((int(where), word.strip()))
    return pairs


def check_prophet(config: Any) -> None:
    """Refuse Prophet settings that cannot be: no answer region, a region or bar out of range,
    or a cache that computes only part of the canvas."""
    constraints = parse_constraints(config.constraints)
    if not isinstance(config.prophet, bool):
        raise ValueError(f"prophet must be true or false, got {config.prophet!r}")
    at = config.answer_at
    if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 0):
        raise ValueError(f"answer_at must be a generated position >= 0, got {at!r}")
    length = config.answer_length
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"answer_length must be an int >= 1 (the reference's 5), got {length!r}")
    for name in ("early_gap", "mid_gap", "late_gap"):
        check_finite(name, getattr(config, name), "a mean top-2 logit gap, e.g. 7.5, 5 and 2.5")
    if config.prophet and at is None and not constraints:
        raise ValueError(
            "prophet needs its answer region: answer_at=<generated position> (e.g. answer_at=20), "
            "or constraints (e.g. 20:The|21:answer|22:is) that it starts 2 after"
        )
    if (config.prophet or constraints) and getattr(config, "cache", "none") != "none":
        raise ValueError(
            "prophet and constraints need the whole canvas computed at every step, which "
            "Fast-dLLM's cache does not; use cache=none"
        )


def exit_bar(config: Any, step: int, total: int) -> float:
    """The gap Prophet's rule asks at step `step` (0-based) of `total`: the early bar while
    (step + 1) / total < 0.33, the mid one below 0.67, the late one after (the reference's
    phases, over its 1-based global step)."""
    progress = (step + 1) / total
    if progress < 0.33:
        return float(config.early_gap)
    return float(config.mid_gap if progress < 0.67 else config.late_gap)


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """[M] float64 top-1 minus top-2 logit of logits [M, V], the difference taken in the
    logits' own dtype (as the reference's `.item()` of the difference)."""
    if logits.shape[0] == 0:
        return logits.new_zeros(0, dtype=torch.float64)
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).double()


def distinct_rows(rows: Iterable[torch.Tensor]) -> tuple[list[int], list[int]]:
    """The first of each distinct row (same length and tokens) in order, and for every row
    the position of its own among those firsts."""
    seen: dict[bytes, int] = {}
    first, inverse = [], []
    for i, row in enumerate(rows):
        n = seen.setdefault(row.cpu().numpy().tobytes(), len(first))
        if n == len(first):
            first.append(i)
        inverse.append(n)
    return first, inverse


def unknown_token(tokenizer: Any) -> tuple[str, int] | None:
    """The token a tokenizer reads a word outside its vocabulary as, and its id: its own
    `unk_token`, or its tokenizers model's (WordLevel, WordPiece); None for a byte-level
    tokenizer (Dream's, LLaDA's), which has no unknown word."""
    token = getattr(tokenizer, "unk_token", None)
    if token is None:
        model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
        token = getattr(model, "unk_token", None)
    unknown = tokenizer.convert_tokens_to_ids(token) if token else None
    return (token, unknown) if unknown is not None else None


class DiffusionBackbone(abc.ABC):
    """A masked-diffusion LM on a native transformers class. Subclasses supply `commit`.

    It implements `dllmbench.interfaces.TransformerBackbone`, whose weights the reward
    scorers share."""

    arch: ClassVar[str]
    # the plugin name its messages give, when it is not the architecture's (tiny is a dream)
    shown_as: ClassVar[str | None] = None
    shift: ClassVar[bool]  # read the logit of position i from position i-1 (Dream)
    mask_names: ClassVar[tuple[str, ...]]
    Config: ClassVar[type]
    # sampler settings a row may override (`StepBatch.settings`); `steps` is each row's own T
    row_settings: ClassVar[frozenset[str]]
    # the commit orders the sampler has, by the setting that picks one (`commit_orders`: those
    # a row may set under this backbone's configuration)
    offered_orders: ClassVar[dict[str, tuple[str, ...]]] = {}
    # reports each step's predictions to rows that ask (`ReportsPredictions`); an object
    # says False under Fast-dLLM's cache, whose forward does not compute every position
    predicts: bool = True

    def __init__(self, *, transformer: Any = None, tokenizer: Any = None, **config: Any):
        self.config = self.Config(**config)
        c = self.config
        self.device, self.dtype = device_and_dtype(c.device, c.dtype)
        raw: dict[str, Any] = {}
        self.checkpoint: Path | None = None  # the checkpoint directory read, if any
        if transformer is not None:  # an in-memory model (tests, the shipped demo)
            self.transformer, self.tokenizer = transformer, tokenizer
        elif c.model == "random":
            self.tokenizer = char_tokenizer()
            self.transformer = self.random_transformer(self.tokenizer)
        else:
            self.checkpoint = resolve(c.model)
            self.transformer, self.tokenizer, raw = load_checkpoint(
                self.layout, str(self.checkpoint), self.device, self.dtype
            )
        # what a word outside the vocabulary reads as; None once a prompt said so (`encode`)
        self._unknown = unknown_token(self.tokenizer)
        self.transformer.to(self.device).eval().requires_grad_(False)
        if self.device.type == "cpu":  # float32 linears through oneDNN (cpu_linear.py)
            use_onednn(self.transformer)
        self.mask_id = (
            c.mask_id
            if c.mask_id is not None
            else mask_id_of(raw, self.tokenizer, self.mask_names, c.model)
        )
        vocabulary = vocabulary_size(self.transformer, self.tokenizer)
        if not 0 <= self.mask_id < vocabulary:
            raise UserError(
                f"mask_id={self.mask_id} is outside the vocabulary of {c.model} (ids 0 to "
                f"{vocabulary - 1}); leave mask_id out to use the model's own mask token"
            )
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None or self.pad_id == self.mask_id:
            self.pad_id = self.tokenizer.eos_token_id
        if self.pad_id == self.mask_id or self.pad_id is None:
            raise UserError(f"{c.model}: no pad token distinct from the mask token")
        if c.attention == "packed" and not flex_available():
            raise UserError(
                f"attention=packed needs FlexAttention (torch >= 2.5; this is {torch.__version__})"
                "; use attention=sdpa"
            )
        vocab = self.tokenizer.get_vocab()
        self.eos_id: int | None = self.tokenizer.eos_token_id
        self.stop_ids = {
            i for i in [self.eos_id, *(vocab.get(t) for t in TURN_ENDS)] if i is not None
        }
        self.chat = c.chat if c.chat is not None else bool(self.tokenizer.chat_template)
        # Fast-dLLM's approximate cache (fastcache.py), for Configs with `cache=prefix|dual`;
        # only then is the backbone `KeepsState`, `PricesSteps` and `CountsCacheMemory`
        self.fast_cache = None
        if getattr(c, "cache", "none") in ("prefix", "dual"):
            from dllmbench.plugins.backbones.fastcache import FastCache

            self.fast_cache = cache = FastCache(self)
            self.hold, self.release = cache.store.hold, cache.store.release
            self.row_works = cache.row_works
            self.cache_bytes, self.limit_cache = cache.cache_bytes, cache.limit_cache
        self.predicts = type(self).predicts and self.fast_cache is None

    @property
    def layout(self) -> str:
        """The checkpoint layout `load_checkpoint` reads: this architecture's own."""
        return self.arch

    @property
    def approximate(self) -> bool:
        """Whether decoding departs from the exact forward by design (Fast-dLLM's cache)."""
        return self.fast_cache is not None

    def random_transformer(self, tokenizer: Any) -> torch.nn.Module:
        """The tiny random model of `model="random"`, deterministic in the config's seed."""
        return random_model(self.arch, tokenizer, self.config.seed, self.dtype)

    # -- sampler settings per row -------------------------------------------------------------
    def row_config(self, settings: Mapping[str, Any]) -> Any:
        """This backbone's Config with a row's own settings (checked by the Config)."""
        if not settings:
            return self.config
        key = tuple(sorted(settings.items()))
        cache = self.__dict__.setdefault("_row_configs", {})
        if key not in cache:
            unknown = sorted(set(settings) - self.row_settings)
            if unknown:
                raise UserError(
                    f"{self.shown_as or self.arch}: a row cannot set {unknown[0]!r} "
                    f"(per-row settings: {', '.join(sorted(self.row_settings))})"
                )
            try:
                cache[key] = with_row_settings(self.config, settings)
            except (TypeError, ValueError) as exc:
                who = self.shown_as or self.arch
                raise UserError(row_settings_line(who, settings, str(exc))) from None
        return cache[key]

    @property
    def commit_orders(self) -> dict[str, tuple[str, ...]]:
        """The commit orders worth mixing (`MixesOrders`): of the sampler's, those a row may
        set beside this backbone's own settings. A run-wide threshold or factor compares the
        drawn token's probability, which only one order ranks by, so under one no order is
        left to mix (sampler ensembles then mix temperatures), where every row of
        `orders=auto` was refused at the first problem."""
        mixed: dict[str, tuple[str, ...]] = {}
        for setting, values in self.offered_orders.items():
            taken = []
            for value in values:
                try:
                    self.row_config({setting: value})
                except UserError:
                    continue
                taken.append(value)
            if len(taken) > 1:
                mixed[setting] = tuple(taken)
        return mixed

    def check_row_settings(
        self, settings: Mapping[str, Any], gen_length: int, total_steps: int
    ) -> None:
        """Refuse a row's settings the sampler cannot take. A row's own block length need not
        divide the canvas (`block_step`)."""
        self.row_config(settings)

    def finishes_early(self, settings: Mapping[str, Any]) -> bool:
        """Whether a row under these settings may fill its canvas before its T: a parallel
        decoding rule is set (`FinishesEarly`)."""
        return self.row_config(settings).ends_early

    def weight_files(self) -> dict[str, list[Path]]:
        """Config field → the checkpoint files it located (the manifest records their hashes)."""
        return {"model": checkpoint_files(self.checkpoint)} if self.checkpoint else {}

    # -- prompts and canvases -----------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if prompt.is_chat and self.chat:
            ids = self.tokenizer.apply_chat_template(
                list(prompt.messages), add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        text = "\n\n".join(m["content"] for m in prompt.messages) if prompt.is_chat else prompt.text
        ids = list(self.tokenizer(text)["input_ids"])
        if self._unknown is not None:
            self._tell_unknown(text, ids)
        return ids

    def _tell_unknown(self, text: str, ids: list[int]) -> None:
        """Say once, as a `Notice`, that a prompt holds words the tokenizer reads as its unknown
        token: the shipped tiny models know only arith's 67 pieces, and read any other word as
        end-of-text (a byte-level tokenizer, as Dream's and LLaDA's, has no unknown word)."""
        token, unknown = self._unknown or ("", -1)
        if ids.count(unknown) <= text.count(token):
            return
        self._unknown = None
        offsets = self.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
        words = [text[a:b] for i, (a, b) in zip(ids, offsets, strict=True) if i == unknown]
        words = [w for w in dict.fromkeys(words) if w != token]
        shown = ", ".join(repr(w) for w in words[:5]) + (", ..." if len(words) > 5 else "")
        warnings.warn(
            f"{len(words)} piece{'s' * (len(words) > 1)} of the prompt "
            f"{'are' if len(words) > 1 else 'is'} not in the vocabulary of {self.config.model} "
            f"and read as {token} ({shown}): it knows only the words of the task it was "
            "trained on",
            Notice,
            stacklevel=2,
        )

    def canvas(self, prompt_ids: Sequence[int], gen_length: int) -> torch.Tensor:
        ids = torch.tensor(list(prompt_ids), dtype=torch.long)
        return torch.cat([ids, torch.full((gen_length,), self.mask_id, dtype=torch.long)])

    def decode(self, tokens: torch.Tensor, prompt_len: int) -> str:
        """The answer up to the first end token. Leftover masks at either end are dropped; a
        run of them between two tokens shows as the mask token's text, so its neighbours are
        never glued ("12<mask>5" is not "125")."""
        pieces: list[list[int]] = [[]]
        for t in tokens[prompt_len:].tolist():
            if t in self.stop_ids:
                break
            if t != self.mask_id:
                pieces[-1].append(t)
            elif pieces[-1]:
                pieces.append([])
        marker = self.tokenizer.convert_ids_to_tokens(self.mask_id)
        texts = [self.tokenizer.decode(p, skip_special_tokens=True) for p in pieces if p]
        return marker.join(texts)

    # -- the forward ----------------------------------------------------------------------------
    def pad(self, rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Left-padded ids [B, L], attention mask [B, L] and each row's left offset."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        offsets = []
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = row
            attn[i, width - len(row) :] = 1
            offsets.append(width - len(row))
        return ids, attn, offsets

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Last hidden states [B, L, H] of the bidirectional forward, aligned with the logits
        the sampler reads: shifted one position right for Dream. Rows of one canvas (the
        same tokens and padding) are computed once and share the result: a row's forward is a
        function of its canvas alone, whatever else the batch holds (`SharesCanvases`)."""
        first, inverse = distinct_rows(torch.cat([ids, attn.to(ids.dtype)], dim=1).cpu())
        if len(first) == ids.shape[0]:
            return self._hidden(ids, attn)
        out = self._hidden(ids[first], attn[first])
        return out[torch.tensor(inverse, device=out.device)]

    def computed_rows(self, batch: StepBatch) -> list[int]:
        """The rows of a denoising batch whose forward this backbone computes: the first of
        each canvas (`hidden` shares it with the rest; a canvas as the step reads it, its
        held tokens placed), every row with the fast cache on."""
        if self.fast_cache is not None:
            return list(range(len(batch.tokens)))
        return distinct_rows(self.placed(batch))[0]

    def _hidden(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # a batch without padding goes without a mask: the same attention, and SDPA takes its
        # unmasked kernel (about 6% of the demo's forward on the CPU; FlashAttention on a GPU)
        padded = not bool(attn.all())
        ids, attn = ids.to(self.device), attn.to(self.device)
        if self.config.attention == "packed":
            out = packed_hidden(self.transformer, ids, attn, self.pad_id)
        else:
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            out = self.transformer.model(
                input_ids=ids,
                attention_mask=attn if padded else None,
                position_ids=positions,
                use_cache=False,  # a denoising forward keeps no keys and values
            ).last_hidden_state
        if self.shift:
            out = torch.cat([out[:, :1], out[:, :-1]], dim=1)
        return out

    def computed_tokens(self, widths: Sequence[int]) -> int:
        """Tokens the denoising forward computes over rows of these widths: rows × the widest
        padded, the rows' own (to a whole block) packed."""
        if self.config.attention == "packed":
            return packed_length(widths)
        return len(widths) * max(widths, default=0)

    def forward_extra_bytes(self, tokens: int) -> int:
        """Memory a denoising forward over at most `tokens` (rows × width) needs beyond its
        activations: packed, the document mask and FlexAttention's statistics; padded, none."""
        if self.config.attention == "packed":
            heads = int(self.transformer.config.num_attention_heads)
            return packed_forward_bytes(tokens, heads)
        return 0

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the given hidden states. Samplers apply it to masked positions only,
        which saves the [B, L, V] logits tensor of a full forward."""
        return self.transformer.lm_head(hidden)

    def read_states(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, L, H] of a padded batch that `logits` applies the head to: a
        scorer that reads a few positions, or a few rows of the head, reads these."""
        return self.hidden(ids, attn)

    def logits(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, V] as the sampler reads them (shifted for Dream)."""
        return self.head(self.read_states(ids, attn))

    @staticmethod
    def noise(batch: StepBatch, offsets: list[int], width: int, purpose: str) -> torch.Tensor:
        """[B, L] float64 uniforms for one purpose, each row's drawn at its own length from
        (key, step, purpose); padding columns hold 0.5."""
        out = torch.full((len(offsets), width), 0.5, dtype=torch.float64)
        for i, (key, step, off) in enumerate(zip(batch.keys, batch.steps, offsets, strict=True)):
            gen = purpose_generator(key, step, purpose)
            out[i, off:] = torch.rand(width - off, generator=gen, dtype=torch.float64)
        return out

    def eligible(
        self, ids: torch.Tensor, offsets: Sequence[int], batch: StepBatch
    ) -> tuple[torch.Tensor, list[BlockStep]]:
        """[B, L] mask of the positions each padded row may commit at its step (masked, and not
        right of its current block), and where each row's block schedule stands."""
        width = ids.shape[1]
        masked = ids == self.mask_id
        positions = torch.arange(width, device=ids.device)
        eligible = torch.zeros_like(masked)
        at = []
        for i, (off, plen, step) in enumerate(
            zip(offsets, batch.prompt_lens, batch.steps, strict=True)
        ):
            block = self.row_config(batch.setting(i)).block_length
            at.append(block_step(width - off - plen, block, batch.total(i), step))
            eligible[i] = masked[i] & (positions < off + plen + at[-1].end)
        return eligible, at

    def predicted(
        self, ids: torch.Tensor, eligible: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:
        """[B, L] mask of the positions whose token a step draws only for the row's prediction
        (`ReportsPredictions`): in a row that asks (`StepBatch.predict`), every masked
        position the step may not commit (right of its current block); none in the others."""
        asks = torch.tensor(
            [batch.predicts(i) for i in range(ids.shape[0])], dtype=torch.bool, device=ids.device
        )
        return (ids == self.mask_id) & ~eligible.to(ids.device) & asks[:, None]

    # -- Prophet's held tokens and answer region (docs/backbones.md) ------------------------
    def held(self, config: Any) -> dict[int, int]:
        """The tokens a row's `constraints` hold, by generated position: each word tokenized
        with a leading space (the reference's `_parse_constraints`), its tokens from its
        position on; a later word's tokens replace an earlier one's."""
        text = getattr(config, "constraints", "")
        if not text:
            return {}
        cache = self.__dict__.setdefault("_held", {})
        if text not in cache:
            out: dict[int, int] = {}
            for where, word in parse_constraints(text):
                ids = self.tokenizer.encode(" " + word, add_special_tokens=False)
                for k, token in enumerate(ids):
                    out[where + k] = int(token)
            cache[text] = out
        return cache[text]

    def answer_region(self, config: Any, gen_length: int) -> list[int]:
        """The generated positions whose mean top-2 logit gap Prophet's rule reads:
        `answer_length` of them from `answer_at`, by default 2 after the last held token (the
        reference's max(constraint position) + 2); those past the canvas are dropped."""
        start = config.answer_at
        if start is None:
            held = self.held(config)
            if not held:
                return []
            start = max(held) + 2
        return list(range(start, min(gen_length, start + config.answer_length)))

    def placed(self, batch: StepBatch) -> list[torch.Tensor]:
        """The batch's rows as a step reads them: a row's held tokens (`constraints`) written
        at its masked positions they hold (all of them before its first step, and any
        re-masked since), as the reference writes them before decoding and after every
        step. Rows that hold none come back as they are."""
        rows = list(batch.tokens)
        for i, row in enumerate(rows):
            held = self.held(self.row_config(batch.setting(i)))
            if not held:
                continue
            plen = batch.prompt_lens[i]
            where = [p for p in held if p < len(row) - plen]
            if not where:
                continue
            at = torch.tensor([plen + p for p in where], device=row.device)
            tokens = torch.tensor([held[p] for p in where], dtype=row.dtype, device=row.device)
            row = row.clone()
            masked = row[at] == self.mask_id
            row[at[masked]] = tokens[masked]
            rows[i] = row
        return rows

    def beside(
        self, ids: torch.Tensor, offsets: Sequence[int], eligible: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:
        """[B, L] mask of the positions whose logits a step computes beyond those it may commit:
        a prediction's (`predicted`) and, in a row under Prophet's rule, every other masked
        position (what its exit commits) and its answer region (whose gap it reads)."""
        eligible = eligible.to(ids.device)
        extra = self.predicted(ids, eligible, batch)
        width = ids.shape[1]
        for i, (off, plen) in enumerate(zip(offsets, batch.prompt_lens, strict=True)):
            config = self.row_config(batch.setting(i))
            if not getattr(config, "prophet", False):
                continue
            region = torch.zeros(width, dtype=torch.bool, device=ids.device)
            at = [off + plen + p for p in self.answer_region(config, width - off - plen)]
            region[at] = True
            extra[i] |= ((ids[i] == self.mask_id) | region) & ~eligible[i]
        return extra

    def step_hidden(
        self, ids: torch.Tensor, attn: torch.Tensor, offsets: list[int], batch: StepBatch
    ) -> torch.Tensor:
        """The hidden states a denoising step reads (`hidden`), or under Fast-dLLM's cache
        those its cached forwards compute (fastcache.py)."""
        if self.fast_cache is None:
            return self.hidden(ids, attn)
        return self.fast_cache.hidden(ids, attn, offsets, batch)

    def step_work(self, batch: StepBatch) -> list[Work]:
        """What each row's denoising forward computes (`CountsStepWork`): bidirectional
        attention over the row's own tokens, padded or packed, and the LM head at the positions
        it may commit, and in a row that asks for its prediction also at every other masked
        position (`predicted`), in a row under Prophet's rule also there and at its answer
        region (`beside`); under Fast-dLLM's cache, fastcache.py's charge. Guidance's second
        pass is the caller's to count (`passes_per_step`)."""
        if self.fast_cache is not None:
            return self.fast_cache.step_work(batch)
        ids, _, offsets = self.pad(self.placed(batch))
        eligible = self.eligible(ids, offsets, batch)[0]
        heads = (eligible | self.beside(ids, offsets, eligible, batch)).sum(-1).tolist()
        return [Work.full(len(t), head=h) for t, h in zip(batch.tokens, heads, strict=True)]

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        return [tokens for tokens, _ in self.denoise_step_with_confidence(batch)]

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each row after one step, with the float32 confidence of every token it committed
        (NaN at the positions it left as they were)."""
        return [(new, conf) for new, conf, _ in self.denoise_step_with_predictions(batch)]

    def denoise_step_with_predictions(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Each row after one step, the float32 confidence of every token it committed, and
        for a row that asks (`StepBatch.predict`) its prediction (`ReportsPredictions`): the
        token the step drew at every masked position, the row's other tokens as they were;
        None for the others."""
        if any(batch.predict) and not self.predicts:
            why = (
                "Fast-dLLM's cache computes only some positions at a step; use cache=none"
                if self.fast_cache is not None
                else "use dream, llada or tiny"
            )
            raise UserError(
                f"{self.shown_as or self.arch} reports no prediction of the whole canvas at a "
                f"step; {why}"
            )
        ids, attn, offsets = self.pad(self.placed(batch))
        new, confidence, proposal = self.commit(ids, attn, offsets, batch)
        confidence = confidence.float().cpu()
        return [
            (
                new[i, off:].cpu(),
                confidence[i, off:],
                proposal[i, off:].cpu() if batch.predicts(i) else None,
            )
            for i, off in enumerate(offsets)
        ]

    @abc.abstractmethod
    def commit(
        self, ids: torch.Tensor, attn: torch.Tensor, offsets: list[int], batch: StepBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The padded ids after one denoising step of every row, the [B, L] float64
        confidence of each committed token (NaN where nothing was committed), and the step's
        proposal: the ids with the token drawn (x0) at every position whose logits the step
        computed, the positions it may commit (`eligible`) and, in a row that asks for its
        prediction, every other masked one (`predicted`)."""
