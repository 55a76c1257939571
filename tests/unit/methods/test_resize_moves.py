"""A nearest or linear Resize is data movement for the rule methods (workers/methods/_fx_plan.py).

U-Net decoders (segmentation_models_pytorch's, upsampling by nearest neighbour), torchvision's FCN
and LR-ASPP heads (bilinear) and HRNet's fusions upsample with a Resize whose size the exporters
compute from the input's shape at run time. The rule methods refused it by name, so LRP, Deep Taylor
and RevealCancel were not applicable to any of them. Each output of a nearest Resize is a copy of one
input, each of a linear one a mean of neighbours with weights >= 0: a pooling in reverse. On the
exported graphs LRP-epsilon and RevealCancel must equal the per-unit references on the Resize's
dense matrix, from both exporters. LRP takes the Resize back by its gradient, which is LRP-0 on it
and makes the epsilon rule of the layer after it the rule of that layer composed with the Resize:
its reference composes the two matrices."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from tests.unit.methods._moves import (
    assert_lrp_epsilon_through_a_move,
    assert_revealcancel_equals_the_reference,
    cnn_around,
)
from workers.methods import get_method
from xaudit.contract.errors import NotApplicable

SHAPE = (1, 3, 3)
CASES = [
    pytest.param(mode, dynamo, id=f"{mode}-{'dynamo' if dynamo else 'legacy'}")
    for mode in ("nearest", "bilinear")
    for dynamo in (False, True)
]


class _Doubled(nn.Module):
    """Upsampling to twice the input's size, the size read from the input (torchvision's FCN head and
    segmentation_models_pytorch's decoders do the same), so that the exporters compute it at run time."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(x.shape[-2] * 2, x.shape[-1] * 2), mode=self.mode)


def _upsampling_cnn(mode: str, twin: bool = False) -> nn.Sequential:
    """3x3 maps upsampled to 6x6 after a ReLU, as a U-Net decoder does; ``twin``: the same model with
    nn.Upsample (the same map, which the references can read off)."""
    return cnn_around(nn.Upsample(scale_factor=2, mode=mode) if twin else _Doubled(mode), 72, seed=5)


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_lrp_epsilon_passes_relevance_back_through_the_upsampling(mode: str, dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_upsampling_cnn(mode), _upsampling_cnn(mode, twin=True), SHAPE, dynamo)


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_revealcancel_moves_parts_and_multipliers_through_the_upsampling(mode: str, dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(
        _upsampling_cnn(mode), _upsampling_cnn(mode, twin=True), SHAPE, dynamo
    )


def test_the_exporters_compute_the_size_at_run_time() -> None:
    """What the rule must not depend on: the legacy exporter reads the input's shape for the size, and
    the twin the references read computes the same function."""
    graph = onnx.load_from_string(to_onnx(_upsampling_cnn("nearest"), _rows(0)[:1])).graph
    ops = [node.op_type for node in graph.node]
    assert "Resize" in ops and "Shape" in ops
    x = _rows(0)
    for mode in ("nearest", "bilinear"):
        torch.testing.assert_close(_upsampling_cnn(mode)(x), _upsampling_cnn(mode, twin=True)(x))


def test_a_cubic_upsampling_is_refused_by_name() -> None:
    """Cubic interpolation weighs neighbours with negative weights: not a move, and no rule here."""
    model = _upsampling_cnn("bicubic")
    x = _rows(4)
    ctx = context(model, x[:1])
    with pytest.raises(NotApplicable, match="OnnxResize"):
        get_method("lrp_epsilon").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), np.zeros(4, int))
