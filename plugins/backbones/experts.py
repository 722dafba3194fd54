"""The experts of a mixture-of-experts checkpoint, stacked as transformers holds them.

A checkpoint saved one module per expert (LLaDA2.0's, SDAR-MoE's: `model.layers.N.mlp.experts.
E.gate_proj.weight`, `up_proj`, `down_proj`) becomes, per layer, transformers' experts tensors:
`gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and `down_proj` [E, H, I].
Each expert is copied once, into its place, and let go of once its layer is stacked: the
experts are most of a mixture's weights, and a 30B checkpoint is not held twice while it loads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping

import torch

from dllmbench.core.errors import UserError

EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def has_experts(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a state dict holds experts saved one module each."""
    return any(EXPERT.match(key) for key in state)


def stack_experts(
    state: MutableMapping[str, torch.Tensor], count: int, where: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the state dict without its experts, each layer's experts stacked under
    `model.layers.N.mlp.experts.gate_up_proj` and `.down_proj`). The experts' own tensors are
    taken out of `state` as each layer is stacked. A layer lacking one of its `count` experts,
    or holding one of another shape than expert 0's, is an error naming it (`where`: the
    checkpoint, for the message)."""
    rest: dict[str, torch.Tensor] = {}
    found: dict[tuple[int, str], dict[int, str]] = {}  # (layer, name) → index → its key
    for key, value in state.items():
        if (m := EXPERT.match(key)) is None:
            rest[key] = value
            continue
        layer, index, name = m.groups()
        found.setdefault((int(layer), f"{name}_proj"), {})[int(index)] = key
    stacked: dict[str, torch.Tensor] = {}
    for layer in sorted({layer for layer, _ in found}):
        keys = {}
        for name in ("gate_proj", "up_proj", "down_proj"):
            keys[name] = have = found.get((layer, name), {})
            if sorted(have) != list(range(count)):
                lacking = sorted(set(range(count)) - set(have))[:3]
                extra = sorted(set(have) - set(range(count)))[:3]
                what = f"lacks {lacking}" if lacking else f"has experts {extra} beyond them"
                raise UserError(
                    f"{where}: layer {layer} has {len(have)} of {count} experts' {name} "
                    f"({what}); restore the checkpoint"
                )
        gate, down = state[keys["gate_proj"][0]], state[keys["down_proj"][0]]
        shapes = {"gate_proj": gate.shape, "up_proj": gate.shape, "down_proj": down.shape}
        for name, shape in shapes.items():
            for i in range(count):
                if state[keys[name][i]].shape != shape:
                    raise UserError(
                        f"{where}: {keys[name][i]} is {list(state[keys[name][i]].shape)}, "
                        f"expert 0's {list(shape)}; restore the checkpoint"
                    )
        width = gate.shape[0]
        gate_up = torch.empty((count, 2 * width, gate.shape[1]), dtype=gate.dtype)
        downs = torch.empty((count, *down.shape), dtype=down.dtype)
        for i in range(count):
            gate_up[i, :width] = state[keys["gate_proj"][i]]
            gate_up[i, width:] = state[keys["up_proj"][i]]
            downs[i] = state[keys["down_proj"][i]]
        prefix = f"model.layers.{layer}.mlp.experts."
        stacked[prefix + "gate_up_proj"] = gate_up
        stacked[prefix + "down_proj"] = downs
        for own in keys.values():  # copied: let the checkpoint's tensors go
            for key in own.values():
                del state[key]
    return rest, stacked
