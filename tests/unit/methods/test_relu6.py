"""ReLU6 (MobileNetV2's activation) in the rule methods.

LRP: relevance passes it unchanged, as in the papers' layer-wise rules and Zennit's composites
(their Pass rule). Where a unit saturates (z > 6) its gradient is 0 and would drop the relevance the
layer above gave it; the references below fail such a gradient. RevealCancel: the paper's rule with
f = ReLU6, against the per-unit reference and summation-to-delta."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import STAB, alpha_beta_ref, deep_taylor_ref, lrp_epsilon_ref
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import AttributionContext, get_method
from workers.methods._modified_backward import RelevanceGraph
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(4, 6, generator=torch.Generator().manual_seed(11)) * 2


def _relu6_mlp() -> nn.Sequential:
    torch.manual_seed(12)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU6(), nn.Linear(10, 8), nn.ReLU6(), nn.Linear(8, 3)).eval()
    with torch.no_grad():
        for layer in model[:3:2]:
            layer.weight.mul_(4)  # units saturate: the case where ReLU6 differs from a ReLU
    return model


def _saturated(model: nn.Sequential, x: torch.Tensor) -> int:
    with torch.no_grad():
        z1 = model[0](x)
        z2 = model[2](model[1](z1))
    return int((z1 > 6).sum() + (z2 > 6).sum())


REFERENCES = {
    "lrp_epsilon": ({}, lambda ls, x, c: lrp_epsilon_ref(ls, x, c, STAB, cap=6.0)),
    "lrp_alpha_beta": (
        {"alpha": 2.0, "beta": 1.0},
        lambda ls, x, c: alpha_beta_ref(ls, x, c, 2.0, 1.0, cap=6.0),
    ),
    "deep_taylor": (
        {"low": -8.0, "high": 8.0},
        lambda ls, x, c: deep_taylor_ref(ls, x, c, -8.0, 8.0, cap=6.0),
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_lrp_rules_pass_relevance_through_relu6_as_the_papers_do(name: str) -> None:
    model = _relu6_mlp()
    assert _saturated(model, X) >= 4
    params, reference = REFERENCES[name]
    classes = np.array([0, 1, 2, 0])
    got = get_method(name).attribute(
        context(model, X, params=params), X.numpy(), np.zeros_like(X.numpy()), classes
    )
    twin = copy.deepcopy(model)
    twin[1], twin[3] = nn.ReLU(), nn.ReLU()  # the same affine layers, for their dense views
    layers = dense_layers(twin, (6,))
    flat = X.numpy().astype(np.float64)
    want = np.stack([reference(layers, flat[k], int(classes[k])) for k in range(len(X))])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_own_pass_equals_zennit_with_its_pass_rule(
    name: str, dynamo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(to_onnx(_relu6_mlp(), X, opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu")
    model.check_sample(X.numpy())
    ctx = AttributionContext(model, parse_players("features", (6,)), Target(), REFERENCES[name][0])
    x, classes = X.numpy(), np.array([2, 1, 0, 1])
    ours = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
    monkeypatch.setattr(RelevanceGraph, "build", classmethod(lambda cls, plan, rules: None))
    zennit = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
    assert np.abs(zennit).max() > 1e-3
    np.testing.assert_allclose(ours, zennit, rtol=1e-5, atol=1e-5)


def _relu6(v: float) -> float:
    return min(max(v, 0.0), 6.0)


@pytest.mark.parametrize("reference", ["zeros", "random"])
def test_revealcancel_matches_the_per_unit_reference_with_relu6(reference: str) -> None:
    model = _relu6_mlp()
    x0 = torch.zeros_like(X) if reference == "zeros" else X.flip(0) * 0.5
    classes = np.array([0, 1, 2, 0])
    got = get_method("deeplift_revealcancel").attribute(context(model, X), X.numpy(), x0.numpy(), classes)
    twin = copy.deepcopy(model)
    twin[1], twin[3] = nn.ReLU(), nn.ReLU()  # the same affine layers, for their dense views
    layers = dense_layers(twin, (6,))
    flat, flat0 = X.numpy().astype(np.float64), x0.numpy().astype(np.float64)
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k]), _relu6) for k in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", [False, True])
def test_revealcancel_through_relu6_adds_up_on_a_cnn(dynamo: bool) -> None:
    torch.manual_seed(13)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU6(), nn.Conv2d(4, 4, 3, stride=2), nn.ReLU6(),
        nn.Flatten(), nn.Linear(36, 3),
    ).eval()  # fmt: skip
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(14)) * 4
    x0 = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(15))
    model_bytes = to_onnx(model, x, opset=18 if dynamo else 17, dynamo=dynamo)
    loaded = load_model(model_bytes, "onnx", "cpu")
    loaded.check_sample(x.numpy())
    ctx = AttributionContext(loaded, parse_players("grid:2x2", (1, 8, 8)), Target(), {})
    classes = np.array([0, 1, 2, 1])
    got = get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), classes)
    with torch.no_grad():
        double = copy.deepcopy(model).double()
        delta = (double(x.double()) - double(x0.double())).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(got.reshape(4, -1).sum(1), delta, rtol=1e-5, atol=1e-5)


def _relu6(z: np.ndarray) -> np.ndarray:
    return np.clip(z, 0, 6)


def _relu6_slope(z: np.ndarray) -> np.ndarray:
    return ((z > 0) & (z < 6)).astype(float)


def rescale_ref(
    layers: list, x: np.ndarray, x0: np.ndarray, c: int, f: Any = _relu6, slope: Any = _relu6_slope
) -> np.ndarray:
    """DeepLIFT Rescale (Shrikumar et al. 2017, 3.5.2) with ``f`` (ReLU6) of derivative ``slope``,
    layer by layer in float64: the multiplier of each unit is (f(z) - f(z0)) / (z - z0), its
    gradient where z = z0."""
    acts, acts0, ratios = [x], [x0], []
    for w, b, act in layers:
        z, z0 = acts[-1] @ w + b, acts0[-1] @ w + b
        if act:
            y, y0, dz = f(z), f(z0), z - z0
            still = np.abs(dz) < 1e-10
            ratios.append(np.where(still, slope(z), (y - y0) / np.where(still, 1.0, dz)))
            acts.append(y)
            acts0.append(y0)
        else:
            ratios.append(np.ones_like(z))
            acts.append(z)
            acts0.append(z0)
    m = np.zeros(len(acts[-1]))
    m[c] = 1.0
    for (w, _, _), ratio in zip(reversed(layers), reversed(ratios), strict=True):
        m = w @ (m * ratio)
    return (x - x0) * m


@pytest.mark.parametrize("name", ["deeplift_rescale", "deepshap"])
def test_deeplift_rescale_takes_the_rescale_multiplier_at_relu6(name: str) -> None:
    model = _relu6_mlp()
    x0 = X.flip(0) * 0.5
    classes = np.array([0, 1, 2, 0])
    method = get_method(name)
    refs = x0.numpy() if name == "deeplift_rescale" else x0.numpy()[:1]  # DeepSHAP: one background row
    got = method.attribute(context(model, X), X.numpy(), refs, classes)
    twin = copy.deepcopy(model)
    twin[1], twin[3] = nn.ReLU(), nn.ReLU()
    layers = dense_layers(twin, (6,))
    flat = X.numpy().astype(np.float64)
    flat0 = np.broadcast_to(refs.astype(np.float64), flat.shape)
    want = np.stack([rescale_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # summation-to-delta, which Captum's gradient at the ReLU6 would break where units saturate
    with torch.no_grad():
        double = copy.deepcopy(model).double()
        delta = (double(X.double()) - double(torch.from_numpy(flat0.copy()))).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-5, atol=1e-5)
