"""LoRA adapters on a frozen transformer shared with the generator.

Each scorer injects its own named adapter into the backbone's transformer instead of
loading a second copy. Adapters are off except inside `active(net, name)`, so the
generator's forward always sees the plain frozen weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

# peft (and transformers under it) loads when a scorer is built, not when plugins register
if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer

from dllmbench.core.errors import UserError
from dllmbench.plugins.backbones.cpu_linear import use_onednn


def tuner_layers(net: torch.nn.Module) -> list[BaseTunerLayer]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in net.modules() if isinstance(m, BaseTunerLayer)]


def lora_layers(net: torch.nn.Module) -> list[LoraLayer]:
    from peft.tuners.lora import LoraLayer

    return [m for m in net.modules() if isinstance(m, LoraLayer)]


def adapter_names(net: torch.nn.Module) -> set[str]:
    names: set[str] = set()
    for layer in lora_layers(net):
        names |= set(layer.lora_A.keys())
    return names


def inject(
    net: torch.nn.Module,
    name: str,
    *,
    r: int,
    alpha: int,
    dropout: float,
    targets: tuple[str, ...],
    seed: int,
) -> None:
    """Add adapter `name` (initialised from `seed`) and leave every adapter switched off."""
    from peft import LoraConfig, inject_adapter_in_model

    named = {n.rsplit(".", 1)[-1]: m for n, m in net.named_modules()}
    if not any(t in named for t in targets):  # peft's own error blamed the scorer (exit 3)
        linear = sorted(n for n, m in named.items() if isinstance(m, torch.nn.Linear))
        raise UserError(
            f"no module of the backbone matches target_modules {list(targets)}; its linear "
            f"layers are named {', '.join(linear)} (give target_modules=a+b)"
        )

    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none"
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft warns that a second adapter joins the first: that is the point here
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        torch.manual_seed(seed)
        inject_adapter_in_model(config, net, adapter_name=name)
    if not any(name in layer.lora_A for layer in lora_layers(net)):
        raise UserError(f"no module of the backbone matches target_modules {list(targets)}")
    # The adapter is float32 whatever the base's dtype (peft takes the base's): on a bfloat16
    # base, AdamW's steps of about lr (2e-5) are below half an ulp of lora_A's entries and
    # round away, so the adapter would hardly train. peft's LoRA forward casts its input to the
    # adapter's dtype and the result back to the base's.
    for param in adapter_parameters(net, name).values():
        param.data = param.data.float()
    for param in net.parameters():  # the base stays frozen; adapters train only when asked
        param.requires_grad_(False)
    net.eval()  # the new LoRA dropout modules start in training mode
    if next(net.parameters()).device.type == "cpu":  # the adapter's linears too
        use_onednn(net)
    switch(net, None)


def switch(net: torch.nn.Module, name: str | None) -> None:
    """Turn adapter `name` on (None: every adapter off). Which parameters train is not
    changed: peft's set_adapter marks the active adapter trainable, so it is put back."""
    trainable = [(p, p.requires_grad) for k, p in net.named_parameters() if "lora_" in k]
    for layer in tuner_layers(net):
        if name is None:
            layer.enable_adapters(False)
        else:
            layer.enable_adapters(True)
            layer.set_adapter(name)
    for param, flag in trainable:
        param.requires_grad_(flag)


@contextmanager
def active(net: torch.nn.Module, name: str) -> Iterator[None]:
    """Adapter `name` on for the block, every adapter off after it."""
    switch(net, name)
    try:
        yield
    finally:
        switch(net, None)


def adapter_parameters(net: torch.nn.Module, name: str) -> dict[str, torch.nn.Parameter]:
    """The adapter's parameters, keyed without the adapter name (portable across names)."""
    marker = f".{name}."
    return {
        k.replace(marker, "."): p for k, p in net.named_parameters() if marker in k and "lora_" in k
    }
