"""RevealCancel's layer maps: a convolution's dense products are its forward pass and its input gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workers.methods._revealcancel_maps import affine_maps, dense_maps

CONVS = {
    # (module, sample shape): the digits CNN's layers (one input channel: a dense forward pass too),
    # a strided and dilated one, grouped channels, a 1-d convolution, and one too large for a dense
    # matrix.
    "first": (nn.Conv2d(1, 8, 3, padding=1), (1, 8, 8)),
    "second": (nn.Conv2d(8, 16, 3, stride=2, padding=1), (8, 8, 8)),
    "dilated": (nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2), (4, 6, 6)),
    "grouped": (nn.Conv2d(4, 8, 3, padding=1, groups=2), (4, 4, 4)),
    "conv1d": (nn.Conv1d(16, 8, 3, padding=1), (16, 20)),
    "large": (nn.Conv2d(2, 4, 3, padding=1), (2, 16, 16)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_transposes_are_the_input_gradient(name: str) -> None:
    torch.manual_seed(0)
    module, shape = CONVS[name]
    x = torch.randn(5, *shape)
    plain = affine_maps(module, torch.float32)
    fast = dense_maps(plain, x)
    for forward, weight in ((fast.linear, module.weight), (fast.magnitude, module.weight.abs())):
        want = module._conv_forward(x, weight.detach(), None)
        torch.testing.assert_close(forward(x), want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(plain.linear(x))
    for transpose, weight in ((fast.linear_t, module.weight), (fast.magnitude_t, module.weight.abs())):
        u = x.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(module._conv_forward(u, weight.detach(), None), u, g)
        torch.testing.assert_close(transpose(g, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "transposes", "forward"),
    [("first", True, True), ("second", True, False), ("grouped", True, True), ("large", False, False)],
)
def test_which_maps_a_layer_gets(name: str, transposes: bool, forward: bool) -> None:
    module, shape = CONVS[name]
    plain = affine_maps(module, torch.float32)
    fast = dense_maps(plain, torch.randn(2, *shape))
    assert (fast.linear_t is not plain.linear_t) == (fast.magnitude_t is not plain.magnitude_t) == transposes
    assert (fast.linear is not plain.linear) == (fast.magnitude is not plain.magnitude) == forward


FLOAT64_CONVS = {
    # (module, sample shape, whether a sample's output has few enough positions for one batched
    # product): ResNet's last stages in small, a strided and a dilated one, a 1x1 downsample, and a
    # map large enough for the kernel.
    "last_stage": (nn.Conv2d(16, 16, 3, padding=1), (16, 2, 2), True),
    "strided": (nn.Conv2d(8, 16, 3, stride=2, padding=1), (8, 8, 8), True),
    "dilated": (nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2), (4, 6, 6), True),
    "downsample": (nn.Conv2d(8, 16, 1, stride=2, bias=False), (8, 4, 4), True),
    "large": (nn.Conv2d(2, 4, 3, padding=1), (2, 16, 16), False),
}


@pytest.mark.parametrize("name", sorted(FLOAT64_CONVS))
def test_float64_maps_compute_w_da_in_float64_and_the_rest_in_float32(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float64 plans (RevealCancel's redo, and whole graphs with sums) need W da in float64: its sign
    routes the multipliers. Small maps multiply it as one product over the batch, to float64
    rounding of the kernel's values. |W| |da| and the transposes take and give float64 tensors but
    are the float32 kernels' values (docs/science.md 5.8)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    module, shape, batched = FLOAT64_CONVS[name]
    unfolds = []
    unfold = F.unfold
    monkeypatch.setattr(F, "unfold", lambda *a, **k: unfolds.append(1) or unfold(*a, **k))
    x = torch.randn(7, *shape, dtype=torch.float64)
    maps = affine_maps(module, torch.float64)
    assert maps.rounded_magnitude
    weight = module.weight.detach().double()
    torch.testing.assert_close(maps.linear(x), module._conv_forward(x, weight, None), rtol=1e-12, atol=1e-12)
    assert bool(unfolds) == batched
    single = (x.float(), weight.float().abs())
    got = maps.magnitude(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.float(), module._conv_forward(*single, None), rtol=0, atol=0)
    g = torch.randn_like(maps.linear(x))
    for transpose, w in zip((maps.linear_t, maps.magnitude_t), (weight, weight.abs()), strict=True):
        u = x.float().requires_grad_(True)
        (want,) = torch.autograd.grad(module._conv_forward(u, w.float(), None), u, g.float())
        got = transpose(g, x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got.float(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer", [nn.Linear(6, 4), nn.Conv2d(2, 3, 3, padding=1)], ids=["linear", "conv"])
def test_magnitudes_are_made_when_a_product_reads_them(
    layer: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float64 plan's |W| comes from its float32 maps, and the reference pass reads only the layer
    itself: a float64 |W| made up front is memory no product reads (0.8 GB for VGG11's largest layer)."""
    made: list[torch.dtype] = []
    original = torch.Tensor.abs

    def counted(self: torch.Tensor) -> torch.Tensor:
        made.append(self.dtype)
        return original(self)

    monkeypatch.setattr(torch.Tensor, "abs", counted)
    maps = affine_maps(layer, torch.float64)
    x = torch.randn(2, 6) if isinstance(layer, nn.Linear) else torch.randn(2, 2, 5, 5)
    maps.full(x.double())
    maps.linear(x.double())
    assert made == []
    maps.magnitude(x.double().clamp(min=0))  # |da| >= 0
    assert made[-1] == torch.float32 and torch.float64 not in made
