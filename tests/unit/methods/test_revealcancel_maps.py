"""RevealCancel's layer maps: the dense and banded transposes of a convolution are its input gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workers.methods import _revealcancel_maps as maps_module
from workers.methods._revealcancel_maps import affine_maps, dense_transposes

CONVS = {
    # (module, sample shape): the digits CNN's layers (dense; banded), a strided and dilated one,
    # grouped channels, a banded 1-d convolution, and one too large for a dense matrix.
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
    fast = dense_transposes(plain, x)
    g = torch.randn_like(plain.linear(x))
    for transpose, weight in ((fast.linear_t, module.weight), (fast.magnitude_t, module.weight.abs())):
        u = x.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(module._conv_forward(u, weight.detach(), None), u, g)
        torch.testing.assert_close(transpose(g, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("first", "dense"), ("second", "banded"), ("conv1d", "banded"), ("large", "kernel")],
)
def test_which_transposes_a_layer_gets(monkeypatch: pytest.MonkeyPatch, name: str, kind: str) -> None:
    module, shape = CONVS[name]
    seen = []
    for helper in ("_product", "_banded"):
        original = getattr(maps_module, helper)

        def spy(*args: object, original: object = original, helper: str = helper) -> object:
            seen.append(helper)
            return original(*args)  # type: ignore[operator]

        monkeypatch.setattr(maps_module, helper, spy)
    dense_transposes(affine_maps(module, torch.float32), torch.randn(2, *shape))
    assert set(seen) == {"dense": {"_product"}, "banded": {"_banded"}, "kernel": set()}[kind]
