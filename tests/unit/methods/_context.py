"""Attribution contexts over exported test models, and dense views of them for slow references."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from tests.models import to_onnx, to_torchscript
from workers.methods import AttributionContext, get_method
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

__all__ = ["Dense", "assert_same_attributions", "context", "dense_layers", "pooled_cnn"]


def context(
    module: nn.Module,
    example: torch.Tensor,
    fmt: str = "onnx",
    params: Mapping[str, Any] | None = None,
    target: Target | None = None,
    dynamo: bool = False,
) -> AttributionContext:
    """A context over ``module`` exported as ``fmt`` (onnx | torchscript; ``dynamo``: torch's dynamo
    ONNX exporter at opset 18 instead of the legacy one) and loaded on CPU."""
    if fmt == "onnx":
        data = to_onnx(module, example, opset=18, dynamo=True) if dynamo else to_onnx(module, example)
    else:
        data = to_torchscript(module, example)
    model = load_model(data, fmt, "cpu")
    model.check_sample(example.numpy())
    players = parse_players("features" if example.ndim == 2 else "grid:2x2", tuple(example.shape[1:]))
    return AttributionContext(model, players, target or Target(), dict(params or {}))


def assert_same_attributions(
    ctx: AttributionContext, twin: AttributionContext, x: np.ndarray, methods: Mapping[str, float]
) -> None:
    """Each of ``methods`` gives ``ctx`` the attributions it gives ``twin`` (zero baseline, the classes
    ``ctx``'s model predicts), to rtol 1e-4 and an atol of the method's share of the largest one."""
    classes = ctx.model.predict(x).argmax(1)
    for name, share in methods.items():
        got = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
        want = get_method(name).attribute(twin, x, np.zeros_like(x), classes)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=share * np.abs(want).max(), err_msg=name)


def pooled_cnn(
    middle: Callable[[], nn.Module], channels: int, seed: int, relu_first: bool = True
) -> nn.Sequential:
    """Conv (``channels`` in, 8 out), a ReLU where ``relu_first``, the block ``middle()``, Conv, ReLU,
    global average pooling and a Linear head to 3 classes, made after ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        *([nn.ReLU()] if relu_first else []),
        middle(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()


Dense = tuple[np.ndarray, np.ndarray, bool]  # W (in, out) with z_j = sum_i a_i W[i, j] + b_j; b; ReLU after


def dense_layers(model: nn.Sequential, sample_shape: tuple[int, ...]) -> list[Dense]:
    """Every affine layer of a Sequential of Linear, Conv, ConvTranspose2d, (Adaptive)AvgPool, padding
    (zero, replicate, reflect, circular), Upsample, ReLU and Flatten as a dense float64 matrix.

    Convolution and average pooling are affine maps; the matrix is read off by probing with unit inputs.
    """
    layers: list[Dense] = []
    shape = sample_shape
    with torch.no_grad():
        for module in model:
            if isinstance(module, nn.ReLU):
                w, b, _ = layers[-1]
                layers[-1] = (w, b, True)
            elif isinstance(module, nn.Flatten):
                shape = (int(np.prod(shape)),)
            elif isinstance(
                module,
                nn.Linear
                | nn.Conv1d
                | nn.Conv2d
                | nn.ConvTranspose2d
                | nn.AvgPool2d
                | nn.AdaptiveAvgPool2d
                | nn.ZeroPad2d
                | nn.ReplicationPad2d
                | nn.ReflectionPad2d
                | nn.CircularPad2d
                | nn.Upsample,
            ):
                size = int(np.prod(shape))
                basis = torch.eye(size, dtype=torch.float64).reshape(size, *shape)
                double = module.double()
                zero = double(torch.zeros(1, *shape, dtype=torch.float64))
                out = double(basis) - zero
                module.float()
                layers.append((out.reshape(size, -1).numpy(), zero.reshape(-1).numpy(), False))
                shape = tuple(zero.shape[1:])
            else:
                raise TypeError(f"no dense view of {type(module).__name__}")
    return layers
