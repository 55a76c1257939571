"""``torch.stack(parts).sum(0)`` is a sum of activations for the rule methods (workers/methods/_fx_plan.py).

segmentation_models_pytorch's FPN merges its pyramid so, and both exporters write it as a ReduceSum
over axis 0 of a Concat of activations each unsqueezed at 0. A ReduceSum over axis 0 is refused
elsewhere (axis 0 is the batch there); here it is the stacking axis, and the result is the parts'
sum. Every rule method must give what it gives on the twin that adds the parts with ``+``, a
residual sum each is checked on against its reference (Zennit, Captum, the per-unit references)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from workers.methods import get_method
from workers.methods._rescale_graph import RescaleGraph

SHAPE = (1, 6, 6)
METHODS = ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_rescale", "deeplift_revealcancel"]


class _Pyramid(nn.Module):
    """Two branches, merged by a stacked sum (or by ``+``: the twin)."""

    def __init__(self, stacked: bool) -> None:
        super().__init__()
        torch.manual_seed(9)
        self.stacked = stacked
        self.left, self.right = nn.Conv2d(1, 3, 3, padding=1), nn.Conv2d(1, 3, 3, padding=1)
        self.head = nn.Linear(3 * 36, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.relu(self.left(x)), torch.relu(self.right(x))]
        merged = torch.stack(parts).sum(0) if self.stacked else parts[0] + parts[1]
        return self.head(merged.flatten(1))


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(seed))


def test_the_exporters_write_a_reduce_sum_over_a_stack() -> None:
    for dynamo in (False, True):
        graph = onnx.load_from_string(
            to_onnx(_Pyramid(True).eval(), _rows(0)[:1], opset=18, dynamo=dynamo)
        ).graph
        ops = [node.op_type for node in graph.node]
        assert "ReduceSum" in ops and "Concat" in ops and "Add" not in ops


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", METHODS)
def test_a_stacked_sum_gives_what_the_sum_gives(name: str, dynamo: bool) -> None:
    x, x0 = _rows(1), _rows(2) * 0.5
    classes = np.array([0, 1, 2, 1])
    got, want = (
        get_method(name).attribute(
            context(_Pyramid(stacked).eval(), x[:1], dynamo=dynamo), x.numpy(), x0.numpy(), classes
        )
        for stacked in (True, False)
    )
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_deeplift_runs_its_own_pass_on_it() -> None:
    """Not Captum's, which would pass the same gradient here: the plan admits the stacked sum."""
    ctx = context(_Pyramid(True).eval(), _rows(0)[:1])
    assert RescaleGraph.build(ctx.model.torch_hookable("deeplift_rescale"), "deeplift_rescale") is not None
