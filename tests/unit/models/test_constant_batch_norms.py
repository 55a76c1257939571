"""Weight standardization converts (workers/models/constant_batch_norms.py).

timm's StdConv2d (BiT) and ScaledStdConv2d (NF-ResNet, NFNet) standardise their weight in the
forward pass with a batch norm in training mode; the legacy exporter writes it as such, which
onnx2torch refused, so no method ran on those models. Folded, the methods' graph equals
onnxruntime and every method gives the numbers of the same network with the standardised weights
as plain convolutions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from timm.layers import ScaledStdConv2d, StdConv2d
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import assert_same_attributions, context
from workers.models.constant_batch_norms import fold_constant_batch_norms
from workers.models.onnx_to_torch import onnx_to_torch

X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
METHODS = dict.fromkeys(["integrated_gradients", "lrp_epsilon", "lrp_alpha_beta", "deeplift_rescale"], 1e-5)


def _net(conv: type[nn.Conv2d]) -> nn.Sequential:
    torch.manual_seed(4)
    return nn.Sequential(
        conv(3, 8, 3, padding=1),
        nn.ReLU(),
        conv(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()


def _plain(model: nn.Sequential) -> nn.Sequential:
    """The same network with each convolution's standardised weight (the one timm's forward hands
    ``F.conv2d``) as a plain Conv2d's."""
    layers = []
    for layer in model:
        if isinstance(layer, nn.Conv2d):
            plain = nn.Conv2d(
                layer.in_channels, layer.out_channels, 3, padding=1, bias=layer.bias is not None
            )
            with torch.no_grad():
                plain.weight.copy_(_weight_used(layer))
                if layer.bias is not None:
                    plain.bias.copy_(layer.bias)
            layer = plain
        layers.append(layer)
    return nn.Sequential(*layers).eval()


def _weight_used(conv: nn.Conv2d) -> torch.Tensor:
    used: list[torch.Tensor] = []
    real = nn.functional.conv2d

    def spy(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
        used.append(weight.detach().clone())
        return real(x, weight, *args)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(nn.functional, "conv2d", spy)
        conv(torch.zeros(1, conv.in_channels, 4, 4))
    return used[0]


@pytest.mark.parametrize("conv", [StdConv2d, ScaledStdConv2d], ids=["bit", "nf"])
def test_standardised_weights_convert_and_give_the_plain_networks_attributions(conv: type[nn.Conv2d]) -> None:
    model = _net(conv)
    proto = onnx.load_from_string(to_onnx(model, X[:1]))
    assert any(n.op_type == "BatchNormalization" and len(n.output) > 1 for n in proto.graph.node), (
        "the legacy exporter writes the standardization as a training-mode batch norm"
    )
    with torch.no_grad():
        np.testing.assert_allclose(onnx_to_torch(proto)(X).numpy(), model(X).numpy(), rtol=1e-5, atol=1e-5)
    assert_same_attributions(context(model, X), context(_plain(model), X), X.numpy(), METHODS)


def test_a_training_mode_batch_norm_of_an_activation_is_left_alone() -> None:
    """Only batch norms over constants are computed ahead: one over the input stays as written."""
    make = onnx.helper
    stats = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("scale", "shift", "mean", "var")]
    norm = make.make_node(
        "BatchNormalization",
        ["x", "scale", "shift", "mean", "var"],
        ["y", "running_mean", "running_var"],
        training_mode=1,
    )
    value = make.make_tensor_value_info
    graph = make.make_graph(
        [norm],
        "g",
        [value("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [value("y", onnx.TensorProto.FLOAT, None)],
        stats,
    )
    model = make.make_model(graph, opset_imports=[make.make_opsetid("", 15)])
    assert fold_constant_batch_norms(model) == 0
    assert [n.op_type for n in model.graph.node] == ["BatchNormalization"]
