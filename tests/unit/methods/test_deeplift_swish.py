"""DeepLIFT Rescale, DeepSHAP and RevealCancel through SiLU and Hardswish, which exporters write as
``x * sigmoid(x)`` (two nodes) or as one HardSwish node: the Rescale multiplier (f(z) - f(z0)) /
(z - z0) and the RevealCancel rule, the paper's rules for any elementwise nonlinearity
(docs/science.md 5.8), against DeepLIFT written out layer by layer in float64 (RevealCancel: the
per-unit reference of its tests) and by summation-to-delta. A squeeze-and-excitation gate, a product of
two activations, has no DeepLIFT rule and still goes to Captum, as the report says."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import dense_layers
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import AttributionContext, get_method
from workers.methods._rescale_graph import RescaleGraph, _derivative
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(5, 6, generator=torch.Generator().manual_seed(21)) * 2
X0 = torch.randn(5, 6, generator=torch.Generator().manual_seed(22))


def _swish_mlp() -> nn.Sequential:
    torch.manual_seed(23)
    return nn.Sequential(
        nn.Linear(6, 10), nn.SiLU(), nn.Linear(10, 8), nn.Hardswish(), nn.Linear(8, 3)
    ).eval()


def _silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def _hardswish(z: np.ndarray) -> np.ndarray:
    return z * np.clip(z + 3.0, 0.0, 6.0) / 6.0


def _reference(model: nn.Sequential, x: np.ndarray, x0: np.ndarray, c: int) -> np.ndarray:
    """DeepLIFT Rescale layer by layer (float64): multipliers back from the target logit."""
    weights = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in model[::2]]
    a, a0, multipliers = x, x0, []
    for (w, b), f in zip(weights[:2], (_silu, _hardswish), strict=True):
        z, z0 = w @ a + b, w @ a0 + b
        multipliers.append((f(z) - f(z0)) / (z - z0))
        a, a0 = f(z), f(z0)
    back = weights[2][0][c]
    for (w, _), m in zip(weights[1::-1], multipliers[::-1], strict=True):
        back = w.T @ (m * back)
    return (x - x0) * back


@pytest.mark.parametrize("dynamo", [False, True])
def test_rescale_through_silu_and_hardswish_is_deeplift(dynamo: bool) -> None:
    model = _swish_mlp()
    loaded = load_model(to_onnx(model, X[:1], opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu")
    loaded.check_sample(X.numpy())
    assert RescaleGraph.refusal(loaded.torch_hookable("deeplift_rescale"), "deeplift_rescale") is None
    ctx = AttributionContext(loaded, parse_players("features", (6,)), Target(), {})
    classes = np.array([0, 1, 2, 0, 1])
    got = get_method("deeplift_rescale").attribute(ctx, X.numpy(), X0.numpy(), classes)
    x, x0 = X.double().numpy(), X0.double().numpy()
    want = np.stack([_reference(model, x[k], x0[k], int(classes[k])) for k in range(len(x))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        delta = (model(X) - model(X0)).numpy()[np.arange(len(X)), classes]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-4, atol=1e-5)  # summation-to-delta


def test_the_derivative_where_a_unit_does_not_change_is_the_functions() -> None:
    z = torch.linspace(-5, 5, 41, dtype=torch.float64)
    sig = torch.sigmoid(z)
    np.testing.assert_allclose(_derivative(nn.SiLU(), z), sig * (1 + z * (1 - sig)), rtol=1e-12)
    inside = ((z > -3) & (z < 3)).double()
    want = torch.where(z >= 3, torch.ones_like(z), inside * (2 * z + 3) / 6)
    np.testing.assert_allclose(_derivative(nn.Hardswish(), z), want, rtol=1e-12)


def test_a_squeeze_and_excitation_gate_has_no_deeplift_rule() -> None:
    from tests.unit.methods.test_gates import SHAPE, _gated_net

    example = torch.zeros(1, *SHAPE)
    graph = load_model(to_onnx(_gated_net(), example), "onnx", "cpu").torch_hookable("deeplift_rescale")
    refusal = RescaleGraph.refusal(graph, "deeplift_rescale")
    assert refusal is not None and "Sigmoid" in refusal and "_2_gate_sigmoid" in refusal, refusal


def _silu_float(v: float) -> float:
    return v / (1.0 + math.exp(-v))


def _hardswish_float(v: float) -> float:
    return v * min(max(v + 3.0, 0.0), 6.0) / 6.0


ACTIVATION_TWINS = {"silu": (nn.SiLU, _silu_float), "hardswish": (nn.Hardswish, _hardswish_float)}


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("activation", sorted(ACTIVATION_TWINS))
def test_revealcancel_through_silu_and_hardswish_is_the_papers_rule(activation: str, dynamo: bool) -> None:
    module, function = ACTIVATION_TWINS[activation]
    torch.manual_seed(24)
    model = nn.Sequential(nn.Linear(6, 10), module(), nn.Linear(10, 8), module(), nn.Linear(8, 3)).eval()
    loaded = load_model(to_onnx(model, X[:1], opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu")
    loaded.check_sample(X.numpy())
    ctx = AttributionContext(loaded, parse_players("features", (6,)), Target(), {})
    classes = np.array([0, 1, 2, 0, 1])
    got = get_method("deeplift_revealcancel").attribute(ctx, X.numpy(), X0.numpy(), classes)
    twin = copy.deepcopy(model)
    twin[1], twin[3] = nn.ReLU(), nn.ReLU()  # the same affine layers, for their dense views
    layers = dense_layers(twin, (6,))
    x, x0 = X.double().numpy(), X0.double().numpy()
    want = np.stack([revealcancel_ref(layers, x[k], x0[k], int(classes[k]), function) for k in range(len(x))])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        delta = (model(X) - model(X0)).numpy()[np.arange(len(X)), classes]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-4, atol=1e-5)  # summation-to-delta
