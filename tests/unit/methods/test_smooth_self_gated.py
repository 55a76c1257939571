"""Smooth activations that are their input times a positive gate of it, as SiLU is, each written as one
ONNX node by torch's default exporter (the dynamo exporter at opset 20):

- Mish, x tanh(softplus(x)) (YOLOv4's and CSPNet's), which onnx2torch has no converter for: every
  gradient and rule method was refused on such a model;
- the exponential linear units ELU (MONAI's V-Net's default), SELU and CELU, x times 1 or a positive
  (e^x - 1) / x, which the rule methods refused by name;
- GELU, x Phi(x), exact or tanh-approximated, which LRP held but DeepLIFT Rescale sent to Captum's
  (its gradient) and RevealCancel refused.

LRP passes relevance through them (Zennit's Pass), DeepLIFT Rescale and RevealCancel take their rules
with f the activation (docs/science.md 5.8)."""

from __future__ import annotations

import math
from collections.abc import Callable

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


_SELU_SCALE, _SELU_ALPHA = 1.0507009873554805, 1.6732632423543772


def _mish(v: float) -> float:
    return v * math.tanh(math.log1p(math.exp(v)))


def _elu(v: float, alpha: float = 1.0) -> float:
    return v if v > 0 else alpha * math.expm1(v)


# name -> (the module, its ONNX operator, the function for the per-unit reference)
ACTIVATIONS: dict[str, tuple[Callable[[], nn.Module], str, Callable[[float], float]]] = {
    "mish": (nn.Mish, "Mish", _mish),
    "elu": (nn.ELU, "Elu", _elu),
    "selu": (nn.SELU, "Selu", lambda v: _SELU_SCALE * _elu(v, _SELU_ALPHA)),
    "celu": (lambda: nn.CELU(1.5), "Celu", lambda v: 1.5 * _elu(v / 1.5)),
    "gelu": (nn.GELU, "Gelu", lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2)))),
    "gelu_tanh": (
        lambda: nn.GELU(approximate="tanh"),
        "Gelu",
        lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    ),
}


def _mlp(activation: str) -> nn.Sequential:
    make = ACTIVATIONS[activation][0]
    torch.manual_seed(53)
    return nn.Sequential(nn.Linear(6, 10), make(), nn.Linear(10, 8), make(), nn.Linear(8, 3)).eval()


def _exported(model: nn.Module) -> bytes:
    """torch.onnx.export's defaults (the dynamo exporter, opset 20), with a dynamic batch."""
    return to_onnx(model, X[:2], opset=20, dynamo=True)


def _context(model: nn.Module, params: dict | None = None) -> AttributionContext:
    loaded = load_model(_exported(model), "onnx", "cpu")
    return AttributionContext(loaded, parse_players("features", (6,)), Target(), dict(params or {}))


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_the_export_writes_one_node_per_activation_that_converts(activation: str) -> None:
    model = _mlp(activation)
    ops = [node.op_type for node in onnx.load_from_string(_exported(model)).graph.node]
    assert ops.count(ACTIVATIONS[activation][1]) == 2
    graph = _context(model).model.torch_differentiable()
    with torch.no_grad():
        np.testing.assert_allclose(graph(X).numpy(), model(X).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_lrp_passes_relevance_through_the_activation_as_zennit_does(name: str, activation: str) -> None:
    model = _mlp(activation)
    params, rules = lrp_cases(3)[name]
    ctx = _context(model, params)
    kind = type(model[1])
    assert f"{kind.__name__}'s factor" in held_constant(ctx.model.torch_differentiable(), name)
    ours = get_method(name).attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), CLASSES)
    layers = [m for m in model if isinstance(m, nn.Linear)]
    want = zennit_relevance(model, passing(layers, rules, kind), X, CLASSES)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_rescale_through_the_activation_adds_up_to_the_output_change(activation: str) -> None:
    model = _mlp(activation)
    got = get_method("deeplift_rescale").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    with torch.no_grad():
        delta = (model(X) - model(X0)).numpy()[np.arange(len(X)), CLASSES]
    np.testing.assert_allclose(got.sum(1), delta, rtol=1e-4, atol=1e-5)  # summation-to-delta
    plain = get_method("gradient_x_input").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    assert np.abs(plain.sum(1) - delta).max() > 1e-2, "the case is one where the gradient does not add up"


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_revealcancel_through_the_activation_is_the_papers_rule(activation: str) -> None:
    model = _mlp(activation)
    got = get_method("deeplift_revealcancel").attribute(_context(model), X.numpy(), X0.numpy(), CLASSES)
    twin = nn.Sequential(model[0], nn.ReLU(), model[2], nn.ReLU(), model[4])  # flags the activations' layers
    layers = dense_layers(twin, (6,))
    x, x0 = X.double().numpy(), X0.double().numpy()
    want = np.stack(
        [
            revealcancel_ref(layers, x[k], x0[k], int(CLASSES[k]), ACTIVATIONS[activation][2])
            for k in range(len(x))
        ]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
