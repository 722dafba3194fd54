"""Float32 linears on the CPU through oneDNN (plugins/backbones/cpu_linear.py): where they go,
that they give torch's own results, and where they stay with torch."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from dllmbench.plugins.backbones import cpu_linear
from dllmbench.plugins.backbones.cpu_linear import MIN_ROWS, use_onednn
from dllmbench.plugins.backbones.tiny import Tiny

pytestmark = pytest.mark.skipif(
    not cpu_linear.available(), reason="this torch has no usable oneDNN linear"
)


def _spy() -> mock.MagicMock:
    return mock.patch.object(
        torch.ops.mkldnn, "_linear_pointwise", wraps=torch.ops.mkldnn._linear_pointwise
    )


def _layer(k: int, n: int, bias: bool) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(k, n, bias=bias).eval()


@pytest.mark.parametrize(("k", "n", "bias"), [(128, 128, True), (128, 256, False), (64, 67, True)])
def test_a_routed_linear_gives_torchs_own_result_bit_for_bit(k, n, bias):
    """Rows no longer than oneDNN's block (the demo's hidden 128) sum in the same order."""
    layer = _layer(k, n, bias)
    x = torch.randn(2, MIN_ROWS, k)
    with torch.no_grad():
        want = layer(x)
        assert use_onednn(layer) == 1
        with _spy() as spy:
            got = layer(x)
    assert spy.call_count == 1
    assert torch.equal(got, want)


def test_a_longer_row_agrees_to_float32_rounding():
    layer = _layer(1024, 64, True)
    x = torch.randn(MIN_ROWS, 1024)
    with torch.no_grad():
        want = layer(x)
        use_onednn(layer)
        got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_what_stays_with_torchs_own_linear():
    """Small inputs, inputs that need a gradient, other dtypes: no oneDNN call."""
    layer = _layer(32, 16, True)
    use_onednn(layer)
    few = torch.randn(MIN_ROWS - 1, 32)
    with _spy() as spy:
        with torch.no_grad():
            layer(few)
            layer.to(torch.bfloat16)(torch.randn(MIN_ROWS, 32, dtype=torch.bfloat16))
        layer.float()
        x = torch.randn(MIN_ROWS, 32, requires_grad=True)
        layer(x).sum().backward()
    assert spy.call_count == 0
    assert x.grad is not None and layer.weight.grad is not None


@pytest.mark.parametrize(("k", "n"), [(32, 0), (0, 32)])
def test_a_linear_of_no_width_stays_with_torch(k, n):
    """LLaDA2 without shared experts has linears of no width: oneDNN's operator cannot
    reshape their empty weight (a RuntimeError); torch's own gives the empty or zero result."""
    layer = _layer(k, n, False)
    use_onednn(layer)
    x = torch.randn(MIN_ROWS, k)
    with _spy() as spy, torch.no_grad():
        got = layer(x)
    assert spy.call_count == 0
    assert torch.equal(got, F.linear(x, layer.weight))


def test_a_trained_layer_keeps_its_gradient_and_a_frozen_input_is_routed():
    """A LoRA adapter trains on a frozen base: the base's linear has no gradient to give
    when its input needs none, and oneDNN computes it; the adapter's still trains."""
    base, adapter = _layer(32, 32, False), _layer(32, 32, False)
    base.requires_grad_(False)
    use_onednn(base)
    use_onednn(adapter)
    x = torch.randn(MIN_ROWS, 32)
    with _spy() as spy:
        (adapter(base(x))).sum().backward()
    assert spy.call_count == 1  # the frozen base; the adapter needs its gradient
    assert adapter.weight.grad is not None and adapter.weight.grad.abs().sum() > 0


def test_switched_off_the_module_is_as_torch_made_it():
    layer = _layer(16, 16, True)
    use_onednn(layer)
    use_onednn(layer, on=False)
    assert "forward" not in vars(layer)
    with _spy() as spy, torch.no_grad():
        layer(torch.randn(MIN_ROWS, 16))
    assert spy.call_count == 0


def test_the_check_at_first_use_leaves_the_global_generator_alone():
    cpu_linear.available.cache_clear()
    state = torch.random.get_rng_state()
    assert cpu_linear.available()
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_unusable_onednn_leaves_every_linear_alone():
    layer = _layer(16, 16, True)
    with mock.patch.object(cpu_linear, "available", lambda: False):
        assert use_onednn(layer) == 0
    assert "forward" not in vars(layer)


def test_the_demo_backbone_and_its_adapters_go_through_onednn():
    """On the CPU every linear of the shipped demo model is routed, the LoRA adapters the
    scorers inject too, and its logits agree with torch's own to float32 rounding."""
    from dllmbench.plugins.scorers.adapters import inject

    backbone = Tiny()
    net = backbone.transformer
    linears = [m for m in net.modules() if type(m) is torch.nn.Linear]
    assert linears and all("forward" in vars(m) for m in linears)
    inject(net, "probe", r=4, alpha=8, dropout=0.0, targets=("q_proj",), seed=0)
    adapters = [m for m in net.modules() if type(m) is torch.nn.Linear]
    assert len(adapters) > len(linears) and all("forward" in vars(m) for m in adapters)

    ids = torch.randint(2, len(backbone.tokenizer), (8, MIN_ROWS // 8 + 8))
    attn = torch.ones_like(ids)
    with _spy() as spy:
        routed = backbone.logits(ids, attn)
    assert spy.call_count > 0
    use_onednn(net, on=False)
    torch.testing.assert_close(routed, backbone.logits(ids, attn), rtol=1e-4, atol=1e-4)
    assert F.linear is torch.nn.functional.linear  # nothing of torch itself was changed
