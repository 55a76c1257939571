"""The DeepLIFT RevealCancel rules (Shrikumar et al. 2017, sections 3.3-3.5), one function per rule.

Differences-from-reference are split into positive and negative parts, ``Split = (d_pos, d_neg)``
with ``d_pos + d_neg = delta``. An affine layer splits its output difference by the sign of each
term ``w_ij * delta_a_j`` (section 3.5.1); a ReLU turns its input split into two multipliers by the
RevealCancel rule (section 3.5.3); multipliers flow back by the chain rule for multipliers
(section 3.3), which keeps summation-to-delta exact layer by layer.

Multipliers travel as a :class:`Pair`: the multiplier of the positive and of the negative part of
a node's difference. Where both are the same tensor the pair is "plain" and the rules reduce to
ordinary gradient (vector-Jacobian) products.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AffineMaps",
    "Pair",
    "Split",
    "affine_backward",
    "affine_maps",
    "affine_split",
    "collapse",
    "reveal_cancel",
    "sign_split",
]

Split = tuple[torch.Tensor, torch.Tensor]
LinearMap = Callable[[torch.Tensor], torch.Tensor]
# (g, like) -> W^T g shaped like the layer's input ``like``.
Transpose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Pair:
    """Multipliers of the positive and negative parts of one node's difference-from-reference."""

    pos: torch.Tensor
    neg: torch.Tensor

    @classmethod
    def plain(cls, m: torch.Tensor) -> Pair:
        return cls(m, m)

    @property
    def is_plain(self) -> bool:
        return self.pos is self.neg

    def __add__(self, other: Pair) -> Pair:
        if self.is_plain and other.is_plain:
            return Pair.plain(self.pos + other.pos)
        return Pair(self.pos + other.pos, self.neg + other.neg)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Pair:
        return Pair.plain(fn(self.pos)) if self.is_plain else Pair(fn(self.pos), fn(self.neg))


@dataclass(frozen=True)
class AffineMaps:
    """An affine layer in float64: ``full`` with bias, ``linear`` (W) and ``magnitude`` (|W|) without,
    and their transposes (vector-Jacobian products). Average pooling (W >= 0) is used as it is:
    its |W| is W and its transposes come from autograd."""

    full: LinearMap
    linear: LinearMap
    magnitude: LinearMap
    linear_t: Transpose
    magnitude_t: Transpose


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


def affine_maps(module: nn.Module) -> AffineMaps:
    """Float64 maps of a Linear or Conv1d/2d/3d module; any other module is taken to be an average
    pooling (linear, W >= 0, dtype-agnostic) and used as it is."""
    if not isinstance(module, (nn.Linear, *_CONV)):
        transpose = _autograd_transpose(module)
        return AffineMaps(module, module, module, transpose, transpose)
    weight = module.weight.detach().double()
    bias = None if module.bias is None else module.bias.detach().double()
    magnitude = weight.abs()
    if isinstance(module, nn.Linear):
        return AffineMaps(
            lambda x: F.linear(x, weight, bias),
            lambda x: F.linear(x, weight),
            lambda x: F.linear(x, magnitude),
            lambda g, like: g @ weight,
            lambda g, like: g @ magnitude,
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
    )


def sign_split(delta: torch.Tensor) -> Split:
    return delta.clamp(min=0), delta.clamp(max=0)


def affine_split(maps: AffineMaps, delta_in: torch.Tensor) -> Split:
    """dz+ = W+ da+ + W- da-, dz- = W+ da- + W- da+; the bias has no difference.

    Two passes instead of four: dz+ + dz- = W da and dz+ - dz- = |W| |da|.
    """
    total, spread = maps.linear(delta_in), maps.magnitude(delta_in.abs())
    return 0.5 * (total + spread), 0.5 * (total - spread)


def affine_backward(maps: AffineMaps, delta_in: torch.Tensor, out: Pair) -> torch.Tensor:
    """Multiplier of the layer input: [da>0](W+^T g+ + W-^T g-) + [da<0](W+^T g- + W-^T g+)
    + [da=0] W^T (g+ + g-)/2.

    An input with no difference feeds neither part, but a change in it would (the published rule:
    the mean of the two, see docs/science.md). With a plain pair this is the ordinary gradient
    W^T g (linear layers not followed by a ReLU). Two transposed passes instead of four: the sum
    of both cases is W^T (g+ + g-), their difference |W|^T (g+ - g-).
    """
    if out.is_plain:
        return maps.linear_t(out.pos, delta_in)
    both = maps.linear_t(out.pos + out.neg, delta_in)
    apart = maps.magnitude_t(out.pos - out.neg, delta_in)
    same, flipped = 0.5 * (both + apart), 0.5 * (both - apart)  # a term w*da keeps da's sign where w > 0
    return torch.where(delta_in > 0, same, torch.where(delta_in < 0, flipped, 0.5 * both))


def collapse(pair: Pair, delta: torch.Tensor) -> torch.Tensor:
    """One multiplier per element for a node whose difference is split by its own sign."""
    if pair.is_plain:
        return pair.pos
    return torch.where(delta > 0, pair.pos, torch.where(delta < 0, pair.neg, 0.5 * (pair.pos + pair.neg)))


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    # A zero part carries no difference, so its multiplier never reaches an attribution.
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def reveal_cancel(
    f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, x: torch.Tensor, split: Split
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multipliers (m+, m-) of y = f(x) by the RevealCancel rule:

    dy+ = 1/2 (f(x0 + dx+) - f(x0)) + 1/2 (f(x0 + dx- + dx+) - f(x0 + dx-))
    dy- = 1/2 (f(x0 + dx-) - f(x0)) + 1/2 (f(x0 + dx+ + dx-) - f(x0 + dx+))

    ``x`` (= x0 + dx+ + dx-) is the actual pre-activation, so dy+ + dy- = f(x) - f(x0) exactly.
    """
    d_pos, d_neg = split
    y0, y, y_pos, y_neg = f(x0), f(x), f(x0 + d_pos), f(x0 + d_neg)
    dy_pos = 0.5 * (y_pos - y0) + 0.5 * (y - y_neg)
    dy_neg = 0.5 * (y_neg - y0) + 0.5 * (y - y_pos)
    return _safe_div(dy_pos, d_pos), _safe_div(dy_neg, d_neg)
