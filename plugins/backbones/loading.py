"""Loading Dream and LLaDA checkpoints into native transformers classes, without remote code.

Dream is Qwen2 with bidirectional attention: its state dict loads strictly into
`Qwen2ForCausalLM`. LLaDA is a Llama-3-style stack in OLMo naming: after a one-to-one key
rename it loads strictly into `LlamaForCausalLM`. Both get `is_causal=False`. A model can
also be a tiny random one of the same architecture (`model="random"`), with a character
tokenizer, for smoke tests and CPU tests.
"""

from __future__ import annotations

import json
import os
import re
import string
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

# transformers loads when a model or tokenizer is built, not when plugins register (about
# 2.5 s of every command's start, `dllmbench plugins` and `plan` included)
if TYPE_CHECKING:
    from transformers import (
        LlamaConfig,
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
        Qwen2Config,
    )

from dllmbench.core.errors import UserError
from dllmbench.core.hub import hub_offline, hub_unreachable
from dllmbench.core.jsonfile import read_object
from dllmbench.plugins.backbones.llada2_moe import is_llada2, llada2_config, llada2_state
from dllmbench.plugins.backbones.sdar_moe import is_sdar_moe, sdar_moe_config, sdar_moe_state

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DType = Literal["float32", "bfloat16", "float16"]  # the `dtype` option of a backbone

