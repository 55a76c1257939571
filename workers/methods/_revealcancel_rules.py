"""The DeepLIFT RevealCancel rules (Shrikumar et al. 2017, sections 3.3-3.5), one function per rule.

Differences-from-reference are split into positive and negative parts ``(d_pos, d_neg)`` with
``d_pos + d_neg = delta``. An affine layer splits its output difference by the sign of each term
``w_ij * delta_a_j`` (section 3.5.1); a ReLU turns its input split into two multipliers by the
RevealCancel rule (section 3.5.3); multipliers flow back by the chain rule for multipliers
(section 3.3), which keeps summation-to-delta exact layer by layer.

The rules work on differences only (never ``f(x) - f(x0)`` of two forward passes), in forms whose
rounding stays relative to the differences themselves; that is what lets them run in float32.

Multipliers travel as a :class:`Pair`: the mean and half the difference of the multipliers of the
positive and negative part of a node's difference. Where both are the same the pair is "plain"
(``half_diff`` None) and the rules reduce to ordinary gradient (vector-Jacobian) products.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AffineMaps",
    "Pair",
    "Reveal",
    "affine_backward",
    "affine_maps",
    "affine_split",
    "ambiguous_rows",
    "collapse",
    "dense_transposes",
    "reveal_cancel",
    "sign_split",
]

Split = tuple[torch.Tensor, torch.Tensor]
LinearMap = Callable[[torch.Tensor], torch.Tensor]
# (g, like) -> W^T g shaped like the layer's input ``like``.
Transpose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# A convolution's transposes become one matrix product when its dense matrix is small and not much
# larger than the kernel's work: n_in / fan_in is how many times more multiplications it does, and a
# single-threaded BLAS product beats the input-gradient kernel by about that much on small layers.
_DENSE_ELEMENTS = 2**20
_DENSE_RATIO = 8


@dataclass(frozen=True)
class Pair:
    """Multipliers of the positive (``mean + half_diff``) and negative (``mean - half_diff``) part of
    one node's difference-from-reference; ``half_diff`` None: both are ``mean``."""

    mean: torch.Tensor
    half_diff: torch.Tensor | None = None

    def __add__(self, other: Pair) -> Pair:
        mean = self.mean + other.mean
        if self.half_diff is None and other.half_diff is None:
            return Pair(mean)
        if self.half_diff is None or other.half_diff is None:
            return Pair(mean, self.half_diff if other.half_diff is None else other.half_diff)
        return Pair(mean, self.half_diff + other.half_diff)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Pair:
        return Pair(fn(self.mean), None if self.half_diff is None else fn(self.half_diff))


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
    magnitude = rows.abs()

    def product(matrix: torch.Tensor) -> Transpose:
        def transpose(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return F.linear(g.reshape(len(g), -1), matrix).reshape(like.shape)

        return transpose

    return replace(maps, linear_t=product(rows), magnitude_t=product(magnitude))


def sign_split(delta: torch.Tensor) -> Split:
    return delta.clamp(min=0), delta.clamp(max=0)


def affine_split(maps: AffineMaps, delta_in: torch.Tensor) -> tuple[torch.Tensor, Split]:
    """The output difference W da and its split dz+ = W+ da+ + W- da-, dz- = W+ da- + W- da+ (the bias
    has no difference).

    Two passes instead of four: dz+ + dz- = W da and dz+ - dz- = |W| |da|. Both passes sum the same
    terms in the same order, so a part with no terms (all w*da of one sign) is exactly zero.
    """
    total, spread = maps.linear(delta_in), maps.magnitude(delta_in.abs())
    return total, ((total + spread).mul_(0.5), (total - spread).mul_(0.5))


def affine_backward(maps: AffineMaps, delta_in: torch.Tensor, out: Pair) -> torch.Tensor:
    """Multiplier of the layer input: [da>0](W+^T g+ + W-^T g-) + [da<0](W+^T g- + W-^T g+)
    + [da=0] W^T (g+ + g-)/2.

    An input with no difference feeds neither part, but a change in it would (the published rule:
    the mean of the two, see docs/science.md). With a plain pair this is the ordinary gradient
    W^T g (linear layers not followed by a ReLU). Two transposed passes instead of four: with
    g+/- = mean +/- half_diff, the multiplier is W^T mean + sign(da) |W|^T half_diff.
    """
    both = maps.linear_t(out.mean, delta_in)
    if out.half_diff is None:
        return both
    return maps.magnitude_t(out.half_diff, delta_in).mul_(delta_in.sign()).add_(both)


def collapse(pair: Pair, delta: torch.Tensor) -> torch.Tensor:
    """One multiplier per element for a node whose difference is split by its own sign."""
    if pair.half_diff is None:
        return pair.mean
    return pair.half_diff * delta.sign() + pair.mean


@dataclass(frozen=True)
class Reveal:
    """A ReLU's RevealCancel result: its output difference and its multipliers as a pair's parts
    (mean and half difference of m+ and m-), to be scaled by the output's multiplier."""

    delta: torch.Tensor
    mean: torch.Tensor
    half_diff: torch.Tensor


def reveal_cancel(z0: torch.Tensor, split: Split) -> Reveal:
    """Multipliers (m+, m-) of y = relu(z) at reference pre-activation ``z0`` by the RevealCancel rule:

    dy+ = 1/2 (f(z0 + dz+) - f(z0)) + 1/2 (f(z0 + dz- + dz+) - f(z0 + dz-))
    dy- = 1/2 (f(z0 + dz-) - f(z0)) + 1/2 (f(z0 + dz+ + dz-) - f(z0 + dz+))

    Each bracket is a ReLU difference R(a, d) = relu(a + d) - relu(a) in a form without cancellation:
    relu(d + min(a, 0)) for d >= 0 and max(d, -relu(a)) for d <= 0. So dy+ lies in [0, dz+] and dy-
    in [dz-, 0] after rounding too, m+ and m- in [0, 1], and a part that is zero has multiplier 0
    (it never reaches an attribution). dy = dy+ + dy- is the ReLU's output difference, which keeps
    summation-to-delta with the multipliers.
    """
    d_pos, d_neg = split
    pos = torch.relu(d_pos + z0.clamp(max=0))  # R(z0, dz+)
    pos += torch.relu(d_pos + (z0 + d_neg).clamp_(max=0))  # R(z0 + dz-, dz+)
    neg = torch.maximum(d_neg, -torch.relu(z0))  # R(z0, dz-)
    neg += torch.maximum(d_neg, torch.relu(z0 + d_pos).neg_())  # R(z0 + dz+, dz-)
    delta = torch.add(pos, neg).mul_(0.5)
    m_pos = pos.div_(d_pos).nan_to_num_(nan=0.0)  # 2 dy+ / dz+; 0/0 where the part is absent
    m_neg = neg.div_(d_neg).nan_to_num_(nan=0.0)
    return Reveal(delta, torch.add(m_pos, m_neg).mul_(0.25), m_pos.sub_(m_neg).mul_(0.25))


def ambiguous_rows(z0: torch.Tensor, split: Split, tolerance: float) -> torch.Tensor:
    """Rows (k,) where some ReLU's output difference is within rounding of zero: |dz| or |z0 + dz|
    below ``tolerance`` times the unit's |W| |da| (the scale of the rounding in dz+ and dz-), while
    that is not zero (a unit with no difference in its inputs is exact). There the sign of the
    difference, which routes multipliers back (:func:`affine_backward`), is not resolved."""
    d_pos, d_neg = split
    total = d_pos + d_neg
    near = torch.minimum(total.abs(), (z0 + total).abs_())
    # A float reduction over rows: much faster than comparing to a bool tensor and any().
    return near.sub_((d_pos - d_neg).mul_(tolerance)).reshape(len(total), -1).amin(dim=1) < 0
