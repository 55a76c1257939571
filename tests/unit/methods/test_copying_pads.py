"""Padding that copies values (edge and reflect modes) is data movement for the rule methods
(workers/methods/_fx_plan.py).

MONAI's BasicUNet pads each skip connection with ``replicate`` before concatenating it with the
upsampled map (its UpCat; the pads are often 0, but the node is there), and LRP refused every one.
Each padded value is a copy of one input value: the gradient takes relevance and multipliers back to
it. LRP-epsilon against the per-unit reference with the pad composed into the layer after it (the
gradient is LRP-0 on the pad), RevealCancel with the pad as its own layer, from both exporters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import lrp_epsilon_ref
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import get_method

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


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_lrp_epsilon_takes_relevance_back_to_the_copied_values(mode: str, dynamo: bool) -> None:
    model, x = _padded_cnn(mode), _rows(1)
    classes = np.array([2, 0, 1, 1])
    got = get_method("lrp_epsilon").attribute(
        context(model, x[:1], dynamo=dynamo), x.numpy(), np.zeros_like(x.numpy()), classes
    )
    first, pad, after, *rest = dense_layers(model, SHAPE)
    layers = [first, (pad[0] @ after[0], after[1], after[2]), *rest]  # x P W + b: no bias in P
    flat = x.numpy().reshape(4, -1).astype(np.float64)
    want = np.stack([lrp_epsilon_ref(layers, flat[k], int(classes[k]), 1e-6) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("mode", "dynamo"), CASES)
def test_revealcancel_moves_parts_and_multipliers_through_the_pad(mode: str, dynamo: bool) -> None:
    model, x, x0 = _padded_cnn(mode), _rows(2), _rows(3)
    classes = np.array([0, 1, 2, 0])
    got = get_method("deeplift_revealcancel").attribute(
        context(model, x[:1], dynamo=dynamo), x.numpy(), x0.numpy(), classes
    )
    layers = dense_layers(model, SHAPE)
    flat, flat0 = (t.numpy().reshape(4, -1).astype(np.float64) for t in (x, x0))
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)