# LLaDA (OLMo naming) → Llama naming; one-to-one.
LLADA_RENAMES = (
    (r"^model\.transformer\.wte\.", "model.embed_tokens."),
    (r"^model\.transformer\.ln_f\.", "model.norm."),
    (r"^model\.transformer\.ff_out\.", "lm_head."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_out\.", r"model.layers.\1.self_attn.o_proj."),
    (
        r"^model\.transformer\.blocks\.(\d+)\.(q_proj|k_proj|v_proj)\.",
        r"model.layers.\1.self_attn.\2.",
    ),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.up_proj\.", r"model.layers.\1.mlp.up_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_out\.", r"model.layers.\1.mlp.down_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (
        r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.",
        r"model.layers.\1.post_attention_layernorm.",
    ),
)


def rename_llada_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LLaDA's state dict with Llama's key names. A key no rule covers is an error."""
    out = {}
    for key, value in state.items():
        for pattern, repl in LLADA_RENAMES:
            new, n = re.subn(pattern, repl, key)
            if n:
                out[new] = value
                break
        else:
            raise UserError(f"LLaDA checkpoint has an unexpected key {key!r}")
    return out


# the positions of a tiny random model (`random_model`)
RANDOM_POSITIONS = 2048


def positions_of(model: str) -> int | None:
    """The positions of the model `model` names, from its config.json, when that is a local
    directory (Dream's `max_position_embeddings`, LLaDA's `max_sequence_length`); read before
    any weights load. None when it cannot tell (a Hub id, a config without either key)."""
    if model == "random":
        return RANDOM_POSITIONS
    file = Path(model) / "config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading says what is wrong with it
    if not isinstance(raw, dict):
        return None
    value = raw.get("max_position_embeddings", raw.get("max_sequence_length"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def device_problem(device: str | None) -> str | None:
    """Why `device` cannot be used by this torch build on this machine (not a torch device, a
    build without its backend, no such device), or None: found from the configuration,
    before any weights load."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return f"device {device!r} is not a torch device; e.g. cpu, cuda or cuda:1"
    if dev.type == "cpu":
        return None
    if dev.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            return (
                f"device {device!r}: this torch {torch.__version__} was built without CUDA; "
                "use device=cpu, or install a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if count == 0:
            return f"device {device!r}: no CUDA device is visible; use device=cpu"
        if dev.index is not None and dev.index >= count:
            return f"device {device!r}: there are {count} CUDA devices (cuda:0 to cuda:{count - 1})"
        return None
    backend = getattr(torch, dev.type, None) if dev.type != "mps" else torch.backends.mps
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        return f"device {device!r}: this torch build has no {dev.type} device; use device=cpu"
    return None


def device_and_dtype(device: str | None, dtype: str | None) -> tuple[torch.device, torch.dtype]:
    """bf16 on a GPU and fp32 on a CPU unless told otherwise."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    if name not in DTYPES:
        raise UserError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return dev, DTYPES[name]


# the files a checkpoint directory consists of: fetched from the Hub, hashed into the manifest
CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja")


def checkpoint_files(path: Path) -> list[Path]:
    """The files of a checkpoint directory that loading may read."""
    return sorted(f for pattern in CHECKPOINT_FILES for f in path.glob(pattern) if f.is_file())


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub without its warnings and retry messages (errors are ours to tell)."""
    from huggingface_hub.utils import logging as hub_logging

    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_logging.set_verbosity(verbosity)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resolve(model: str) -> Path:
    """A local checkpoint directory, or a Hub repo id: from the local Hugging Face cache, else
    fetched into it. An unreachable Hub is one quick error, never a retry loop."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")):
        raise UserError(
            f"checkpoint directory {model!r} does not exist; give model=PATH of a directory "
            "holding config.json and *.safetensors"
        )
    from huggingface_hub import constants, snapshot_download

    how = f"download it (hf download {model}) or give a local directory model=PATH"
    with _quiet_hub():
        try:
            return Path(
                snapshot_download(
                    model, allow_patterns=list(CHECKPOINT_FILES), local_files_only=True
                )
            )
        except Exception:  # not cached (or not a repo id): ask the Hub below
            pass
        missing = f"{model!r} is not a local directory nor in the Hugging Face cache"
        if hub_offline() or constants.HF_HUB_OFFLINE:
            raise UserError(f"{missing}, and HF_HUB_OFFLINE is set; {how}")
        reason = hub_unreachable()
        if reason:
            raise UserError(f"{missing}, and the Hub cannot be reached ({reason}); {how}")
        try:
            return Path(snapshot_download(model, allow_patterns=list(CHECKPOINT_FILES)))
        except Exception as exc:  # unknown repo, no access, a broken connection
            reason = _one_line(f"{type(exc).__name__}: {exc}")
            raise UserError(f"cannot fetch {model!r} from the Hub ({reason}); {how}") from None


def _safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except Exception as exc:  # SafetensorError, HeaderTooLarge, … from a damaged file
        raise UserError(
            f"{file} is not a readable safetensors file ({_one_line(str(exc))}); "
            "download or save the checkpoint again"
        ) from None


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory's safetensors shards."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"{path} holds no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(_safetensors(file))
    return state


# config.json keys a checkpoint of each architecture must have (LLaDA: vocab_size or
# embedding_size)
QWEN_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
QWEN_HEADS = ("hidden_size", "num_attention_heads", "num_key_value_heads")  # width, heads, kv
REQUIRED = {
    "dream": QWEN_KEYS,
    "block": QWEN_KEYS,
    "llada": ("d_model", "mlp_hidden_size", "n_layers", "n_heads"),
}


def read_config(arch: str, path: Path) -> dict[str, Any]:
    """A checkpoint's config.json, checked: it parses and has the keys the model needs."""
    file = path / "config.json"
    if not file.is_file():
        raise UserError(f"{path} has no config.json")
    raw = read_object(file, "restore it")
    missing = [k for k in REQUIRED[arch] if k not in raw]
    if not ("vocab_size" in raw or (arch == "llada" and "embedding_size" in raw)):
        missing.append("vocab_size")
    if missing:
        raise UserError(
            f"{file} lacks {', '.join(missing)}; is it a {arch} checkpoint's config.json?"
        )
    for key in (*REQUIRED[arch], *(k for k in SIZES if raw.get(k) is not None)):
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{file}: {key} is {value!r}, not a positive integer; restore it")
    for key in (k for k in SCALES if raw.get(k) is not None):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < INF:
            raise UserError(f"{file}: {key} is {value!r}, not a finite positive number; restore it")
    wrong = _heads_problem(arch, raw)
    if wrong is not None:
        raise UserError(f"{file}: {wrong}; restore it")
    return raw


# config.json sizes that, when given (not null), are positive integers (beside REQUIRED's)
SIZES = (
    "vocab_size",
    "embedding_size",
    "num_key_value_heads",
    "n_kv_heads",
    "head_dim",
    "max_position_embeddings",
    "max_sequence_length",
)
# config.json numbers that, when given, are positive and finite: the rotary base and the norm's
# epsilon (a rotary base <= 0 made every logit NaN)
SCALES = ("rope_theta", "rms_norm_eps")
INF = float("inf")  # JSON as Python reads it may hold Infinity


def _heads_problem(arch: str, raw: dict[str, Any]) -> str | None:
    """Why the attention heads of a config.json (its sizes positive) cannot split the model's
    width, or None: the heads divide the hidden size, unless a block checkpoint's head_dim
    gives their width (Qwen3), and the key-value heads divide the heads."""
    width, heads, kv = ("d_model", "n_heads", "n_kv_heads") if arch == "llada" else QWEN_HEADS
    own_width = arch == "block" and raw.get("head_dim") is not None
    if not own_width and raw[width] % raw[heads]:
        return f"{heads} {raw[heads]} does not divide {width} {raw[width]}"
    shared = raw.get(kv) or raw[heads]
    if raw[heads] % shared:
        return f"{kv} {shared} does not divide {heads} {raw[heads]}"
    return None


def load_strict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Load every key, and only those; a difference is an error naming the keys."""
    expected = model.state_dict()
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise UserError(
            f"{where} does not fit its model: missing {missing[:5]}"
            f"{'…' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'…' if len(unexpected) > 5 else ''}"
        )
    wrong = [k for k in expected if state[k].shape != expected[k].shape]
    if wrong:
        first = wrong[0]
        raise UserError(
            f"{where} does not fit its config.json: {first} is "
            f"{list(state[first].shape)}, the config makes it {list(expected[first].shape)}"
            f"{f' ({len(wrong) - 1} more)' if len(wrong) > 1 else ''}; restore the config"
        )
    model.load_state_dict(state, strict=True, assign=True)


# the config.json fields a Qwen2 or Qwen3 model is built from (Qwen3 adds head_dim, attention_bias)
QWEN_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "rope_theta",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
)


def qwen2_config(raw: dict[str, Any]) -> Qwen2Config:
    """Dream's config.json (model_type "Dream") as a bidirectional Qwen2Config."""
    from transformers import Qwen2Config

    config = Qwen2Config(**{k: raw[k] for k in QWEN_FIELDS if k in raw}, use_sliding_window=False)
    config.is_causal = False
    return config


def block_config(raw: dict[str, Any], qwen3: bool, experts: bool = False) -> Any:
    """A block-diffusion checkpoint's config.json (SDAR and TraDo: Qwen3's fields; SDAR-MoE:
    Qwen3-MoE's, sdar_moe.py; Fast-dLLM v2: Qwen2.5's) as transformers' own Qwen3Config,
    Qwen3MoeConfig or Qwen2Config. The sampler passes its block-causal mask itself."""
    from transformers import Qwen2Config, Qwen3Config

    keys = (*QWEN_FIELDS, *(("head_dim", "attention_bias") if qwen3 else ()))
    if experts:
        return sdar_moe_config(raw, keys)
    cls = Qwen3Config if qwen3 else Qwen2Config
    return cls(**{k: raw[k] for k in keys if k in raw}, use_sliding_window=False)


def rope_scaled(raw: dict[str, Any]) -> bool:
    """Whether a config.json scales its rotary embedding (`rope_scaling` other than none or
    the default), which the block backbones' classes would not read."""
    scaling = raw.get("rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
    return bool(scaling) and kind != "default"


def llama_config(raw: dict[str, Any]) -> LlamaConfig:
    """LLaDA's config.json (OLMo naming) as a bidirectional LlamaConfig."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=raw["d_model"],
        intermediate_size=raw["mlp_hidden_size"],
        num_hidden_layers=raw["n_layers"],
        num_attention_heads=raw["n_heads"],
        num_key_value_heads=raw.get("n_kv_heads") or raw["n_heads"],
        vocab_size=raw.get("embedding_size") or raw["vocab_size"],
        rope_theta=raw.get("rope_theta", 10000.0),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        max_position_embeddings=raw.get("max_sequence_length", 4096),
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        attention_bias=bool(raw.get("include_bias", False)),
        mlp_bias=False,
    )
    config.is_causal = False
    return config


def build(arch: str, config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The model with its parameters on the meta device (buffers real), ready to be assigned."""
    from accelerate import init_empty_weights
    from transformers import (
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        LlamaForCausalLM,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    if isinstance(config, Glm4MoeConfig):  # LLaDA2 (llada2_moe.py)
        cls = Glm4MoeForCausalLM
    elif isinstance(config, Qwen3MoeConfig):  # SDAR-MoE (sdar_moe.py)
        cls = Qwen3MoeForCausalLM
    elif arch == "block":
        cls = Qwen3ForCausalLM if isinstance(config, Qwen3Config) else Qwen2ForCausalLM
    else:
        cls = Qwen2ForCausalLM if arch == "dream" else LlamaForCausalLM
    config._attn_implementation = "sdpa"
    with init_empty_weights(include_buffers=False), warnings.catch_warnings():
        # LLaDA2 without shared experts: Glm4Moe builds them with no width, which torch's
        # initialiser warns of; the weights are assigned next
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
        model = cls(config)
    return model


def load_checkpoint(arch: str, model: str, device: torch.device, dtype: torch.dtype):
    """(transformer, tokenizer, raw config) of a Dream, LLaDA or block-diffusion checkpoint
    (SDAR, SDAR-MoE, TraDo, Fast-dLLM v2, LLaDA2.0)."""
    path = resolve(model)
    raw = read_config(arch, path)
    state = read_state_dict(path)
    llada2 = arch == "block" and is_llada2(raw, state)
    sdar_moe = arch == "block" and not llada2 and is_sdar_moe(raw, state)
    if arch == "block" and not llada2 and rope_scaled(raw):
        raise UserError(
            f"{path / 'config.json'}: rope_scaling {raw['rope_scaling']!r} is not supported "
            "(the block backbones compute the unscaled rotary embedding)"
        )
    try:
        if llada2:  # LLaDA2.0's mixture of experts: transformers' Glm4Moe
            config = llada2_config(raw)
        elif arch == "block":  # Qwen3 normalises queries and keys per head; Qwen2 does not
            config = block_config(raw, sdar_moe or any(".q_norm." in k for k in state), sdar_moe)
        else:
            config = qwen2_config(raw) if arch == "dream" else llama_config(raw)
        net = build(arch, config, dtype)
    except UserError:
        raise
    except Exception as exc:  # a value of the wrong kind or out of range: the file's fault
        reason = _one_line(f"{type(exc).__name__}: {exc}")
        raise UserError(f"{path / 'config.json'} does not build a model ({reason})") from None
    if arch == "llada":
        state = rename_llada_keys(state)
    elif llada2:
        state = llada2_state(state, config)
    elif sdar_moe:
        state = sdar_moe_state(state, config)
    tied = getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in state
    if tied:  # a tied head (Qwen3-4B): the embedding's weights
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    state = {k: v.to(dtype) for k, v in state.items()}
    load_strict(net, state, str(path))
    if tied:  # one tensor, as the checkpoint holds it (converted key by key, it was two)
        net.get_output_embeddings().weight = net.get_input_embeddings().weight
    net.to(device).eval().requires_grad_(False)
    return net, load_tokenizer(path), raw


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer, without remote code.

    Dream ships a slow Qwen2-style BPE class of its own; its vocab.json and merges.txt load
    into transformers' Qwen2TokenizerFast.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config.json's model_type ("Dream") is not AutoConfig's
    try:
        with warnings.catch_warnings():  # AutoConfig's reading of a `rope_scaling: null`
            warnings.filterwarnings("ignore", "`rope_scaling` is deprecated", FutureWarning)
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError, KeyError):
        from transformers import Qwen2TokenizerFast

        try:
            return Qwen2TokenizerFast.from_pretrained(str(path))
        except Exception as exc:
            raise UserError(f"cannot load the tokenizer in {path}: {_one_line(str(exc))}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def mask_id_of(
    raw: dict[str, Any], tokenizer: PreTrainedTokenizerBase, names: tuple[str, ...], where: str
) -> int:
    """The mask token id: the config's, else the tokenizer's, else a known mask token."""
    for value in (raw.get("mask_token_id"), tokenizer.mask_token_id):
        if isinstance(value, int):
            return value
    vocab = tokenizer.get_vocab()
    for name in names:
        if name in vocab:
            return vocab[name]
    raise UserError(
        f"{where} names no mask token (config mask_token_id, tokenizer mask_token, "
        f"or one of {', '.join(names)}); pass mask_id=N"
    )


# -- tiny random models and their tokenizer ----------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")


def char_tokenizer(extra_specials: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: printable ASCII plus chat and mask tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = (*SPECIALS, *extra_specials)
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate([*specials, *chars])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    # every character alone, newlines too (`.` left "\n\n" one piece, outside the vocabulary)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mask|>",
        additional_special_tokens=list(specials[1:3] + extra_specials),
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def random_model(
    arch: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    dtype: torch.dtype,
    hidden: int = 64,
    layers: int = 2,
) -> torch.nn.Module:
    """A tiny randomly initialised model of the architecture, deterministic in `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    vocab = len(tokenizer)
    if arch == "dream":
        config = Qwen2Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=vocab,
            max_position_embeddings=RANDOM_POSITIONS,
            tie_word_embeddings=False,
        )
    else:
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=vocab,
            rope_theta=5e5,
            rms_norm_eps=1e-5,
            max_position_embeddings=RANDOM_POSITIONS,
            tie_word_embeddings=False,
        )
    config.is_causal = False
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        cls = Qwen2ForCausalLM if arch == "dream" else LlamaForCausalLM
        net = cls(config)
    return net.to(dtype).eval().requires_grad_(False)
