"""Padding that copies values (edge and reflect modes) is data movement for the rule methods
(workers/methods/_fx_plan.py).

MONAI's BasicUNet pads each skip connection with ``replicate`` before concatenating it with the
upsampled map (its UpCat; the pads are often 0, but the node is there), and LRP refused every one.
Each padded value is a copy of one input value: the gradient takes relevance and multipliers back to
it. LRP-epsilon against the per-unit reference with the pad composed into the layer after it (the
gradient is LRP-0 on the pad), RevealCancel with the pad as its own layer, from both exporters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.unit.methods._moves import (
    assert_lrp_epsilon_through_a_move,
    assert_revealcancel_equals_the_reference,
)

SHAPE = (1, 3, 3)
PADS = {"replicate": nn.ReplicationPad2d, "reflect": nn.ReflectionPad2d}
CASES = [
    pytest.param(mode, dynamo, id=f"{mode}-{'dynamo' if dynamo else 'legacy'}")
    for mode in sorted(PADS)
    for dynamo in (False, True)
]


def _padded_cnn(mode: str) -> nn.Sequential:
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        PADS[mode](1),
        nn.Conv2d(3, 2, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(18, 3),
    )
    with torch.no_grad():
        for layer in (model[0], model[3]):
            layer.bias.uniform_(-0.3, 0.3)
    return model.eval()


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_lrp_epsilon_takes_relevance_back_to_the_copied_values(mode: str, dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_padded_cnn(mode), _padded_cnn(mode), SHAPE, dynamo)


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_revealcancel_moves_parts_and_multipliers_through_the_pad(mode: str, dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(_padded_cnn(mode), _padded_cnn(mode), SHAPE, dynamo)
