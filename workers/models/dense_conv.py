"""Small convolutions as dense matrix products, where one single-threaded BLAS product beats the
convolution kernels on the CPU.

oneDNN's input-gradient kernel is slow on small layers: on the build machine, the digits CNN's
second convolution (8 -> 16 channels, 8x8 maps) took 10.9 ms for 1,024 rows, its dense transpose
1.9 ms. The dense matrix of a layer has n_in rows, so it pays where n_in is within a small factor of
the kernel's fan-in and the matrix is small; it is read off by probing the layer with unit inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MIN_ROWS", "affine_with_dense_backward", "dense_gradients", "dense_matrix"]

# A product with the matrix does n_in / fan_in times the kernel's multiplications; BLAS beats the
# kernel by about this much on small layers.
_DENSE_RATIO = 8
_DENSE_ELEMENTS = 2**20
# Below this many rows the matrix (built once per call) costs more than it saves.
MIN_ROWS = 32


def dense_matrix(
    linear: Callable[[torch.Tensor], torch.Tensor], like: torch.Tensor, fan_in: int
) -> torch.Tensor | None:
    """The matrix (n_in, n_out) of the linear map ``linear`` on inputs shaped like ``like`` (k, ...):
    row i is the output of unit input i. None where a product with it would not be cheaper than the
    kernel (fan-in unknown or too small against n_in, or the matrix too large)."""
    n_in = like[0].numel()
    if fan_in in (0, n_in) or n_in > _DENSE_RATIO * fan_in:  # (fan_in == n_in: a Linear already is)
        return None
    with torch.no_grad():
        # The matrix's width from one row before the probe: resnet18's last convolutions at 224x224
        # (25,088 inputs) were probed with a 2.5 GB identity, 27 s and a 7.7 GB peak, to learn that
        # their matrix was too large.
        if n_in * linear(like[:1]).numel() > _DENSE_ELEMENTS:
            return None
        probe = torch.eye(n_in, dtype=like.dtype, device=like.device).reshape(n_in, *like.shape[1:])
        return linear(probe).reshape(n_in, -1)


class _DenseInputGradient(torch.autograd.Function):
    """The convolution's value; its input gradient as a product with the dense matrix."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, value: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(matrix)
        ctx.shape = a.shape
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (matrix,) = ctx.saved_tensors
        return F.linear(grad.reshape(len(grad), -1), matrix).reshape(ctx.shape), None, None


def affine_with_dense_backward(
    conv: nn.Module,
    a: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cache: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``conv`` (Conv1d/2d/3d) applied to ``a`` with ``weight`` and ``bias``; the gradient to ``a`` a
    dense product where that is cheaper (:func:`dense_matrix`), the kernel's wherever a gradient to
    the weight or bias is wanted. ``cache``: keeps the last matrix for this weight (held, so that
    its identity cannot be reused) and input shape."""
    forward: Callable[..., torch.Tensor] = conv._conv_forward  # type: ignore[assignment]
    wanted = weight.requires_grad or (bias is not None and bias.requires_grad)
    # CPU only: the measurements behind it are oneDNN's; cuDNN's kernels are another matter.
    skip = a.device.type != "cpu" or len(a) < MIN_ROWS or wanted
    if skip or not a.requires_grad or not torch.is_grad_enabled():
        return forward(a, weight, bias)
    key = (weight, a.shape[1:], a.dtype, a.device)
    hit = cache is not None and cache.get("key") is not None and _same(cache["key"], key)
    if hit:
        assert cache is not None
        matrix = cache["matrix"]
    else:
        matrix = dense_matrix(lambda x: forward(x, weight.detach(), None), a, weight[0].numel())
        if cache is not None:
            cache.update(key=key, matrix=matrix)
    if matrix is None:
        return forward(a, weight, bias)
    with torch.no_grad():
        value = forward(a, weight, bias)
    out: torch.Tensor = _DenseInputGradient.apply(a, value, matrix)
    return out


def _same(held: tuple[Any, ...], key: tuple[Any, ...]) -> bool:
    return held[0] is key[0] and held[1:] == key[1:]


class _DenseGradientConv:
    """A convolution module whose input gradient is a dense product where cheaper; same parameters,
    same value, same class checks (a subclass of the torch class it replaces)."""

    _dense_cache: dict[str, Any]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        conv = cast(nn.Conv2d, self)  # or Conv1d/Conv3d: the same attributes
        return affine_with_dense_backward(conv, input, conv.weight, conv.bias, self._dense_cache)


class DenseGradientConv1d(_DenseGradientConv, nn.Conv1d):
    pass


class DenseGradientConv2d(_DenseGradientConv, nn.Conv2d):
    pass


class DenseGradientConv3d(_DenseGradientConv, nn.Conv3d):
    pass


_SUBCLASS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: DenseGradientConv1d,
    nn.Conv2d: DenseGradientConv2d,
    nn.Conv3d: DenseGradientConv3d,
}


def dense_gradients(graph: nn.Module) -> nn.Module:
    """Give every plain Conv1d/2d/3d of ``graph`` the dense input gradient, in place (their class
    becomes the subclass above: parameters, hooks and isinstance checks unchanged)."""
    for module in graph.modules():
        subclass = _SUBCLASS.get(type(module))
        if subclass is not None:
            module.__class__ = subclass
            module._dense_cache = {}  # type: ignore[assignment]
    return graph
