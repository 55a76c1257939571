"""LRP through a local response norm (ONNX's LRN: AlexNet's, GoogLeNet's and CaffeNet's in the ONNX
Model Zoo, tf2onnx's ``tf.nn.local_response_normalization``), its divisor held constant as a layer
norm's scale is (docs/science.md 5.8): relevance passes through it unchanged. Before, LRP, alpha-beta
and Deep Taylor refused the model, naming the norm."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from tests.unit.methods._zennit_reference import lrp_cases, passing, zennit_relevance
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import held_constant
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(41))
SIZE, ALPHA, BETA, K = 5, 1.0, 0.75, 2.0  # alpha large enough that the divisor varies


class _HeldResponseNorm(nn.Module):
    """The norm with its divisor held: z / d(z), d(z) = (k + alpha / size * the sum of z^2 over the
    channels around each, zeros past the ends) ^ beta, written channel by channel."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        channels = z.shape[1]
        sums = [
            z[:, max(0, c - SIZE // 2) : min(channels, c + (SIZE - 1) // 2 + 1)].square().sum(1)
            for c in range(channels)
        ]
        divisor = (K + ALPHA / SIZE * torch.stack(sums, 1)).pow(BETA)
        return z / divisor.detach()


def _twin() -> nn.Sequential:
    torch.manual_seed(42)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), _HeldResponseNorm(), nn.MaxPool2d(2),
        nn.Conv2d(8, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3),
    ).eval()  # fmt: skip


def _lrn_model(twin: nn.Sequential) -> bytes:
    """The twin's network with an ONNX LRN node, as the Model Zoo's converters wrote it."""
    conv1, conv2, fc = twin[0], twin[4], twin[8]
    weights = {
        "W1": conv1.weight, "B1": conv1.bias, "W2": conv2.weight, "B2": conv2.bias, "W3": fc.weight, "B3": fc.bias,
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["input", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("LRN", ["r1"], ["n1"], size=SIZE, alpha=ALPHA, beta=BETA, bias=K),
        helper.make_node("MaxPool", ["n1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "W3", "B3"], ["output"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "lrn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w.detach().numpy(), name) for name, w in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _context(data: bytes, params: dict) -> AttributionContext:
    return AttributionContext(
        load_model(data, "onnx", "cpu"), parse_players("grid:2x2", (3, 8, 8)), Target(), params
    )


def test_the_twin_computes_the_model() -> None:
    twin = _twin()
    model = load_model(_lrn_model(twin), "onnx", "cpu")
    with torch.no_grad():
        want = twin(X).numpy()
    np.testing.assert_allclose(model.predict(X.numpy()), want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        without = nn.Sequential(*twin[:2], *twin[3:])(X).numpy()
    assert not np.allclose(want, without, rtol=0.1), "the norm changes the model's outputs"


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_lrp_holds_the_divisor_as_zennit_does_on_the_held_twin(name: str) -> None:
    twin = _twin()
    params, rules = lrp_cases(3)[name]
    ctx = _context(_lrn_model(twin), params)
    assert "local response norms' divisors" in held_constant(ctx.model.torch_differentiable(), name)
    layers = [m for m in twin.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    classes = np.array([0, 1, 2, 1])
    ours = get_method(name).attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), classes)
    want = zennit_relevance(twin, passing(layers, rules, _HeldResponseNorm), X, classes)
    assert np.abs(want).max() > 1e-3
    # the divisor is computed two ways in float32; epsilon's small denominators magnify that
    np.testing.assert_allclose(ours, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_relevance_is_conserved_through_the_norm() -> None:
    """With no biases, LRP-epsilon's input relevance sums to the explained score."""
    twin = _twin()
    with torch.no_grad():
        for layer in (twin[0], twin[4], twin[8]):
            layer.bias.zero_()
    ctx = _context(_lrn_model(twin), {})
    classes = np.array([0, 1, 2, 1])
    relevance = get_method("lrp_epsilon").attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), classes)
    with torch.no_grad():
        scores = twin(X).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(relevance.reshape(4, -1).sum(1), scores, rtol=1e-4, atol=1e-6)


def test_other_rule_methods_still_name_the_norm() -> None:
    """DeepLIFT has no rule for a norm: its own passes refuse it, and Rescale goes to Captum."""
    ctx = _context(_lrn_model(_twin()), {})
    x = X.numpy()
    with pytest.raises(Exception, match=r"LocalResponseNorm|LRN"):
        get_method("deeplift_revealcancel").attribute(ctx, x, np.zeros_like(x), np.zeros(4, np.int64))
    assert onnx.load_from_string(_lrn_model(_twin())).graph.node[2].op_type == "LRN"
