"""PRM and ORM scorers: LoRA on the frozen backbone, a pooled readout and a small head.

PRM ("cross-mask"): hidden states of the last layer pooled over the generated region
(mask-aware mean, excluding MASK tokens and everything from the first end token; or the last
such token; `pool_stop` says which tokens end it: "turn", EOS or a turn-end token such as
`<|im_end|>`, or "eos", the first EOS only, as the paper's PRM), concatenated with a 256-d
sinusoidal embedding of the mask ratio through Linear(256, 256) + GELU, then Linear(·, 1024)
→ GELU → Linear(1024, 1). It reads partial states. ORM: the same LoRA and mean pool (and the
same `pool_stop`), no step embedding, a linear head; final states only. Attention is
bidirectional or causal: the same model with the causal mask on or off.

The scorer shares the backbone's transformer: its adapter is injected under its own name and
switched on only while it scores. A checkpoint is a directory holding adapter.safetensors,
head.safetensors and config.json; it loads strictly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import ScoreBatch, TransformerBackbone, model_shape
from dllmbench.core.errors import PluginError, UserError
from dllmbench.core.flops import ModelShape, Work
from dllmbench.core.jsonfile import read_object
from dllmbench.core.tensorfile import save_tensors
from dllmbench.plugins.scorers.adapters import (
    active,
    adapter_names,
    adapter_parameters,
    inject,
)
from dllmbench.plugins.scorers.batching import by_width, pad_id_of, pad_to
from dllmbench.plugins.scorers.heads import ORMHead, PRMHead, pool, region

FILES = ("config.json", "adapter.safetensors", "head.safetensors")  # of a checkpoint

FORMAT = 1

Attention = Literal["bidirectional", "causal"]
Pooling = Literal["mean", "last"]
# which tokens end the pooled region: EOS or a turn-end token ("turn"), or the first EOS only
PoolStop = Literal["turn", "eos"]


@dataclass(frozen=True)
class RewardConfig:
    checkpoint: str | None = None  # a trained scorer directory; none: fresh, for training
    attention: Attention | None = None  # "bidirectional" (default) or "causal"
    pooling: Pooling | None = None  # "mean" (default) or "last"
    pool_stop: PoolStop | None = None  # "turn" (default) or "eos"
    mask_aware: bool | None = None  # leave MASK tokens out of the pool (default true)
    step_embedding: bool | None = None  # mask-ratio embedding (default: PRM yes, ORM no)
    lora_r: int | None = None  # default 16
    lora_alpha: int | None = None  # default 32
    lora_dropout: float | None = None  # default 0.05
    target_modules: str | None = None  # "q_proj,v_proj" (default) or "q_proj+v_proj" in options
    head_width: int | None = None  # PRM MLP width; default 1024
    seed: int = 0  # initialisation of a fresh adapter and head

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        values = asdict(self)
        for key, choices in CHOICES.items():
            asked = values[key]
            if asked is not None and asked not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)}, got {asked!r}")
        for key, (ok, want) in BOUNDS.items():
            asked = values[key]
            if asked is not None and not (isinstance(asked, (int, float)) and ok(asked)):
                raise ValueError(f"{key} must be {want} (default {DEFAULTS[key]}), got {asked!r}")
        if self.target_modules is not None and not all(
            self.target_modules.replace("+", ",").split(",")
        ):
            raise ValueError(
                f"target_modules must name modules, e.g. q_proj+v_proj, got {self.target_modules!r}"
            )
        if self.checkpoint is not None:  # a broken checkpoint is found before any model loads
            saved = read_checkpoint(Path(self.checkpoint), self.kind)
            for key in SETTINGS:  # and an option contradicting it (`--preset paper`'s pool_stop)
                asked = values[key]
                if asked is not None and asked != saved[key]:
                    raise UserError(
                        f"{self.checkpoint} was trained with {key}={saved[key]!r}, not {asked!r}"
                    )

    @property
    def trained(self) -> bool:
        return self.checkpoint is not None


@dataclass(frozen=True)
class PRMConfig(RewardConfig):
    kind: ClassVar[str] = "prm"


@dataclass(frozen=True)
class ORMConfig(RewardConfig):
    kind: ClassVar[str] = "orm"


DEFAULTS = {
    "attention": "bidirectional",
    "pooling": "mean",
    "pool_stop": "turn",
    "mask_aware": True,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": "q_proj,v_proj",
    "head_width": 1024,
}
CHOICES = {
    "attention": get_args(Attention),
    "pooling": get_args(Pooling),
    "pool_stop": get_args(PoolStop),
}
# numbers a fresh adapter and head can be built with, and what they must be
BOUNDS: dict[str, tuple[Callable[[float], bool], str]] = {
    "lora_r": (lambda x: math.isfinite(x) and x >= 1 and x == int(x), "a whole number >= 1"),
    "lora_alpha": (lambda x: math.isfinite(x) and x > 0, "a number > 0"),
    "lora_dropout": (lambda x: 0 <= x < 1, "a number in [0, 1)"),
    "head_width": (lambda x: math.isfinite(x) and x >= 1 and x == int(x), "a whole number >= 1"),
}
SETTINGS = (*DEFAULTS, "step_embedding")
# settings added after checkpoints were made: a checkpoint without one was trained with this
LATER = {"pool_stop": "turn"}
WEIGHTS = ("adapter", "head")  # <name>.safetensors of a checkpoint


def _broken(file: Path, exc: Exception) -> UserError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return UserError(
        f"{file} is not a readable safetensors file ({reason}); restore it or make the "
        "checkpoint again with dllmbench train-scorer"
    )


def read_checkpoint(path: Path, kind: str) -> dict[str, Any]:
    """A scorer checkpoint's config.json, checked without loading a model: it parses, has
    every setting, is of `kind`, and the weight files have readable safetensors headers."""
    if not path.is_dir():
        raise UserError(
            f"scorer checkpoint directory {str(path)!r} does not exist; give checkpoint=DIR "
            "made by dllmbench train-scorer"
        )
    file = path / "config.json"
    if not file.is_file():
        inside = [d for d in ("best", "latest") if (path / d / "config.json").is_file()]
        hint = (
            f"; it is a train-scorer output: give checkpoint={path / inside[0]}" if inside else ""
        )
        raise UserError(f"scorer checkpoint {str(path)!r} has no config.json{hint}")
    saved = {**LATER, **read_object(file, "restore it")}
    missing = [k for k in ("kind", "base", *SETTINGS) if k not in saved]
    if missing:
        raise UserError(
            f"{file} lacks {', '.join(missing)}; not a scorer checkpoint of dllmbench train-scorer"
        )
    if kind and saved["kind"] != kind:
        raise UserError(
            f"{path} is a {saved['kind']!r} checkpoint, not a {kind!r} one; "
            f"give checkpoint=DIR of a {kind}"
        )
    for name in WEIGHTS:
        weights = path / f"{name}.safetensors"
        if not weights.is_file():
            raise UserError(f"{path} has no {weights.name}")
        try:
            with safe_open(str(weights), "pt"):  # reads the header only
                pass
        except Exception as exc:  # SafetensorError, HeaderTooLarge, …
            raise _broken(weights, exc) from None
    return saved


def base_model_digest(net: torch.nn.Module) -> str:
    """Identity of a base model: its architecture and the signs of the first rows of its
    embedding. Rounding keeps a value's sign (to bfloat16 or float16, to a subnormal, to a
    signed zero), so the identity is the same in every dtype and on every device; another
    model's signs differ (thousands of them)."""
    c = net.config
    h = hashlib.sha256()
    h.update(
        json.dumps([type(net).__name__, c.hidden_size, c.num_hidden_layers, c.vocab_size]).encode()
    )
    rows = net.get_input_embeddings().weight[:8].detach()
    h.update(np.packbits(torch.signbit(rows).cpu().numpy()).tobytes())
    return h.hexdigest()[:16]


