"""A Tile of an activation is data movement for the rule methods (workers/methods/_fx_plan.py).

MONAI's V-Net repeats its one-channel input over the sixteen channels of its first block
(``x.repeat(1, 16, 1, 1, 1)``), and both exporters write that as a ``Tile``. Each output is a copy of
one input, as with an Expand, so its gradient sums the copies' relevance back; LRP, alpha-beta, Deep
Taylor and RevealCancel refused it by name. Here the copies tile a feature map 2x2
(``x.repeat(1, 1, 2, 2)``), whose twin is a circular pad by the map's own size: on the exported
graphs LRP-epsilon and RevealCancel must equal the per-unit references on its dense matrix."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._moves import (
    assert_lrp_epsilon_through_a_move,
    assert_revealcancel_equals_the_reference,
    cnn_around,
)

SHAPE = (1, 3, 3)


class _Tiled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1, 1, 2, 2)


def _cnn(twin: bool = False) -> nn.Sequential:
    return cnn_around(nn.CircularPad2d((0, 3, 0, 3)) if twin else _Tiled(), 72, seed=7)


def test_the_twin_is_the_same_function() -> None:
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        torch.testing.assert_close(_cnn()(x), _cnn(twin=True)(x))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_both_exporters_write_the_copies_as_a_tile(dynamo: bool) -> None:
    x = torch.randn(1, *SHAPE)
    graph = onnx.load_from_string(to_onnx(_cnn(), x, opset=18 if dynamo else 17, dynamo=dynamo)).graph
    assert "Tile" in {node.op_type for node in graph.node}


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_lrp_epsilon_sums_the_copies_relevance_back(dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_cnn(), _cnn(twin=True), SHAPE, dynamo)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_revealcancel_moves_parts_and_multipliers_through_the_copies(dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(_cnn(), _cnn(twin=True), SHAPE, dynamo)
