"""The exact GELU the legacy exporter writes as five operators runs as one ``gelu`` in the methods'
graph (workers/models/gelu_fusion.py): the same outputs and gradients, a fifth less of a BERT pass."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import workers.models.onnx_to_torch as onnx_to_torch_module
from tests.models import to_onnx
from workers.models.gelu_fusion import fuse_gelu
from workers.models.onnx_to_torch import onnx_to_torch


class _Blocks(nn.Module):
    """GELUs, then a transpose and a global pool whose converter sizes itself from inferred shapes
    (as swin_t's head does)."""

    def __init__(self, scale: float = 0.5) -> None:
        super().__init__()
        self.conv, self.linear, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4, 8), nn.Linear(8, 3)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.conv(x)).permute(0, 2, 3, 1)
        h = self.linear(h)
        h = h * (torch.erf(h / 2**0.5) + 1) * self.scale  # GELU written out: fused only at 0.5
        pooled = nn.functional.adaptive_avg_pool2d(h.permute(0, 3, 1, 2), 1).flatten(1)
        return self.head(pooled)


def _proto(module: nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    return onnx.load_from_string(to_onnx(module.eval(), x))


def _unfused(proto: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> torch.nn.Module:
    with monkeypatch.context() as patch:
        patch.setattr(onnx_to_torch_module, "fuse_gelu", lambda model: 0)
        return onnx_to_torch(proto)


@pytest.mark.parametrize(("scale", "fused"), [(0.5, 2), (0.4, 1)])
def test_fused_gelus_give_onnxruntimes_outputs_and_the_same_gradients(
    scale: float, fused: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    proto = _proto(_Blocks(scale), x)
    lifted = onnx.ModelProto()
    lifted.CopyFrom(proto)
    onnx_to_torch_module._lift_constants(lifted)
    assert fuse_gelu(lifted) == fused  # x * (...) * 0.4 is not a GELU
    assert sum(n.op_type == "Erf" for n in lifted.graph.node) == 2 - fused
    graph, plain = onnx_to_torch(proto), _unfused(proto, monkeypatch)
    assert sum(type(m).__name__ == "Gelu" for m in graph.modules()) == fused
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {proto.graph.input[0].name: x.numpy()})[
        0
    ]
    rows = x.clone().requires_grad_(True)
    out = graph(rows)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(out[:, 0].sum(), rows)
    rows_plain = x.clone().requires_grad_(True)
    (grad_plain,) = torch.autograd.grad(plain(rows_plain)[:, 0].sum(), rows_plain)
    np.testing.assert_allclose(grad.numpy(), grad_plain.numpy(), rtol=1e-4, atol=1e-6)
