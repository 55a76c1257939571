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
    """An affine layer in float64: ``full`` with bias; ``pos``/``neg`` the linear maps of W+ / W-
    (``neg`` is None where W >= 0, as for average pooling)."""

    full: LinearMap
    pos: LinearMap
    neg: LinearMap | None


def affine_maps(module: nn.Module) -> AffineMaps:
    """Float64 maps of a Linear or Conv1d/2d/3d module; any other module is taken to be an average
    pooling (linear, W >= 0, dtype-agnostic) and used as it is."""
    if not isinstance(module, (nn.Linear, *_CONV)):
        return AffineMaps(module, module, None)
    weight = module.weight.detach().double()
    bias = None if module.bias is None else module.bias.detach().double()
    w_pos, w_neg = weight.clamp(min=0), weight.clamp(max=0)
    if isinstance(module, nn.Linear):
        return AffineMaps(
            lambda x: F.linear(x, weight, bias), lambda x: F.linear(x, w_pos), lambda x: F.linear(x, w_neg)
        )
    conv = module._conv_forward  # handles every padding mode; linear in the input for a fixed weight
    return AffineMaps(
        lambda x: conv(x, weight, bias), lambda x: conv(x, w_pos, None), lambda x: conv(x, w_neg, None)
    )


def sign_split(delta: torch.Tensor) -> Split:
    return delta.clamp(min=0), delta.clamp(max=0)


def affine_split(maps: AffineMaps, delta_in: torch.Tensor) -> Split:
    """dz+ = W+ da+ + W- da-, dz- = W+ da- + W- da+; the bias has no difference."""
    a_pos, a_neg = sign_split(delta_in)
    if maps.neg is None:
        return maps.pos(a_pos), maps.pos(a_neg)
    return maps.pos(a_pos) + maps.neg(a_neg), maps.pos(a_neg) + maps.neg(a_pos)


def _vjp(fn: LinearMap, grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """grad^T J of a linear map (its Jacobian does not depend on the point)."""
    u = torch.zeros_like(like, requires_grad=True)
    with torch.enable_grad():
        (out,) = torch.autograd.grad(fn(u), u, grad)
    return out


def affine_backward(maps: AffineMaps, delta_in: torch.Tensor, out: Pair) -> torch.Tensor:
    """Multiplier of the layer input: [da>0](W+^T g+ + W-^T g-) + [da<0](W+^T g- + W-^T g+)
    + [da=0] W^T (g+ + g-)/2.

    An input with no difference feeds neither part, but a change in it would (the published rule:
    the mean of the two, see docs/science.md). With a plain pair this is the ordinary gradient
    W^T g (linear layers not followed by a ReLU).
    """

    def vjp(fn: LinearMap | None, g: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(delta_in) if fn is None else _vjp(fn, g, delta_in)

    if out.is_plain:
        return vjp(maps.pos, out.pos) + vjp(maps.neg, out.pos)
    same = vjp(maps.pos, out.pos) + vjp(maps.neg, out.neg)  # a term w*da keeps da's sign where w > 0
    flipped = vjp(maps.pos, out.neg) + vjp(maps.neg, out.pos)
    return torch.where(delta_in > 0, same, torch.where(delta_in < 0, flipped, 0.5 * (same + flipped)))


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
