"""The per-unit references for a data-movement layer between two rule layers (a Resize, a pad): LRP's
gradient through it is LRP-0, so its reference composes the move's matrix into the layer after it;
RevealCancel moves a difference's parts through it, so its reference keeps the move as a layer."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import lrp_epsilon_ref
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import get_method

__all__ = ["assert_lrp_epsilon_through_a_move", "assert_revealcancel_equals_the_reference", "cnn_around"]


def cnn_around(move: nn.Module, features: int, seed: int) -> nn.Sequential:
    """A 1-channel CNN with ``move`` between its two convolutions (3 then 2 channels, padded) and a
    Linear of the ``features`` after it to 3 classes; biases drawn so that the ReLUs cut."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        move,
        nn.Conv2d(3, 2, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(features, 3),
    )
    with torch.no_grad():
        for layer in (model[0], model[3]):
            layer.bias.uniform_(-0.3, 0.3)
    return model.eval()


def _rows(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(4, *shape, generator=torch.Generator().manual_seed(seed))


def assert_lrp_epsilon_through_a_move(
    model: nn.Module, twin: nn.Sequential, shape: tuple[int, ...], dynamo: bool
) -> None:
    """LRP-epsilon on ``model`` exported equals the reference on ``twin`` (the same function as a
    Sequential dense_layers reads: a rule layer, the move, a rule layer, ...)."""
    x, classes = _rows(shape, 1), np.array([2, 0, 1, 1])
    ctx = context(model, x[:1], dynamo=dynamo)
    got = get_method("lrp_epsilon").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    first, move, after, *rest = dense_layers(twin, shape)
    layers = [first, (move[0] @ after[0], after[1], after[2]), *rest]  # x M W + b: no bias in M
    flat = x.numpy().reshape(4, -1).astype(np.float64)
    want = np.stack([lrp_epsilon_ref(layers, flat[k], int(classes[k]), 1e-6) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)


def assert_revealcancel_equals_the_reference(
    model: nn.Module, twin: nn.Sequential, shape: tuple[int, ...], dynamo: bool
) -> None:
    """RevealCancel on ``model`` exported equals the per-unit reference on ``twin`` (any Sequential
    dense_layers reads, a move or none among its layers)."""
    x, x0, classes = _rows(shape, 2), _rows(shape, 3), np.array([0, 1, 2, 0])
    ctx = context(model, x[:1], dynamo=dynamo)
    got = get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), classes)
    layers = dense_layers(twin, shape)
    flat, flat0 = (t.numpy().reshape(4, -1).astype(np.float64) for t in (x, x0))
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)