class RewardScorer:
    """Base of the PRM and ORM scorers."""

    Config = RewardConfig
    contract_backbone: ClassVar[tuple[str, dict]] = ("dream", {"model": "random"})
    contract_configs: ClassVar[list[dict]] = [{}, {"attention": "causal", "pooling": "last"}]
    kind: ClassVar[str]
    reads_partial: ClassVar[bool]

    def __init__(self, backbone: object = None, **config: Any):
        self.config = self.Config(**config)
        if not isinstance(backbone, TransformerBackbone):
            raise PluginError(
                f"scorer {self.kind!r} needs a backbone implementing "
                "dllmbench.interfaces.TransformerBackbone (dream, llada), not "
                f"{type(backbone).__name__ if backbone is not None else 'none'}"
            )
        self.backbone: TransformerBackbone = backbone
        self.net = backbone.transformer
        saved = self._read_checkpoint_config()
        self.settings = self._resolve(saved)
        s = self.settings
        self.adapter = f"{self.kind}{len(adapter_names(self.net))}"
        inject(
            self.net,
            self.adapter,
            r=s["lora_r"],
            alpha=s["lora_alpha"],
            dropout=s["lora_dropout"],
            targets=tuple(s["target_modules"].replace("+", ",").split(",")),
            seed=self.config.seed,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            hidden = self.net.config.hidden_size
            self.head = (
                PRMHead(hidden, s["head_width"], s["step_embedding"])
                if self.kind == "prm"
                else ORMHead(hidden)
            )
        self.head.to(backbone.device).eval()
        self.trained = saved is not None
        if saved is not None:
            self._load_weights(Path(self.config.checkpoint), saved)

    def weight_files(self) -> dict[str, list[Path]]:
        """Config field → the checkpoint files it located (the manifest records their hashes)."""
        if not self.trained:
            return {}
        path = Path(self.config.checkpoint)
        return {"checkpoint": [path / f for f in FILES]}

    # -- configuration ------------------------------------------------------------------------
    def _read_checkpoint_config(self) -> dict[str, Any] | None:
        if self.config.checkpoint is None:
            return None
        saved = read_checkpoint(Path(self.config.checkpoint), self.kind)
        if saved.get("base") != base_model_digest(self.net):
            raise UserError(
                f"{self.config.checkpoint} was trained on another base model "
                f"(fingerprint {saved.get('base')}, this backbone's is "
                f"{base_model_digest(self.net)})"
            )
        return saved

    def _resolve(self, saved: dict[str, Any] | None) -> dict[str, Any]:
        defaults = {**DEFAULTS, "step_embedding": self.kind == "prm"}
        settings = {k: (saved or defaults)[k] for k in SETTINGS}
        values = asdict(self.config)
        for key in SETTINGS:
            asked = values[key]
            if asked is None:
                continue
            if key in CHOICES and asked not in CHOICES[key]:
                raise UserError(f"{key} must be one of {', '.join(CHOICES[key])}, got {asked!r}")
            if saved is not None and asked != saved[key]:
                raise UserError(
                    f"{self.config.checkpoint} was trained with {key}={saved[key]!r}, not {asked!r}"
                )
            settings[key] = asked
        return settings

    # -- weights ------------------------------------------------------------------------------
    def trainable(self) -> list[torch.nn.Parameter]:
        return [*adapter_parameters(self.net, self.adapter).values(), *self.head.parameters()]

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        adapter = {
            k: v.detach().cpu().contiguous()
            for k, v in adapter_parameters(self.net, self.adapter).items()
        }
        head = {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}
        return adapter, head

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        adapter, head = self.state()
        save_tensors(adapter, path / "adapter.safetensors")
        save_tensors(head, path / "head.safetensors")
        config = {
            "format": FORMAT,
            "kind": self.kind,
            "base": base_model_digest(self.net),
            **self.settings,
            **(extra or {}),
        }
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def train_mode(self, flag: bool) -> None:
        """LoRA dropout and head in training mode (the frozen base has no dropout), and this
        scorer's adapter trainable or not; the base and other adapters stay frozen."""
        self.net.train(flag)
        self.head.train(flag)
        for param in adapter_parameters(self.net, self.adapter).values():
            param.requires_grad_(flag)

    def load_weights(self, path: str | Path) -> None:
        """Adapter and head weights of a checkpoint directory (same settings), strictly."""
        self._load_weights(Path(path), read_checkpoint(Path(path), self.kind))

    def _load_weights(self, path: Path, saved: dict[str, Any]) -> None:
        states = (adapter_parameters(self.net, self.adapter), self.head.state_dict())
        for name, module_state in zip(WEIGHTS, states, strict=True):
            file = path / f"{name}.safetensors"
            if not file.exists():
                raise UserError(f"{path} has no {file.name}")
            try:
                tensors = load_file(str(file))
            except Exception as exc:  # a file damaged past its header
                raise _broken(file, exc) from None
            missing = sorted(set(module_state) - set(tensors))
            unexpected = sorted(set(tensors) - set(module_state))
            if missing or unexpected:
                raise UserError(
                    f"{file} does not fit this {self.kind}: missing {missing[:4]}, "
                    f"unexpected {unexpected[:4]}"
                )
            for key, value in tensors.items():
                if module_state[key].shape != value.shape:
                    raise UserError(
                        f"{file}: {key} has shape {tuple(value.shape)}, the model "
                        f"expects {tuple(module_state[key].shape)}"
                    )
                with torch.no_grad():
                    module_state[key].copy_(value)

    # -- scoring ------------------------------------------------------------------------------
    def logits(
        self, tokens: list[torch.Tensor], prompt_lens: list[int], width: int | None = None
    ) -> torch.Tensor:
        """One logit per row; differentiable in the adapter and head. With `width`, the rows
        are padded to that width (`batching.pad_to`)."""
        bb = self.backbone
        if width is None:
            ids, attn, offsets = bb.pad(tokens)
        else:
            ids, attn, offsets = pad_to(bb, tokens, width, pad_id_of(bb))
        ids, attn = ids.to(bb.device), attn.to(bb.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        causal = self.settings["attention"] == "causal"
        with active(self.net, self.adapter):
            hidden = self.net.base_model(
                input_ids=ids,
                attention_mask=attn,
                position_ids=positions,
                is_causal=causal,
                use_cache=False,
            ).last_hidden_state.float()
        start = torch.tensor(
            [o + p for o, p in zip(offsets, prompt_lens, strict=True)], device=ids.device
        )
        inside, ratio = region(ids, start, bb.mask_id, self.stop_ids(), self.settings["mask_aware"])
        pooled = pool(hidden, inside, start - 1, self.settings["pooling"])
        return self.head(pooled, ratio)

    def stop_ids(self) -> set[int]:
        """The tokens that end the pooled region: the backbone's stop tokens (EOS and turn
        ends) with pool_stop "turn", its EOS alone with "eos"."""
        if self.settings["pool_stop"] == "eos":
            eos = self.backbone.eos_id
            return set() if eos is None else {eos}
        return set(self.backbone.stop_ids)

    @property
    def model_shape(self) -> ModelShape:
        """The backbone's transformer without its LM head, plus this scorer's adapter (applied
        at every token) and its head (applied once per row, to the pooled state)."""
        body = model_shape(self.backbone)
        assert body is not None  # a TransformerBackbone's is read from its transformer
        adapter = sum(p.numel() for p in adapter_parameters(self.net, self.adapter).values())
        head = sum(m.weight.numel() for m in self.head.modules() if isinstance(m, torch.nn.Linear))
        return body.plus(params=int(adapter), head=int(head))

    def score_work(self, batch: ScoreBatch) -> list[Work]:
        """Each row's forward over its own tokens, bidirectional or causal, the head once."""
        causal = self.settings["attention"] == "causal"
        return [
            Work.causal(len(t), head=1) if causal else Work.full(len(t), head=1)
            for t in batch.tokens
        ]

    def score(self, batch: ScoreBatch) -> np.ndarray:
        """One logit per row, each row at its own width (`batching`): a row's score does not
        depend on the rows beside it."""
        tokens, plens = list(batch.tokens), list(batch.prompt_lens)
        out = np.empty(len(tokens))
        with torch.no_grad():
            for width, members in by_width(tokens):
                rows = [tokens[i] for i in members]
                lens = [plens[i] for i in members]
                out[members] = self.logits(rows, lens, width).cpu().numpy()
        return out


class PRM(RewardScorer):
    """Process reward model: rates partial states (pooled readout and the mask ratio)."""

    Config = PRMConfig
    kind = "prm"
    reads_partial = True


class ORM(RewardScorer):
    """Outcome reward model: rates finished answers (pooled readout, a linear head)."""

    Config = ORMConfig
    kind = "orm"
    reads_partial = False


@hookimpl
def dllmbench_register_scorers(register):
    register("prm", PRM)
    register("orm", ORM)
