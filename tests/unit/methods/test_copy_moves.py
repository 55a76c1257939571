"""An Expand or a Tile of an activation is data movement for the rule methods
(workers/methods/_fx_plan.py).

Grouped-query attention (Llama, Mistral, Qwen2: transformers' ``repeat_kv``) expands each key and
value head to the query heads that share it, and both exporters write that as an ``Expand``; MONAI's
V-Net repeats its one-channel input over the sixteen channels of its first block
(``x.repeat(1, 16, 1, 1, 1)``), which both write as a ``Tile``. Each output is a copy of one input, as
a tensor read by several layers is, so its gradient sums the copies' relevance back. The rule methods
refused both by name. Here the copies make a nearest 2x upsampling
(``x[..., None, :, None].expand(...)``), whose twin is ``nn.Upsample``, and a 2x2 tiling
(``x.repeat(1, 1, 2, 2)``), whose twin is a circular pad by the map's own size: on the exported
graphs LRP-epsilon and RevealCancel must equal the per-unit references on the twin's dense matrix."""

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


class _Copied(nn.Module):
    """Each value copied to a 2x2 block by an Expand: nearest upsampling written as repeat_kv is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, channels, height, width = x.shape
        copies = x[:, :, :, None, :, None].expand(rows, channels, height, 2, width, 2)
        return copies.reshape(rows, channels, 2 * height, 2 * width)


class _Tiled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1, 1, 2, 2)


# operator -> (the move, its twin)
MOVES = {
    "Expand": (_Copied, lambda: nn.Upsample(scale_factor=2, mode="nearest")),
    "Tile": (_Tiled, lambda: nn.CircularPad2d((0, 3, 0, 3))),
}
EXPORTERS = pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
OPERATORS = pytest.mark.parametrize("op", list(MOVES))


def _cnn(op: str, twin: bool = False) -> nn.Sequential:
    move, its_twin = MOVES[op]
    return cnn_around(its_twin() if twin else move(), 72, seed=6)


@OPERATORS
def test_the_twin_is_the_same_function(op: str) -> None:
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        torch.testing.assert_close(_cnn(op)(x), _cnn(op, twin=True)(x))


@EXPORTERS
@OPERATORS
def test_both_exporters_write_the_copies_as_the_operator(op: str, dynamo: bool) -> None:
    x = torch.randn(1, *SHAPE)
    graph = onnx.load_from_string(to_onnx(_cnn(op), x, opset=18 if dynamo else 17, dynamo=dynamo)).graph
    assert op in {node.op_type for node in graph.node}


@EXPORTERS
@OPERATORS
def test_lrp_epsilon_sums_the_copies_relevance_back(op: str, dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_cnn(op), _cnn(op, twin=True), SHAPE, dynamo)


@EXPORTERS
@OPERATORS
def test_revealcancel_moves_parts_and_multipliers_through_the_copies(op: str, dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(_cnn(op), _cnn(op, twin=True), SHAPE, dynamo)
