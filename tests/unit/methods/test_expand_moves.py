"""An Expand of an activation is data movement for the rule methods (workers/methods/_fx_plan.py).

Grouped-query attention (Llama, Mistral, Qwen2: transformers' ``repeat_kv``) expands each key and
value head to the query heads that share it, and both exporters write that as an ``Expand``. Each
output is a copy of one input, as a tensor read by several layers is, so its gradient sums the
copies' relevance back. The rule methods refused it by name. Here the copies make a nearest 2x
upsampling (``x[..., None, :, None].expand(...)``), whose twin is ``nn.Upsample``: on the exported
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


class _Copied(nn.Module):
    """Each value copied to a 2x2 block by an Expand: nearest upsampling written as repeat_kv is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, channels, height, width = x.shape
        copies = x[:, :, :, None, :, None].expand(rows, channels, height, 2, width, 2)
        return copies.reshape(rows, channels, 2 * height, 2 * width)


def _cnn(twin: bool = False) -> nn.Sequential:
    return cnn_around(nn.Upsample(scale_factor=2, mode="nearest") if twin else _Copied(), 72, seed=6)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_both_exporters_write_the_copies_as_an_expand(dynamo: bool) -> None:
    x = torch.randn(1, *SHAPE)
    graph = onnx.load_from_string(to_onnx(_cnn(), x, opset=18 if dynamo else 17, dynamo=dynamo)).graph
    assert "Expand" in {node.op_type for node in graph.node}


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_lrp_epsilon_sums_the_copies_relevance_back(dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_cnn(), _cnn(twin=True), SHAPE, dynamo)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_revealcancel_moves_parts_and_multipliers_through_the_copies(dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(_cnn(), _cnn(twin=True), SHAPE, dynamo)
