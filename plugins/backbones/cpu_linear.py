"""Float32 linear layers on the CPU through oneDNN.

torch computes a float32 `nn.Linear` on the CPU with MKL, and MKL runs its AVX2 code on AMD
processors even where they have AVX-512. oneDNN, torch's other CPU library (the one its
bfloat16 matmuls already use), runs the AVX-512 code: on a Zen 5 core the demo model's
linears over a thousand rows or more take 2.1 to 2.5 times less time through it (1.8 to 2.0 at
256 rows), and a denoising forward 1.2 to 1.6 times less (`benchmarks/bench_cpu_linear.py`).
Both sum each output in float32; they can differ in the last bits where a row is longer than
oneDNN's block of 128, as two BLAS builds do.

Below `MIN_ROWS` rows oneDNN's set-up costs more than the product saves, so small inputs stay
with torch's own linear, as does everything that needs a gradient, every other device and
dtype, a linear of no width (oneDNN's operator cannot reshape an empty weight), and a torch
whose oneDNN lacks the operator.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

MIN_ROWS = 256  # rows (tokens) from which oneDNN is the faster; measured in the benchmark


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN's linear and it agrees with torch's own on a test."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        draw = torch.Generator().manual_seed(0)  # the global generator is left as it was
        x, w, b = (torch.randn(*shape, generator=draw) for shape in ((MIN_ROWS, 8), (4, 8), (4,)))
        return bool(torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def _linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight, bias = module.weight, module.bias
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if (
        all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
        and x.dim() >= 2
        and weight.numel()  # a linear of no width (LLaDA2 without shared experts) stays
        and x.numel() >= MIN_ROWS * x.shape[-1]
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def use_onednn(net: torch.nn.Module, on: bool = True) -> int:
    """Compute every `nn.Linear` of `net` (its own class, not a subclass) through oneDNN
    where that is faster and exact in the sense above (`on=False`: through torch's own
    again). Modules added to `net` later (a LoRA adapter) need another call. The number of
    linears that now go through oneDNN."""
    if on and not available():
        return 0
    count = 0
    for module in net.modules():
        if type(module) is not torch.nn.Linear:
            continue
        if on:
            module.forward = functools.partial(_linear, module)  # type: ignore[method-assign]
            count += 1
        else:
            module.__dict__.pop("forward", None)
    return count
