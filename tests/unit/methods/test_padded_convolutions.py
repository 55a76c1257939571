"""A convolution with asymmetric zero padding (TF's "same": timm's tf_ models, EfficientDet): torch's
dynamo exporter folds the Pad into the Conv's pads, onnx2torch writes that Conv back as a Sequential of
a Pad and the layer, and the rule methods refused the Sequential. The graph now calls its parts in
turn (workers/models/onnx_to_torch.py) and a zero Pad is data movement (workers/methods/_fx_plan.py):
attributions equal the per-unit references on the dense matrices of the pad and the layer."""

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

SHAPE = (1, 5, 5)


def _same_padded() -> nn.Sequential:
    torch.manual_seed(6)
    model = nn.Sequential(
        nn.ZeroPad2d((0, 1, 0, 1)),  # TF's "same" for a 2x2 kernel at stride 2 on 5x5
        nn.Conv2d(1, 3, 2, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(27, 4),
        nn.ReLU(),
        nn.Linear(4, 3),
    )
    with torch.no_grad():
        model[1].bias.uniform_(-0.3, 0.3)
    return model.eval()


X = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(2))


def test_the_exporter_folds_the_pad_into_the_convolution() -> None:
    nodes = onnx.load_from_string(to_onnx(_same_padded(), X[:1], opset=18, dynamo=True)).graph.node
    pads = [
        list(n.attribute[i].ints)
        for n in nodes
        if n.op_type == "Conv"
        for i in range(len(n.attribute))
        if n.attribute[i].name == "pads"
    ]
    assert pads == [[0, 0, 1, 1]] and "Pad" not in {n.op_type for n in nodes}


@pytest.mark.parametrize("name", ["lrp_epsilon", "deeplift_revealcancel"])
def test_rules_pass_the_padding_and_apply_to_the_convolution(name: str) -> None:
    model = _same_padded()
    classes = np.array([0, 2, 1, 1])
    x0 = np.zeros_like(X.numpy()) if name == "lrp_epsilon" else 0.5 * X.numpy()[::-1].copy()
    got = get_method(name).attribute(context(model, X[:1], dynamo=True), X.numpy(), x0, classes)
    layers = dense_layers(model, SHAPE)
    flat, flat0 = X.numpy().reshape(4, -1).astype(np.float64), x0.reshape(4, -1).astype(np.float64)
    if name == "lrp_epsilon":
        want = np.stack([lrp_epsilon_ref(layers, flat[k], int(classes[k]), 1e-6) for k in range(4)])
    else:
        want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)
