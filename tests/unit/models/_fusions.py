"""What a fusion of the methods' graph must keep (tests/unit/models/test_gelu_fusion.py,
test_norm_fusion.py): onnxruntime's outputs, and the gradients of the graph converted without it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import workers.models.onnx_to_torch as onnx_to_torch_module


def lifted(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` with its constants lifted to initializers, as the fusions read it."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    onnx_to_torch_module._lift_constants(copy)
    return copy


def assert_fused_as_written(
    proto: onnx.ModelProto,
    x: torch.Tensor,
    fusion: str,
    module: str,
    count: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The methods' graph of ``proto`` holds ``count`` modules named ``module``, gives onnxruntime's
    outputs on ``x``, and the gradients of the graph converted without ``fusion`` (the name of the
    fusing function in workers.models.onnx_to_torch)."""
    graph = onnx_to_torch_module.onnx_to_torch(proto)
    with monkeypatch.context() as patch:
        patch.setattr(onnx_to_torch_module, fusion, lambda model: 0)
        plain = onnx_to_torch_module.onnx_to_torch(proto)
    assert sum(type(m).__name__ == module for m in graph.modules()) == count
    session = ort.InferenceSession(proto.SerializeToString())
    want = session.run(None, {proto.graph.input[0].name: x.numpy()})[0]
    rows = x.clone().requires_grad_(True)
    out = graph(rows)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(out[:, 0].sum(), rows)
    rows_plain = x.clone().requires_grad_(True)
    (grad_plain,) = torch.autograd.grad(plain(rows_plain)[:, 0].sum(), rows_plain)
    np.testing.assert_allclose(grad.numpy(), grad_plain.numpy(), rtol=1e-4, atol=1e-6)
