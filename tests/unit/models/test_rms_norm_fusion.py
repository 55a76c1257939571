"""The RMS normalisation both exporters write out (Pow, ReduceMean, Add, Sqrt, a reciprocal) runs as
one ``RMSNorm`` in the methods' graph (workers/models/rms_norm_fusion.py): the same outputs and
gradients; a mean over another axis, or a different power, is left as written."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.models._fusions import assert_fused_as_written, lifted
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


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_fused_rms_norms_give_onnxruntimes_outputs_and_the_same_gradients(
    dynamo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(3))
    proto = onnx.load_from_string(to_onnx(_Normed().eval(), x[:2], opset=18 if dynamo else 17, dynamo=dynamo))
    copy = lifted(proto)
    assert fuse_rms_norm(copy) == 3
    assert sum(n.op_type == "Pow" for n in copy.graph.node) == 2  # the tokens' and the cube's
    assert_fused_as_written(proto, x, "fuse_rms_norm", "RMSNorm", 3, monkeypatch)
