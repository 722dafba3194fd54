"""Small deterministic plugins for exercising the engine without a model.

`toy` backbone: a character-level "model" that knows the answer to `a+b=` questions and
commits each generated position to the right character with probability `p_correct`, its
noise drawn from the row's key and step only. `toy_sum` task: such questions. `toy` scorer:
rates how many committed characters are right, plus noise keyed by the canvas. They follow
the real interfaces exactly, so the contract checks and engine tests run on them in
milliseconds. Register them with DLLMBENCH_PLUGIN_MODULES=dllmbench.testing.doubles.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import ScoreBatch, StepBatch
from dllmbench.core.errors import UserError
from dllmbench.core.flops import ModelShape
from dllmbench.core.keys import torch_generator
from dllmbench.core.types import Problem, Prompt

ALPHABET = "0123456789+=? abcdefghijklmnopqrstuvwxyz:\n"
EOS = len(ALPHABET)
MASK = EOS + 1
PREDICT_SALT = 0x5EED_0F_7E4D  # a row's prediction noise: its key salted, apart from the step's


def encode_text(text: str) -> list[int]:
    return [ALPHABET.index(ch) for ch in text.lower() if ch in ALPHABET]


def intended(prompt_ids: Sequence[int], gen_length: int) -> list[int]:
    """What the toy model means to write after a prompt ending in `a+b=`: the sum, then EOS."""
    return list(_intended(tuple(prompt_ids), gen_length))


def _float32(x: float) -> float:
    """`x` rounded to the nearest float32."""
    return struct.unpack("f", struct.pack("f", x))[0]


@functools.lru_cache(maxsize=4096)
def _intended(prompt_ids: tuple[int, ...], gen_length: int) -> tuple[int, ...]:
    """`intended`, once per prompt: every row-step of a problem asks it again."""
    text = "".join(ALPHABET[i] for i in prompt_ids)
    question = text.rstrip().rsplit("\n", 1)[-1].rstrip("=").split(":")[-1].strip()
    try:
        a, b = (int(x) for x in question.split("+"))
        answer = str(a + b)
    except ValueError:
        answer = ""
    return tuple((encode_text(answer) + [EOS] * gen_length)[:gen_length])


@dataclass(frozen=True)
class ToyBackboneConfig:
    p_correct: float = 0.85  # probability a committed position is the intended character
    # draw every row's noise from one fixed key, as a sampler at temperature 0 would: copies
    # with different keys come out identical (the harness refuses multi-candidate methods)
    deterministic: bool = False
    # commit evenly over all T steps (after step t, ⌊gen·(T−t−1)/T⌋ positions stay masked)
    # rather than ⌈masked / steps left⌉ per step, which fills a short canvas in its first
    # steps; the contract kit spreads, so every segment of a long run changes something
    spread: bool = False
    # sampler settings a row may set (`StepBatch.settings`): a temperature scales how often
    # a committed position is wrong (p_correct ** temperature); a block length commits
    # blocks left to right (the last may be shorter), T spread evenly over them
    temperature: float = 1.0
    block_length: int | None = None
    # confidence-threshold decoding: beyond its quota a step also commits each other masked
    # position of the block whose keyed confidence is at least this (rightly); a row whose
    # canvas fills ends before its T
    threshold: float | None = None
    factor: float | None = None  # the toy reads it as the threshold 1 − factor/2
    entropy_bound: float | None = None  # ... and this as the threshold 1 / (1 + entropy_bound)
    # Prophet's early exit, the toy's way: after a step, the "gap" is 10 × the share of the
    # answer region (`answer_length` positions from `answer_at`, default 2 after the last
    # held token) that holds the intended characters; at or above its phase's bar every
    # masked position takes the intended character and the row ends. `constraints`
    # ("1:1|2:+") are characters held from the start (each word with a leading space)
    prophet: bool = False
    answer_at: int | None = None
    answer_length: int = 5
    early_gap: float = 7.5
    mid_gap: float = 5.0
    late_gap: float = 2.5
    constraints: str = ""


# a nominal shape, so that the FLOP ledger runs on the toys as on a transformer: a forward
# of a row of L tokens costs 2·1000·L + 4·2·16·L² (+ 2·100 per head position)
TOY_SHAPE = ModelShape(params=1000, head=100, layers=2, width=16)


class ToyBackbone:
    """Commits ⌈masked / steps left⌉ positions per step (or evenly over T with `spread`),
    chosen and filled by keyed noise."""

    Config = ToyBackboneConfig
    mask_id = MASK
    model_shape = TOY_SHAPE
    row_settings = frozenset(
        {"temperature", "block_length", "threshold", "factor", "entropy_bound", "steps"}
        | {"prophet", "answer_at", "answer_length", "early_gap", "mid_gap", "late_gap"}
        | {"constraints"}
    )
    # reports each step's predictions (`ReportsPredictions`); its forward (`Work.full`) is
    # charged the head at every position, so a prediction costs nothing more
    predicts = True

    def __init__(self, **config):
        self.config = ToyBackboneConfig(**config)
        self._configs: dict[tuple, ToyBackboneConfig] = {}  # by a row's settings

    def encode(self, prompt: Prompt) -> list[int]:
        text = (
            prompt.text
            if prompt.text is not None
            else "\n".join(m["content"] for m in prompt.messages)
        )
        return encode_text(text)

    def canvas(self, prompt_ids: Sequence[int], gen_length: int) -> torch.Tensor:
        return torch.tensor(list(prompt_ids) + [MASK] * gen_length, dtype=torch.long)

    def check_row_settings(self, settings, gen_length: int, total_steps: int) -> None:
        try:
            dataclasses.replace(self.config, **settings)
        except TypeError as exc:
            raise UserError(f"toy: {exc}") from None

    def finishes_early(self, settings) -> bool:
        c = self._with(settings)
        return self._bar(c) is not None or c.prophet

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def _held(text: str) -> dict[int, int]:
        """The characters `constraints` hold, by generated position."""
        out: dict[int, int] = {}
        for part in filter(None, (p.strip() for p in text.split("|"))):
            where, _, word = part.partition(":")
            for k, token in enumerate(encode_text(" " + word.strip())):
                out[int(where) + k] = token
        return out

    def _region(self, c: ToyBackboneConfig, width: int) -> list[int]:
        start = c.answer_at
        if start is None:
            held = self._held(c.constraints)
            start = max(held) + 2 if held else width
        return list(range(start, min(width, start + c.answer_length)))

    @staticmethod
    def _bar(c: ToyBackboneConfig) -> float | None:
        """The confidence a row's parallel decoding rule commits at, if it has one."""
        if c.factor is not None:
            return 1 - c.factor / 2
        if c.entropy_bound is not None:
            return 1 / (1 + c.entropy_bound)
        return c.threshold

    def _with(self, settings) -> ToyBackboneConfig:
        """The config a row's settings make (made once per distinct settings)."""
        if not settings:
            return self.config
        try:
            key = tuple(sorted(settings.items()))
            hash(key)
        except TypeError:  # an unhashable value: made each time
            return dataclasses.replace(self.config, **settings)
        if key not in self._configs:
            self._configs[key] = dataclasses.replace(self.config, **settings)
        return self._configs[key]

    def denoise_step(self, batch: StepBatch) -> list[torch.Tensor]:
        return [tokens for tokens, _ in self.denoise_step_with_confidence(batch)]

    def denoise_step_with_confidence(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each row after one step, with a keyed confidence in (0, 1) for every position it
        committed (a right character's is higher), NaN elsewhere."""
        out = []
        for i, (tokens, plen, step, key) in enumerate(
            zip(batch.tokens, batch.prompt_lens, batch.steps, batch.keys, strict=True)
        ):
            c = self._with(batch.setting(i))
            ids = tokens.tolist()  # the row as Python ints: no tensor op per position
            total, width = batch.total(i), len(ids) - plen
            for p, token in self._held(c.constraints).items() if c.constraints else ():
                if p < width and ids[plen + p] == MASK:
                    ids[plen + p] = token
            block = min(c.block_length or width, width)
            blocks = -(-width // block)  # the last may be shorter; T spread over them
            b = blocks - 1 if step == total - 1 else step * blocks // total
            first, after = -(-b * total // blocks), -(-(b + 1) * total // blocks)
            gen = torch_generator(0 if c.deterministic else key, step)
            masked = [
                n for n in range(plen, min(plen + (b + 1) * block, len(ids))) if ids[n] == MASK
            ]
            left, total = max(1, after - step), max(1, after - first)
            if self.config.spread:
                keep = block * (left - 1) // total
                quota = max(0, len(masked) - keep)
            else:
                quota = math.ceil(len(masked) / left)
            order = torch.randperm(len(masked), generator=gen)[:quota].tolist()
            chosen = [masked[n] for n in order]
            target = _intended(tuple(ids[:plen]), width)
            # compared as torch compares a float32 tensor with a Python float: at float32
            bar_right = _float32(c.p_correct**c.temperature)
            right = [u < bar_right for u in torch.rand(len(chosen), generator=gen).tolist()]
            wrong = torch.randint(0, 10, (len(chosen),), generator=gen).tolist()
            confidence = [math.nan] * len(ids)
            drawn = torch.rand(len(chosen), generator=gen).tolist()
            for pos, ok, alt, u in zip(chosen, right, wrong, drawn, strict=True):
                ids[pos] = target[pos - plen] if ok else alt
                confidence[pos] = (1 + u) / 2 if ok else u / 2
            bar = self._bar(c)
            if bar is not None:  # drawn after the rest: the quota's draws stay as they were
                taken = set(chosen)
                rest = [pos for pos in masked if pos not in taken]
                sure = torch.rand(len(rest), generator=gen).tolist()
                for pos, u in zip(rest, sure, strict=True):
                    if u >= bar:
                        ids[pos], confidence[pos] = target[pos - plen], u
            if c.prophet and self._exits(c, ids, plen, target, step, batch.total(i)):
                for pos in range(plen, len(ids)):
                    if ids[pos] == MASK:
                        ids[pos], confidence[pos] = target[pos - plen], 1.0
            # through an array: a tensor from a buffer is made faster than from a list
            tokens = torch.frombuffer(array("q", ids), dtype=torch.int64).to(tokens.dtype)
            confidence = torch.frombuffer(array("f", confidence), dtype=torch.float32)
            out.append((tokens, confidence))
        return out

    def _exits(self, c, ids: list[int], plen: int, target, step: int, total: int) -> bool:
        """The toy's Prophet rule after a step (its row's T is `total`)."""
        region = self._region(c, len(ids) - plen)
        if not region:
            return False
        right = sum(ids[plen + p] == target[p] for p in region) / len(region)
        progress = (step + 1) / total
        bar = c.early_gap if progress < 0.33 else c.mid_gap if progress < 0.67 else c.late_gap
        return 10 * right >= bar

    def denoise_step_with_predictions(
        self, batch: StepBatch
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """`denoise_step_with_confidence`, and for a row that asks (`StepBatch.predict`) its
        prediction: the row after the step with every position still masked drawn as a
        committed one is (the intended character with probability p_correct, else a digit),
        from noise of its own, so the step itself draws what it draws without it."""
        out = []
        for i, (tokens, confidence) in enumerate(self.denoise_step_with_confidence(batch)):
            if not batch.predicts(i):
                out.append((tokens, confidence, None))
                continue
            c = self._with(batch.setting(i))
            plen, key = batch.prompt_lens[i], batch.keys[i]
            gen = torch_generator((0 if c.deterministic else key) ^ PREDICT_SALT, batch.steps[i])
            ids = tokens.tolist()
            target = _intended(tuple(ids[:plen]), len(ids) - plen)
            masked = [n for n in range(plen, len(ids)) if ids[n] == MASK]
            bar_right = _float32(c.p_correct**c.temperature)
            right = torch.rand(len(masked), generator=gen).tolist()
            wrong = torch.randint(0, 10, (len(masked),), generator=gen).tolist()
            for pos, u, alt in zip(masked, right, wrong, strict=True):
                ids[pos] = target[pos - plen] if u < bar_right else alt
            prediction = torch.frombuffer(array("q", ids), dtype=torch.int64).to(tokens.dtype)
            out.append((tokens, confidence, prediction))
        return out

    def decode(self, tokens: torch.Tensor, prompt_len: int) -> str:
        chars = []
        for t in tokens[prompt_len:].tolist():
            if t == EOS:
                break
            if t != MASK:
                chars.append(ALPHABET[t])
        return "".join(chars)


@dataclass(frozen=True)
class ToyScorerConfig:
    noise: float = 1.0  # standard deviation of the keyed noise added to the logit
    partial: bool = True  # reads partial states (a PRM) or final ones only (an ORM)


class ToyScorer:
    """Logit ≈ 6·(share of committed characters that are right − ½) + keyed noise."""

    Config = ToyScorerConfig
    model_shape = TOY_SHAPE

    def __init__(self, backbone: ToyBackbone | None = None, **config):
        self.backbone = backbone  # shared with the generator when the run provides it
        self.config = ToyScorerConfig(**config)
        self.reads_partial = self.config.partial

    def score(self, batch: ScoreBatch) -> np.ndarray:
        values = []
        for tokens, plen in zip(batch.tokens, batch.prompt_lens, strict=True):
            target = torch.tensor(intended(tokens[:plen].tolist(), len(tokens) - plen))
            gen = tokens[plen:]
            committed = gen != MASK
            share = (
                float((gen[committed] == target[committed]).float().mean())
                if committed.any()
                else 0.5
            )
            digest = hashlib.blake2b(tokens.numpy().tobytes(), digest_size=8).digest()
            noise = np.random.default_rng(int.from_bytes(digest, "little")).normal()
            values.append(6.0 * (share - 0.5) + self.config.noise * noise)
        return np.asarray(values)


@dataclass(frozen=True)
class ToySumConfig:
    size: int = 40  # problems in the test split (train has 5×)
    max_operand: int = 60


class ToySum:
    """`a+b=` questions; the answer is the first number in the text."""

    Config = ToySumConfig

    def __init__(self, **config):
        self.config = ToySumConfig(**config)

    def splits(self) -> dict[str, int]:
        return {"train": 5 * self.config.size, "test": self.config.size}

    def problems(self, split: str) -> list[Problem]:
        if split not in self.splits():
            raise ValueError(f"toy_sum has no split {split!r}; splits: train, test")
        rng = random.Random(f"toy_sum:{split}")
        out = []
        for i in range(self.splits()[split]):
            a, b = rng.randint(0, self.config.max_operand), rng.randint(0, self.config.max_operand)
            out.append(Problem(f"{split}-{i}", f"{a}+{b}=", a + b))
        return out

    def prompt(self, problem: Problem, style: str) -> Prompt:
        if style == "chat":
            return Prompt(messages=({"role": "user", "content": problem.question},))
        return Prompt(text=f"question: {problem.question}")

    def extract(self, text: str) -> str | None:
        digits = ""
        for ch in text:
            if ch.isdigit():
                digits += ch
            elif digits:
                break
        return digits or None

    def answer_key(self, answer: str) -> int:
        return int(answer)

    def grade(self, problem: Problem, answer: str | None, text: str) -> bool:
        return answer is not None and int(answer) == problem.gold

    def data_files(self) -> dict[str, str]:
        return {}


@hookimpl
def dllmbench_register_backbones(register):
    register("toy", ToyBackbone)


@hookimpl
def dllmbench_register_scorers(register):
    register("toy", ToyScorer)


@hookimpl
def dllmbench_register_tasks(register):
    register("toy_sum", ToySum)
