"""Each affine layer of a RevealCancel plan as the maps its rules need: W, |W| and their transposes,
at the plan's dtype (float64 plans: W da only, :func:`affine_maps`), with a small convolution's maps
as dense products where that is cheaper."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from workers.methods._transposed import transposed_convolution
from workers.models.dense_conv import dense_matrix

__all__ = ["AffineMaps", "Transpose", "affine_maps", "dense_maps"]

LinearMap = Callable[[torch.Tensor], torch.Tensor]
# (g, like) -> W^T g shaped like the layer's input ``like``.
Transpose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# oneDNN's convolution vectorises over input channels: with fewer than this many per group (a first
# layer on one or three channels) its forward pass ran 1.6x slower than the dense product here.
_FEW_CHANNELS = 4


@dataclass(frozen=True)
class AffineMaps:
    """An affine layer at one dtype: ``full`` with bias, ``linear`` (W) and ``magnitude`` (|W|) without,
    and their transposes (vector-Jacobian products). Average pooling (W >= 0) is used as it is:
    its |W| is W and its transposes come from autograd. ``fan_in``: terms per output (0: unknown);
    ``dense_forward``: W and |W| too are cheaper as dense products (few input channels);
    ``rounded_magnitude``: |W| |da| is rounded more coarsely than W da (float64 plans: affine_maps)."""

    full: LinearMap
    linear: LinearMap
    magnitude: LinearMap
    linear_t: Transpose
    magnitude_t: Transpose
    fan_in: int = 0
    dense_forward: bool = False
    rounded_magnitude: bool = False


def _autograd_transpose(fn: LinearMap) -> Transpose:
    def transpose(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        u = torch.zeros_like(like, dtype=grad.dtype, requires_grad=True)  # like: the shape only
        with torch.enable_grad():
            (out,) = torch.autograd.grad(fn(u), u, grad)
        return out

    return transpose


def _conv_transpose(module: nn.Module, weight: Callable[[], torch.Tensor]) -> Transpose | None:
    """W^T g of a zero-padded convolution by its input-gradient kernel (no forward pass, no graph);
    ``weight`` gives W. None for other layers (a transposed convolution's: autograd's)."""
    if not isinstance(module, _CONV):
        return None
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        return None
    grad_input = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}  # type: ignore[attr-defined]
    fn = grad_input[len(module.kernel_size)]

    def transpose(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return fn(like.shape, weight(), grad, module.stride, module.padding, module.dilation, module.groups)

    return transpose


# Float64 convolutions have no oneDNN kernel. torch's fallback multiplies one sample at a time, a
# matrix product with as many columns as output positions: on small maps (ResNet's last stages,
# 2x2 and 4x4 at 64x64 inputs) a few columns. Up to this many positions per sample, one product over
# the whole batch (unfold on the way in) ran 2-5x faster here (512 channels at 2x2: 21 instead of
# 103 ms, 32 rows); at 8x8 it ran 1.7x slower.
_FEW_POSITIONS = 16


def _batched(module: nn.Conv2d, weight: torch.Tensor, kernel: LinearMap) -> LinearMap:
    """``kernel`` (x -> W x) of a Conv2d (zero padding, one group), as one matrix product over every
    row where a sample's output has few positions."""
    padding = module.padding
    assert not isinstance(padding, str)  # affine_maps admits numeric padding only
    geometry = {
        "kernel_size": module.kernel_size,
        "dilation": module.dilation,
        "padding": padding,
        "stride": module.stride,
    }
    by_output = weight.reshape(len(weight), -1)  # (C_out, C_in * k * k)

    def forward(x: torch.Tensor) -> torch.Tensor:
        k = len(x)
        out_shape = _output_shape(x.shape[2:], **geometry)
        positions = out_shape[0] * out_shape[1]
        if positions > _FEW_POSITIONS:
            return kernel(x)
        columns = F.unfold(x, **geometry)  # (k, C_in * k * k, positions)
        flat = columns.transpose(0, 1).reshape(columns.shape[1], k * positions)
        out = (by_output @ flat).reshape(len(weight), k, positions).transpose(0, 1)
        return out.reshape(k, len(weight), *out_shape)

    return forward


def _output_shape(
    size: torch.Size,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
) -> tuple[int, int]:
    """A 2-d convolution's output map on an input map of ``size`` (torch's formula)."""
    rows, cols = (
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, p, d, k, s in zip(size, padding, dilation, kernel_size, stride, strict=True)
    )
    return rows, cols


