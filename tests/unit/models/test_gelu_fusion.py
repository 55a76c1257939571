"""The exact GELU the legacy exporter writes as five operators runs as one ``gelu`` in the methods'
graph (workers/models/gelu_fusion.py): the same outputs and gradients, a fifth less of a BERT pass."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.models._fusions import assert_fused_as_written, lifted
from workers.models.gelu_fusion import fuse_gelu


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


@pytest.mark.parametrize(("scale", "fused"), [(0.5, 2), (0.4, 1)])
def test_fused_gelus_give_onnxruntimes_outputs_and_the_same_gradients(
    scale: float, fused: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    proto = _proto(_Blocks(scale), x)
    copy = lifted(proto)
    assert fuse_gelu(copy) == fused  # x * (...) * 0.4 is not a GELU
    assert sum(n.op_type == "Erf" for n in copy.graph.node) == 2 - fused
    assert_fused_as_written(proto, x, "fuse_gelu", "Gelu", fused, monkeypatch)
