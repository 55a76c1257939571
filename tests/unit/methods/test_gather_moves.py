"""A gather at constant indices is data movement for the rule methods (workers/methods/_fx_plan.py).

torch's dynamo exporter writes an adaptive average pooling whose output size does not divide its
input's (torchvision VGG's 7x7 pool on a small image) as Transpose -> GatherND -> Transpose ->
ReduceMean: the windows gathered, then averaged. The pool is a linear map with overlapping windows;
RevealCancel and LRP-epsilon on the exported graph must equal the per-unit references on its dense
matrix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import lrp_epsilon_ref
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import get_method

SHAPE = (1, 3, 3)


def _pooled_cnn() -> nn.Sequential:
    """3x3 maps pooled to 2x2 (windows rows/cols 0-1 and 1-2: they overlap)."""
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(12, 5),
        nn.ReLU(),
        nn.Linear(5, 3),
    )
    with torch.no_grad():
        model[0].bias.uniform_(-0.3, 0.3)
    return model.eval()


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(seed))


def test_the_exporter_writes_the_pool_as_a_gather() -> None:
    graph = onnx.load_from_string(to_onnx(_pooled_cnn(), _rows(0)[:1], opset=18, dynamo=True)).graph
    assert "GatherND" in {node.op_type for node in graph.node}


@pytest.mark.parametrize("reference", ["zeros", "rows"])
def test_revealcancel_moves_parts_and_multipliers_through_the_gather(reference: str) -> None:
    model, x = _pooled_cnn(), _rows(1)
    x0 = torch.zeros_like(x) if reference == "zeros" else _rows(2)
    classes = np.array([0, 1, 2, 0])
    ctx = context(model, x[:1], dynamo=True)
    got = get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), classes)
    layers = dense_layers(model, SHAPE)
    flat, flat0 = (t.numpy().reshape(4, -1).astype(np.float64) for t in (x, x0))
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)


def test_lrp_epsilon_passes_relevance_through_the_gather() -> None:
    model, x = _pooled_cnn(), _rows(3)
    classes = np.array([2, 0, 1, 1])
    ctx = context(model, x[:1], dynamo=True)
    got = get_method("lrp_epsilon").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    layers = dense_layers(model, SHAPE)
    flat = x.numpy().reshape(4, -1).astype(np.float64)
    want = np.stack([lrp_epsilon_ref(layers, flat[k], int(classes[k]), 1e-6) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)
