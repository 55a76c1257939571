"""Mish, x tanh(softplus(x)) (YOLOv4's and CSPNet's activation), which torch's default exporter (the
dynamo exporter at opset 20) writes as one ONNX Mish node. onnx2torch has no converter for it, and
every gradient and rule method was refused on such a model. It is an activation that is its input
times a gate of it, as SiLU is: LRP passes relevance through it (Zennit's Pass), DeepLIFT Rescale and
RevealCancel take their rules with f = Mish (docs/science.md 5.8)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import dense_layers
from tests.unit.methods._zennit_reference import lrp_cases, passing, zennit_relevance
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import held_constant
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(5, 6, generator=torch.Generator().manual_seed(51)) * 2
X0 = torch.randn(5, 6, generator=torch.Generator().manual_seed(52))
CLASSES = np.array([0, 1, 2, 0, 1])


def _mish_mlp() -> nn.Sequential:
    torch.manual_seed(53)
    return nn.Sequential(nn.Linear(6, 10), nn.Mish(), nn.Linear(10, 8), nn.Mish(), nn.Linear(8, 3)).eval()


def _exported(model: nn.Module) -> bytes:
    """torch.onnx.export's defaults (the dynamo exporter, opset 20), with a dynamic batch."""
    return to_onnx(model, X[:2], opset=20, dynamo=True)


def _context(model: nn.Module, params: dict | None = None) -> AttributionContext:
    loaded = load_model(_exported(model), "onnx", "cpu")
    return AttributionContext(loaded, parse_players("features", (6,)), Target(), dict(params or {}))


def _mish(v: float) -> float:
    return v * math.tanh(math.log1p(math.exp(v)))


def test_the_export_writes_one_mish_node_that_converts() -> None:
    model = _mish_mlp()
    ops = [node.op_type for node in onnx.load_from_string(_exported(model)).graph.node]
    assert ops.count("Mish") == 2
    graph = _context(model).model.torch_differentiable()
    with torch.no_grad():
        np.testing.assert_allclose(graph(X).numpy(), model(X).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_lrp_passes_relevance_through_mish_as_zennit_does(name: str) -> None:
    model = _mish_mlp()
    params, rules = lrp_cases(3)[name]
    ctx = _context(model, params)
    assert "Mish's factor" in held_constant(ctx.model.torch_differentiable(), name)
    ours = get_method(name).attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), CLASSES)
    layers = [m for m in model if isinstance(m, nn.Linear)]
    want = zennit_relevance(model, passing(layers, rules, nn.Mish), X, CLASSES)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_rescale_through_mish_adds_up_to_the_output_change() -> None:
    model = _mish_mlp()
    got = get_method("deeplift_rescale").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    with torch.no_grad():
        delta = (model(X) - model(X0)).numpy()[np.arange(len(X)), CLASSES]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-4, atol=1e-5)  # summation-to-delta
    plain = get_method("gradient_x_input").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    assert np.abs(plain.sum(1) - delta).max() > 1e-2, "the case is one where the gradient does not add up"


def test_revealcancel_through_mish_is_the_papers_rule() -> None:
    model = _mish_mlp()
    got = get_method("deeplift_revealcancel").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    twin = nn.Sequential(model[0], nn.ReLU(), model[2], nn.ReLU(), model[4])  # flags the activations' layers
    layers = dense_layers(twin, (6,))
    x, x0 = X.double().numpy(), X0.double().numpy()
    want = np.stack([revealcancel_ref(layers, x[k], x0[k], int(CLASSES[k]), _mish) for k in range(len(x))])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