def affine_maps(module: nn.Module, dtype: torch.dtype) -> AffineMaps:
    """Maps of a Linear, Conv1d/2d/3d or ConvTranspose1d/2d/3d module with its weights in ``dtype``;
    any other module is taken to be an average pooling (linear, W >= 0, dtype-agnostic) and used as
    it is.

    In float64 only W da (and the layer with its bias) is computed in float64: its sign, and through
    it the sign of every difference, routes multipliers back (docs/science.md 5.8). |W| |da| and both
    transposes take float64 tensors and return float64 ones but multiply in float32, where torch has
    fast kernels: |W| |da| is a sum of non-negative terms, so its rounding stays within a relative
    2**-24 per term, and the transposes are linear in the multipliers; no sign depends on either."""
    if isinstance(module, nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d):
        return _maps_at(module, dtype)  # in float64 too: its products are few (U-Net decoders)
    if not isinstance(module, (nn.Linear, *_CONV)):
        transpose = _autograd_transpose(module)
        return AffineMaps(module, module, module, transpose, transpose, 0)
    plain = _maps_at(module, dtype)
    if dtype != torch.float64:
        return plain
    single = _maps_at(module, torch.float32)
    linear = plain.linear
    # Float64 convolutions: small maps as one product over the batch (_FEW_POSITIONS).
    if (
        isinstance(module, nn.Conv2d)
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    ):
        linear = _batched(module, module.weight.detach().to(dtype), linear)
    return replace(
        plain,
        linear=linear,
        magnitude=_in_float32(single.magnitude),
        linear_t=_in_float32_t(single.linear_t),
        magnitude_t=_in_float32_t(single.magnitude_t),
        rounded_magnitude=True,
    )


_Layer = (
    nn.Linear
    | nn.Conv1d
    | nn.Conv2d
    | nn.Conv3d
    | nn.ConvTranspose1d
    | nn.ConvTranspose2d
    | nn.ConvTranspose3d
)


def _maps_at(module: _Layer, dtype: torch.dtype) -> AffineMaps:
    """Every map of ``module`` in ``dtype``."""
    weight = module.weight.detach().to(dtype)
    bias = None if module.bias is None else module.bias.detach().to(dtype)
    # |W| on first use: a float64 plan takes its |W| from the float32 maps (affine_maps), and the
    # reference pass reads only the layer itself. Made up front, a float64 |W| no product read was
    # allocated and dropped for every layer: 0.8 GB at once for VGG11's 102M-weight Linear.
    magnitude = cache(weight.abs)
    if isinstance(module, nn.Linear):
        return AffineMaps(
            lambda x: F.linear(x, weight, bias),
            lambda x: F.linear(x, weight),
            lambda x: F.linear(x, magnitude()),
            lambda g, like: g @ weight,
            lambda g, like: g @ magnitude(),
            weight.shape[1],
        )
    transposed = not isinstance(module, _CONV)
    # _conv_forward handles every padding mode; each is linear in the input for a fixed weight
    conv = module._conv_forward if not transposed else partial(transposed_convolution, module)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return conv(x, weight, None)

    def absolute(x: torch.Tensor) -> torch.Tensor:
        return conv(x, magnitude(), None)

    # A transposed convolution's transposes by autograd; its fan-in (the terms of one output) at most
    # its input channels per group times its kernel's size, as a convolution's is exactly.
    per_group = module.in_channels // module.groups
    return AffineMaps(
        lambda x: conv(x, weight, bias),
        linear,
        absolute,
        _conv_transpose(module, lambda: weight) or _autograd_transpose(linear),
        _conv_transpose(module, magnitude) or _autograd_transpose(absolute),
        per_group * math.prod(module.kernel_size),
        not transposed and per_group < _FEW_CHANNELS,
    )


def _in_float32(fn: LinearMap) -> LinearMap:
    def single(x: torch.Tensor) -> torch.Tensor:
        return fn(x.float()).to(x.dtype)

    return single


def _in_float32_t(fn: Transpose) -> Transpose:
    def single(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return fn(g.float(), like).to(g.dtype)  # ``like`` gives only the shape

    return single


def dense_maps(maps: AffineMaps, like: torch.Tensor) -> AffineMaps:
    """``maps`` of a convolution on inputs shaped like ``like`` (k, ...) with both transposes, and where
    ``maps.dense_forward`` W and |W| too, as products with its dense matrix, where that is cheaper
    (workers.models.dense_conv); ``maps`` itself otherwise. |W|'s matrix is |W's matrix|: each
    (input, output) pair of a convolution meets one kernel tap at most. The dense product sums the
    same terms as the kernel (the others are exact zeros), so the rounding bounds of the rules hold
    unchanged."""
    rows = dense_matrix(maps.linear, like, maps.fan_in)
    if rows is None:
        return maps
    magnitude = rows.abs()
    dense = replace(maps, linear_t=_transpose(rows), magnitude_t=_transpose(magnitude))
    if not maps.dense_forward:
        return dense
    shape = maps.linear(like[:1]).shape[1:]
    # W and |W| from the same matrix in the same dtype: |W| |da| is no longer rounded more coarsely.
    return replace(
        dense, linear=_forward(rows, shape), magnitude=_forward(magnitude, shape), rounded_magnitude=False
    )


def _transpose(matrix: torch.Tensor) -> Transpose:
    def transpose(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return F.linear(g.reshape(len(g), -1), matrix).reshape(like.shape)

    return transpose


def _forward(matrix: torch.Tensor, shape: torch.Size) -> LinearMap:
    by_output = matrix.t().contiguous()  # F.linear's (out, in) layout

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.reshape(len(x), -1), by_output).reshape(len(x), *shape)

    return forward
