"""DeepLIFT's passes through elementwise constants: Keras writes a batch norm it cannot fold into a
convolution (one after a pooling or a concatenation, as DenseNet's) and its Normalization and
Rescaling layers as Sub, Mul, Add and Div with per-channel constants. These are affine, so Rescale
takes them by their gradient, and RevealCancel scales a difference's parts and multipliers by the
factor (swapped where it is negative) and passes them through a shift, as for a batch norm
(docs/science.md 5.8). Before, RevealCancel refused them and Rescale went to Captum.
Checked against the per-unit RevealCancel reference (a diagonal layer is a linear layer), against
the same model with a BatchNorm, and by summation to delta."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.inspect_model import inspect_model
from workers.methods import get_method

_FEATURES = 6


class _Normalize(nn.Module):
    """(x - mean) / std, as Keras' Normalization layer exports."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class _WrittenOutNorm(nn.Module):
    """A batch norm written out as Keras writes one: (x - mean) * scale + beta, per channel."""

    def __init__(self, mean: torch.Tensor, scale: torch.Tensor, beta: torch.Tensor) -> None:
        super().__init__()
        for name, value in (("mean", mean), ("scale", scale), ("beta", beta)):
            self.register_buffer(name, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.scale + self.beta


def _tabular(seed: int) -> nn.Sequential:
    """Normalization at the input, a written-out norm after a ReLU (one negative scale)."""
    g = torch.Generator().manual_seed(seed)
    first, last = nn.Linear(_FEATURES, 5), nn.Linear(5, 3)
    with torch.no_grad():
        for layer in (first, last):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g))
            layer.bias.copy_(0.5 * torch.randn(layer.bias.shape, generator=g))
    norm = _WrittenOutNorm(
        torch.rand(5, generator=g), torch.tensor([1.5, -0.8, 0.6, 2.0, 1.1]), torch.randn(5, generator=g)
    )
    normalize = _Normalize(torch.randn(_FEATURES, generator=g), 0.5 + torch.rand(_FEATURES, generator=g))
    return nn.Sequential(normalize, first, nn.ReLU(), norm, nn.ReLU(), last).eval()


def _dense(model: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """The model as the reference's dense float64 layers: each elementwise affine a diagonal layer."""
    normalize, first, _, norm, _, last = model
    std, mean = normalize.std.double().numpy(), normalize.mean.double().numpy()
    scale = norm.scale.double().numpy()
    shift = (norm.beta - norm.mean * norm.scale).double().numpy()
    return [
        (np.diag(1 / std), -mean / std, False),
        *dense_layers(nn.Sequential(first, nn.ReLU()), (_FEATURES,)),
        (np.diag(scale), shift, True),
        *dense_layers(nn.Sequential(last), (5,)),
    ]


def _rows(seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(4, _FEATURES, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("reference", ["zeros", "random"])
def test_revealcancel_matches_the_per_unit_reference(dynamo: bool, reference: str) -> None:
    model, x = _tabular(1), _rows(2)
    x0 = torch.zeros_like(x) if reference == "zeros" else _rows(3, 0.5)
    classes = np.array([0, 1, 2, 1])
    method = get_method("deeplift_revealcancel")
    got = method.attribute(context(model, x, dynamo=dynamo), x.numpy(), x0.numpy(), classes)
    layers = _dense(model)
    flat, flat0 = (t.numpy().astype(np.float64) for t in (x, x0))
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    delta = (model(x) - model(x0)).detach().numpy()[np.arange(4), classes]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-4, atol=1e-5)  # summation to delta


@pytest.mark.parametrize("name", ["deeplift_rescale", "deeplift_revealcancel"])
def test_a_written_out_norm_after_a_pooling_is_the_batch_norm_it_stands_for(name: str) -> None:
    """A CNN whose batch norm follows a max pooling (it cannot be folded into the convolution), once
    as a BatchNorm2d and once written out with constants: the same numbers, by xaudit's own passes."""
    torch.manual_seed(4)
    conv1, conv2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 3, 3)
    norm = nn.BatchNorm2d(4, eps=0.0).eval()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.2, -0.7, 0.9, 1.6]))
        norm.bias.copy_(torch.randn(4))
        norm.running_mean.copy_(torch.rand(4))
    written = _WrittenOutNorm(
        norm.running_mean.view(4, 1, 1).clone(), norm.weight.detach().view(4, 1, 1).clone(),
        norm.bias.detach().view(4, 1, 1).clone(),
    )  # fmt: skip
    head = [nn.ReLU(), conv2, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    batch_norm = nn.Sequential(conv1, nn.ReLU(), nn.MaxPool2d(2), norm, *head).eval()
    written_out = nn.Sequential(conv1, nn.ReLU(), nn.MaxPool2d(2), written, *head).eval()
    g = torch.Generator().manual_seed(5)
    x, x0 = torch.randn(3, 2, 8, 8, generator=g), 0.2 * torch.randn(3, 2, 8, 8, generator=g)
    classes = np.array([2, 0, 1])
    said = inspect_model(to_onnx(written_out, x[:1])).methods[name]
    assert said.startswith("runs: torch graph"), said
    assert "Captum" not in said, said  # xaudit's own pass, not Captum's fallback
    method = get_method(name)
    got = method.attribute(context(written_out, x), x.numpy(), x0.numpy(), classes)
    want = method.attribute(context(batch_norm, x), x.numpy(), x0.numpy(), classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert np.abs(want).max() > 1e-3  # not two maps of zeros
