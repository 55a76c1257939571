"""Each affine layer of a RevealCancel plan as the maps its rules need: W, |W| and their transposes,
at one dtype, with a convolution's transposes as dense products where that is cheaper."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AffineMaps", "Transpose", "affine_maps", "dense_transposes"]

LinearMap = Callable[[torch.Tensor], torch.Tensor]
# (g, like) -> W^T g shaped like the layer's input ``like``.
Transpose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# A convolution's transposes become one matrix product when its dense matrix is small and not much
# larger than the kernel's work: n_in / fan_in is how many times more multiplications it does, and a
# single-threaded BLAS product beats the input-gradient kernel by about that much on small layers.
_DENSE_ELEMENTS = 2**20
_DENSE_RATIO = 8
# Larger inputs' matrices go in bands of the first spatial axis (each band meets few outputs): half
# the multiplications of the whole matrix for a 3x3 convolution on 8x8 maps, measured 1.5x faster.
_BANDS = 4
_BAND_MIN_INPUTS = 256


@dataclass(frozen=True)
class AffineMaps:
    """An affine layer at one dtype: ``full`` with bias, ``linear`` (W) and ``magnitude`` (|W|) without,
    and their transposes (vector-Jacobian products). Average pooling (W >= 0) is used as it is:
    its |W| is W and its transposes come from autograd. ``fan_in``: terms per output (0: unknown)."""

    full: LinearMap
    linear: LinearMap
    magnitude: LinearMap
    linear_t: Transpose
    magnitude_t: Transpose
    fan_in: int = 0


def _autograd_transpose(fn: LinearMap) -> Transpose:
    def transpose(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        u = torch.zeros_like(like, requires_grad=True)
        with torch.enable_grad():
            (out,) = torch.autograd.grad(fn(u), u, grad)
        return out

    return transpose


def _conv_transpose(module: nn.Module, weight: torch.Tensor) -> Transpose | None:
    """W^T g of a zero-padded convolution by its input-gradient kernel (no forward pass, no graph)."""
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        return None
    grad_input = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}  # type: ignore[attr-defined]
    fn = grad_input[weight.ndim - 2]

    def transpose(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return fn(like.shape, weight, grad, module.stride, module.padding, module.dilation, module.groups)

    return transpose


def affine_maps(module: nn.Module, dtype: torch.dtype) -> AffineMaps:
    """Maps of a Linear or Conv1d/2d/3d module with its weights in ``dtype``; any other module is taken
    to be an average pooling (linear, W >= 0, dtype-agnostic) and used as it is."""
    if not isinstance(module, (nn.Linear, *_CONV)):
        transpose = _autograd_transpose(module)
        return AffineMaps(module, module, module, transpose, transpose, 0)
    weight = module.weight.detach().to(dtype)
    bias = None if module.bias is None else module.bias.detach().to(dtype)
    magnitude = weight.abs()
    if isinstance(module, nn.Linear):
        return AffineMaps(
            lambda x: F.linear(x, weight, bias),
            lambda x: F.linear(x, weight),
            lambda x: F.linear(x, magnitude),
            lambda g, like: g @ weight,
            lambda g, like: g @ magnitude,
            weight.shape[1],
        )
    conv = module._conv_forward  # handles every padding mode; linear in the input for a fixed weight

    def linear(x: torch.Tensor) -> torch.Tensor:
        return conv(x, weight, None)

    def absolute(x: torch.Tensor) -> torch.Tensor:
        return conv(x, magnitude, None)

    return AffineMaps(
        lambda x: conv(x, weight, bias),
        linear,
        absolute,
        _conv_transpose(module, weight) or _autograd_transpose(linear),
        _conv_transpose(module, magnitude) or _autograd_transpose(absolute),
        weight[0].numel(),
    )


def dense_transposes(maps: AffineMaps, like: torch.Tensor) -> AffineMaps:
    """``maps`` of a convolution on inputs shaped like ``like`` (k, ...) with both transposes as
    products with its dense matrix (read off by probing with unit inputs), where that is cheaper
    (_DENSE_RATIO); ``maps`` itself otherwise. |W|'s matrix is |W's matrix|: each (input, output)
    pair of a convolution meets one kernel tap at most."""
    n_in = like[0].numel()
    if maps.fan_in in (0, n_in) or n_in > _DENSE_RATIO * maps.fan_in:  # (n_in: a Linear already is)
        return maps
    probe = torch.eye(n_in, dtype=like.dtype, device=like.device).reshape(n_in, *like.shape[1:])
    rows = maps.linear(probe).reshape(n_in, -1)  # row i: the outputs of unit input i
    if rows.numel() > _DENSE_ELEMENTS:
        return maps
    bands = _bands(rows, tuple(like.shape[1:]))
    if bands is None:
        return replace(maps, linear_t=_product(rows), magnitude_t=_product(rows.abs()))
    return replace(maps, linear_t=_banded(rows, *bands), magnitude_t=_banded(rows.abs(), *bands))


def _product(matrix: torch.Tensor) -> Transpose:
    def transpose(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return F.linear(g.reshape(len(g), -1), matrix).reshape(like.shape)

    return transpose


def _bands(
    rows: torch.Tensor, sample_shape: tuple[int, ...]
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor] | None:
    """The dense matrix cut into _BANDS bands of the input's first spatial axis, each with only the
    outputs it meets (a convolution's receptive fields are local): (inputs, outputs) per band and
    the permutation back to input order; None where that does not save half the multiplications
    (or the input is small, where the gathers cost more than they save)."""
    n_in = rows.shape[0]
    if len(sample_shape) < 2 or n_in < _BAND_MIN_INPUTS:
        return None
    index = torch.arange(n_in, device=rows.device).reshape(sample_shape)
    size = sample_shape[1]
    bands = []
    for b in range(_BANDS):
        inputs = index[:, b * size // _BANDS : (b + 1) * size // _BANDS].reshape(-1)
        if len(inputs):
            bands.append((inputs, (rows[inputs] != 0).any(dim=0).nonzero().flatten()))
    if 2 * sum(len(i) * len(o) for i, o in bands) > rows.numel():
        return None
    return bands, torch.argsort(torch.cat([i for i, _ in bands]))


def _banded(
    matrix: torch.Tensor, bands: list[tuple[torch.Tensor, torch.Tensor]], order: torch.Tensor
) -> Transpose:
    blocks = [(outputs, matrix[inputs][:, outputs].contiguous()) for inputs, outputs in bands]

    def transpose(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        flat = g.reshape(len(g), -1)
        parts = [F.linear(flat.index_select(1, outputs), block) for outputs, block in blocks]
        return torch.cat(parts, dim=1).index_select(1, order).reshape(like.shape)

    return transpose
