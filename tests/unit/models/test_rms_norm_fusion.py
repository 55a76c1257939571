"""The RMS normalisation both exporters write out (Pow, ReduceMean, Add, Sqrt, a reciprocal) runs as
one ``RMSNorm`` in the methods' graph (workers/models/rms_norm_fusion.py): the same outputs and
gradients; a mean over another axis, or a different power, is left as written."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import workers.models.onnx_to_torch as onnx_to_torch_module
from tests.models import to_onnx
from workers.models.onnx_to_torch import onnx_to_torch
from workers.models.rms_norm_fusion import fuse_rms_norm


class _Normed(nn.Module):
    """Two RMS norms as Llama writes them (x * rsqrt(...), a weight), one as x / sqrt(...), and two
    look-alikes that are not RMS norms: over the tokens' axis, and a cube."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.weight = nn.Parameter(1 + 0.5 * torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        h = torch.relu(self.b(h))
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6)  # over the tokens: not fused
        h = h * torch.rsqrt(h.pow(3).mean(-1, keepdim=True).abs() + 1e-6)  # a cube: not fused
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.head(h.mean(1))


def _unfused(proto: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> torch.nn.Module:
    with monkeypatch.context() as patch:
        patch.setattr(onnx_to_torch_module, "fuse_rms_norm", lambda model: 0)
        return onnx_to_torch(proto)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_fused_rms_norms_give_onnxruntimes_outputs_and_the_same_gradients(
    dynamo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(3))
    proto = onnx.load_from_string(to_onnx(_Normed().eval(), x[:2], opset=18 if dynamo else 17, dynamo=dynamo))
    lifted = onnx.ModelProto()
    lifted.CopyFrom(proto)
    onnx_to_torch_module._lift_constants(lifted)
    assert fuse_rms_norm(lifted) == 3
    assert sum(n.op_type == "Pow" for n in lifted.graph.node) == 2  # the tokens' and the cube's
    graph, plain = onnx_to_torch(proto), _unfused(proto, monkeypatch)
    assert sum(type(m).__name__ == "RMSNorm" for m in graph.modules()) == 3
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
