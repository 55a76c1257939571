"""LRP through ReLU6 (MobileNetV2's activation): relevance passes it unchanged, as in the papers'
layer-wise rules and Zennit's composites (their Pass rule). Where a unit saturates (z > 6) its
gradient is 0 and would drop the relevance the layer above gave it; the references below fail
such a gradient."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import STAB, alpha_beta_ref, deep_taylor_ref, lrp_epsilon_ref
from workers.methods import AttributionContext, get_method
from workers.methods._modified_backward import RelevanceGraph
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

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


def test_deeplift_revealcancel_still_refuses_relu6() -> None:
    with pytest.raises(NotApplicable, match=r"operator ReLU6 .* has no RevealCancel rule"):
        get_method("deeplift_revealcancel").attribute(
            context(_relu6_mlp(), X), X.numpy(), np.zeros_like(X.numpy()), np.zeros(4, np.int64)
        )
