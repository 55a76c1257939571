"""Small convolutions' input gradients as dense products: the same gradient as the kernel's, and
the rule methods that use them give the same relevance either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import CNN_SHAPE, relu_cnn, to_onnx
from tests.unit.methods._context import context
from workers.methods import get_method
from workers.models import dense_conv
from workers.models.dense_conv import MIN_ROWS, affine_with_dense_backward, dense_matrix

CONVS = {
    # (module, sample shape, dense?): small layers, strided, dilated, grouped, 1-d; one too wide.
    "first": (nn.Conv2d(1, 8, 3, padding=1), (1, 8, 8), True),
    "strided": (nn.Conv2d(8, 16, 3, stride=2, padding=1), (8, 8, 8), True),
    "dilated": (nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2), (4, 6, 6), True),
    "grouped": (nn.Conv2d(4, 8, 3, padding=1, groups=2), (4, 4, 4), True),
    "conv1d": (nn.Conv1d(16, 8, 3, padding=1), (16, 20), True),
    "wide": (nn.Conv2d(2, 4, 3, padding=1), (2, 16, 16), False),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_the_gradient_is_the_kernels(name: str) -> None:
    torch.manual_seed(0)
    module, shape, dense = CONVS[name]
    x = torch.randn(MIN_ROWS + 3, *shape)
    weight, bias = module.weight.detach(), module.bias.detach()
    assert (
        dense_matrix(lambda u: module._conv_forward(u, weight, None), x, weight[0].numel()) is not None
    ) == dense
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = affine_with_dense_backward(module, a, weight, bias)
    want = module._conv_forward(b, weight, bias)
    torch.testing.assert_close(ours, want)
    g = torch.randn_like(want)
    (got,) = torch.autograd.grad(ours, a, g)
    (expected,) = torch.autograd.grad(want, b, g)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_rule_methods_give_the_same_relevance_with_the_kernel(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = relu_cnn(3)
    x = torch.randn(2 * MIN_ROWS, *CNN_SHAPE, generator=torch.Generator().manual_seed(1))
    refs, classes = np.zeros_like(x.numpy()), np.arange(2 * MIN_ROWS) % 3
    ctx = context(model, x[:1])
    dense = get_method(name).attribute(ctx, x.numpy(), refs, classes)
    monkeypatch.setattr(dense_conv, "MIN_ROWS", 10**9)  # every call takes the kernel
    kernel = get_method(name).attribute(ctx, x.numpy(), refs, classes)
    np.testing.assert_allclose(dense, kernel, rtol=1e-4, atol=1e-5 * np.abs(kernel).max())


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "named"])
def test_converted_graphs_take_the_dense_gradient_with_the_same_result(fmt: str) -> None:
    # Every conversion: an ONNX model's graph, a TorchScript model's hookable graph (exported to ONNX
    # at audit time), and the graph shared by a named-input model's bindings.
    from tests.models import to_torchscript
    from workers.models import load_model
    from workers.models.dense_conv import DenseGradientConv2d
    from workers.models.onnx_to_torch import onnx_to_torch
    from xaudit.contract.onnx_checks import parse_onnx

    torch.manual_seed(2)
    module, example = relu_cnn(5), torch.randn(1, *CNN_SHAPE)
    data = to_onnx(module, example)
    if fmt == "onnx":
        graph = load_model(data, "onnx", "cpu").torch_differentiable()
    elif fmt == "named":
        from workers.models.named import OnnxGraph

        onnx_graph = OnnxGraph(data, "sha", torch.device("cpu"))
        graph = onnx_graph.torch_graph(onnx_graph.outputs[0])
    else:
        scripted = load_model(to_torchscript(module, example), "torchscript", "cpu")
        scripted.check_sample(example.numpy())  # the example the audit-time export traces
        graph = scripted.torch_hookable("lrp_epsilon")
    convs = [m for m in graph.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(isinstance(m, DenseGradientConv2d) for m in convs)  # still Conv2d to hooks
    plain = onnx_to_torch(parse_onnx(data))
    x = torch.randn(2 * MIN_ROWS, *CNN_SHAPE)
    grads = []
    for g in (graph, plain):
        u = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(g(u)[:, 0].sum(), u)
        grads.append(grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    assert convs[1]._dense_cache["matrix"] is not None  # the dense path ran (and keeps its matrix)


@pytest.mark.parametrize("name", ["lrp_alpha_beta", "deep_taylor", "lrp_epsilon"])
def test_rule_layers_probe_each_dense_matrix_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights a rule derives (W+, W-, stacked) are built once per layer, so the dense matrix of
    a derived weight is probed once, not on every call (the same relevance every time)."""
    model = relu_cnn(4)
    x = torch.randn(2 * MIN_ROWS, *CNN_SHAPE, generator=torch.Generator().manual_seed(3))
    refs, classes = np.zeros_like(x.numpy()), np.arange(2 * MIN_ROWS) % 3
    ctx = context(model, x[:1])
    probes: list[int] = []
    probe = dense_conv.dense_matrix
    monkeypatch.setattr(dense_conv, "dense_matrix", lambda *a, **k: probes.append(1) or probe(*a, **k))
    first = get_method(name).attribute(ctx, x.numpy(), refs, classes)
    after_first = len(probes)
    again = [get_method(name).attribute(ctx, x.numpy(), refs, classes) for _ in range(3)]
    assert 0 < after_first <= 2 * sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert len(probes) == after_first
    for other in again:
        np.testing.assert_array_equal(other, first)


def test_a_matrix_too_large_is_refused_before_it_is_probed() -> None:
    # 2,048 inputs within 8x the fan-in (288), but 2,048 x 2,048 entries: over the matrix budget. The
    # probe would run the layer on 2,048 unit rows (at 224x224, resnet18's last layers: 25,088 rows
    # of 25,088, 27 s and a 7.7 GB peak) to learn that; one row tells the matrix's width.
    conv = nn.Conv2d(32, 32, 3, padding=1)
    rows: list[int] = []

    def linear(x: torch.Tensor) -> torch.Tensor:
        rows.append(len(x))
        return conv._conv_forward(x, conv.weight.detach(), None)

    assert dense_matrix(linear, torch.zeros(MIN_ROWS, 32, 8, 8), conv.weight[0].numel()) is None
    assert rows == [1]
    rows.clear()
    small = torch.zeros(MIN_ROWS, 32, 4, 4)  # 512 x 512 entries: built, from 512 unit rows
    matrix = dense_matrix(linear, small, conv.weight[0].numel())
    assert matrix is not None and matrix.shape == (512, 512) and rows == [1, 512]
