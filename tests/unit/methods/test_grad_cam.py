"""Grad-CAM against its definition (Selvaraju et al. 2017, eqs. 1-2) plus bilinear upsampling written out."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import CNN_SHAPE, MLP_FEATURES, maxpool_cnn, relu_cnn, relu_mlp
from tests.unit.methods._context import context
from workers.methods import get_method
from xaudit.contract.errors import InvalidInput, NotApplicable


def grad_cam_ref(model: nn.Sequential, layer: nn.Module, x: torch.Tensor, classes: np.ndarray, relu: bool):
    """L^c = ReLU(sum_k alpha_k^c A^k), alpha_k^c = mean over positions of d y^c / d A^k."""
    store: dict[str, torch.Tensor] = {}
    handle = layer.register_forward_hook(lambda m, i, o: store.__setitem__("a", o))
    try:
        out = model(x)
    finally:
        handle.remove()
    acts = store["a"]
    (grads,) = torch.autograd.grad(out[np.arange(len(x)), classes].sum(), acts)
    a, g = acts.detach().double().numpy(), grads.double().numpy()
    maps = np.zeros((len(x), *a.shape[2:]))
    for n in range(len(x)):
        for k in range(a.shape[1]):
            maps[n] += g[n, k].mean() * a[n, k]
    return np.maximum(maps, 0.0) if relu else maps


def bilinear_ref(plane: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize with half-pixel centres (torch's align_corners=False), one output at a time."""
    h_in, w_in = plane.shape
    out = np.zeros((height, width))

    def source(dst: int, size_in: int, size_out: int) -> tuple[int, int, float]:
        s = max((dst + 0.5) * size_in / size_out - 0.5, 0.0)
        i0 = min(math.floor(s), size_in - 1)
        return i0, min(i0 + 1, size_in - 1), s - i0

    for r in range(height):
        r0, r1, lr = source(r, h_in, height)
        for c in range(width):
            c0, c1, lc = source(c, w_in, width)
            top = (1 - lc) * plane[r0, c0] + lc * plane[r0, c1]
            bottom = (1 - lc) * plane[r1, c0] + lc * plane[r1, c1]
            out[r, c] = (1 - lr) * top + lr * bottom
    return out


def _inputs(seed: int, channels: int = 1) -> torch.Tensor:
    return torch.randn(3, channels, *CNN_SHAPE[1:], generator=torch.Generator().manual_seed(seed))


def _expected(model, layer, x, classes, relu) -> np.ndarray:
    maps = grad_cam_ref(model, layer, x, classes, relu)
    channels = x.shape[1]
    up = np.stack([bilinear_ref(m, x.shape[2], x.shape[3]) for m in maps])
    return np.repeat(up[:, None] / channels, channels, axis=1)


@pytest.mark.parametrize("builder", [relu_cnn, maxpool_cnn])
@pytest.mark.parametrize("relu", [True, False])
def test_grad_cam_matches_definition_on_last_conv(builder, relu: bool) -> None:
    model, x = builder(seed=5), _inputs(6)
    classes = np.array([0, 2, 1])
    ctx = context(model, x, params={"relu": relu})
    got = get_method("grad_cam").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    last_conv = [m for m in model if isinstance(m, nn.Conv2d)][-1]
    want = _expected(model, last_conv, x, classes, relu)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if relu:
        assert (got >= 0).all()
    else:
        assert (got < 0).any()  # the signed map keeps negative evidence


def test_layer_parameter_names_a_convolution() -> None:
    model, x = relu_cnn(seed=7), _inputs(8)
    classes = np.array([1, 1, 0])
    ctx = context(model, x, params={"layer": "0/Conv"})  # onnx2torch's name for the first Conv node
    got = get_method("grad_cam").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    np.testing.assert_allclose(got, _expected(model, model[0], x, classes, True), rtol=1e-5, atol=1e-6)
    bad = context(model, x, params={"layer": "nope"})
    with pytest.raises(InvalidInput, match="no convolution layer 'nope'"):
        get_method("grad_cam").attribute(bad, x.numpy(), np.zeros_like(x.numpy()), classes)


def test_map_is_spread_evenly_over_input_channels() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2)
    ).eval()
    x = _inputs(9, channels=3)
    classes = np.array([0, 1, 0])
    got = get_method("grad_cam").attribute(context(model, x), x.numpy(), np.zeros_like(x.numpy()), classes)
    np.testing.assert_allclose(got[:, 0], got[:, 2])
    per_position = got.sum(axis=1)
    maps = grad_cam_ref(model, model[0], x, classes, True)
    want = np.stack([bilinear_ref(m, 8, 8) for m in maps])
    np.testing.assert_allclose(per_position, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_mlp_is_not_applicable(fmt: str) -> None:
    x = torch.randn(3, MLP_FEATURES)
    ctx = context(relu_mlp(seed=0), x, fmt=fmt)
    with pytest.raises(NotApplicable) as info:
        get_method("grad_cam").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), np.zeros(3, np.int64))
    assert info.value.method == "grad_cam"
    assert info.value.reason == "the model has no convolution layer"


def test_flat_input_reshaped_inside_the_model_is_not_applicable() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(72, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.conv(x.reshape(-1, 1, 8, 8))).flatten(1))

    x = torch.randn(3, 64)
    with pytest.raises(NotApplicable, match="no channel and spatial axes"):
        get_method("grad_cam").attribute(
            context(Flat().eval(), x), x.numpy(), np.zeros_like(x.numpy()), np.zeros(3, np.int64)
        )


@pytest.mark.parametrize("target", ["logit", "prob"])
@pytest.mark.parametrize("relu", [True, False])
def test_equals_captums_layer_grad_cam(target: str, relu: bool) -> None:
    """xaudit differentiates the summed scores once where Captum differentiates each row's score:
    the same map, on the same converted graph and target."""
    from captum.attr import LayerAttribution, LayerGradCam

    from workers.methods.grad_cam import conv_layers
    from workers.targets import parse_target

    model, x = maxpool_cnn(seed=3), _inputs(4)
    classes = np.array([2, 0, 1])
    ctx = context(model, x, params={"relu": relu}, target=parse_target(target))
    got = get_method("grad_cam").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    graph = ctx.model.torch_hookable("grad_cam")
    explainer = LayerGradCam(ctx.target.wrap(graph), conv_layers(graph)[-1][1])
    cam = explainer.attribute(x, target=torch.as_tensor(classes), relu_attributions=relu).detach()
    want = LayerAttribution.interpolate(cam, tuple(x.shape[2:]), "bilinear").expand(-1, x.shape[1], -1, -1)
    np.testing.assert_allclose(got, want.numpy() / x.shape[1], rtol=1e-6, atol=1e-7)
    assert np.abs(got).max() > 1e-3  # a map, not zeros
