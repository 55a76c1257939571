"""LRP rules as modified gradients: each rule rewrites one layer's output so that its value is
unchanged and its gradient is the rule's (docs/science.md, LRP and Deep Taylor).

:mod:`workers.methods._modified_backward` carries a modified gradient ``g`` with relevance
``R = value * g`` between rule layers (ReLU, reshapes and max-pooling pass it, as they pass
relevance in Zennit). A layer ``z = W a + b`` whose rule sends relevance ``R_in = a * W'^T (R / d)``
then needs ``g_in = W'^T (k * g)`` with ``k = z / d`` (``k = 1 / d`` on the topmost rule layer,
which receives relevance itself). Each rule is Zennit's rule of the same name, computed the same
way (the stabiliser of :func:`stabilize`, the same denominators), so results agree with Zennit;
``zennit()`` gives that hook for the graphs the fast path leaves to Zennit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from zennit.core import Hook

__all__ = ["AlphaBeta", "Epsilon", "LayerRule", "ZBox", "stabilize"]


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Zennit's stabiliser: ``z + epsilon * sign(z)``, with sign +1 at zero."""
    return z + ((z == 0).to(z) + z.sign()) * epsilon


def _affine(
    module: nn.Module, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``module`` (Linear or Conv) with other parameters."""
    if isinstance(module, nn.Linear):
        return F.linear(a, weight, bias)
    assert isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d)
    return module._conv_forward(a, weight, bias)


def _parameters(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight, bias = module.weight, module.bias
    assert isinstance(weight, torch.Tensor) and (bias is None or isinstance(bias, torch.Tensor))
    return weight, bias


def _rerouted(z: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The value ``z``, with its gradient sent into ``branch`` times ``scale`` (added zero keeps the value exact)."""
    return z + (branch - branch.detach()) * scale


class LayerRule:
    """One layer's rule: ``modified(module, a, top, nonneg, leaves)`` gives the layer's output with
    the rule's gradient. ``nonneg``: ``a`` is known to be >= 0 (it comes out of a ReLU), so terms of
    its negative part vanish. Rules with extra input terms (z-beta) append a leaf to ``leaves`` whose
    gradient is that term's relevance."""

    # The rule's extra leaf is relevance at the layer's input: needs the input to be a reshaped x.
    needs_input_layer: ClassVar[bool] = False

    def modified(
        self, module: nn.Module, a: torch.Tensor, top: bool, nonneg: bool, leaves: list[torch.Tensor]
    ) -> torch.Tensor:
        raise NotImplementedError

    def zennit(self) -> Hook:
        raise NotImplementedError


@dataclass(frozen=True)
class Epsilon(LayerRule):
    """LRP-epsilon (Bach et al. 2015 eq. 58); with 1e-6 on pooling layers, Zennit's Norm (LRP-0)."""

    epsilon: float = 1e-6

    def modified(
        self, module: nn.Module, a: torch.Tensor, top: bool, nonneg: bool, leaves: list[torch.Tensor]
    ) -> torch.Tensor:
        z = module(a)
        value = z.detach()
        scale = (1.0 if top else value) / stabilize(value, self.epsilon)
        z.register_hook(scale.mul)  # the gradient W^T (k g): only the scale changes
        return z

    def zennit(self) -> Hook:
        from zennit.rules import Epsilon as ZennitEpsilon

        return ZennitEpsilon(epsilon=self.epsilon)


@dataclass(frozen=True)
class AlphaBeta(LayerRule):
    """LRP-alpha-beta (Bach et al. 2015 eq. 60) as Zennit computes it: positive contributions
    ``W+ a+ + W- a- (+ b+)`` and negative ones ``W- a+ + W+ a- (+ b-)``, each normalised by its own sum.
    ``zero_bias``: biases left out of the denominators (Zennit's ``zero_params=["bias"]``); with
    alpha=1, beta=0 that is the z+ rule of Deep Taylor."""

    alpha: float = 2.0
    beta: float = 1.0
    zero_bias: bool = False

    def modified(
        self, module: nn.Module, a: torch.Tensor, top: bool, nonneg: bool, leaves: list[torch.Tensor]
    ) -> torch.Tensor:
        weight, bias = _parameters(module)
        with torch.no_grad():
            z = module(a)
            w_pos, w_neg = weight.clamp(min=0), weight.clamp(max=0)
            kept = None if self.zero_bias else bias
            b_pos = None if kept is None else kept.clamp(min=0)
            b_neg = None if kept is None else kept.clamp(max=0)
        numerator = 1.0 if top else z
        a_pos = a if nonneg else a.clamp(min=0)
        a_neg = None if nonneg else a.clamp(max=0)

        def part(w_on_pos: torch.Tensor, w_on_neg: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            out = _affine(module, a_pos, w_on_pos, b)
            return out if a_neg is None else out + _affine(module, a_neg, w_on_neg, None)

        positive = part(w_pos, w_neg, b_pos)
        out = _rerouted(z, positive, self.alpha * numerator / stabilize(positive.detach(), 1e-6))
        if self.beta:
            negative = part(w_neg, w_pos, b_neg)
            out = _rerouted(out, negative, -self.beta * numerator / stabilize(negative.detach(), 1e-6))
        return out

    def zennit(self) -> Hook:
        if self.zero_bias and (self.alpha, self.beta) == (1.0, 0.0):
            from zennit.rules import ZPlus

            return ZPlus(zero_params=["bias"])
        from zennit.rules import AlphaBeta as ZennitAlphaBeta

        return ZennitAlphaBeta(
            alpha=self.alpha, beta=self.beta, zero_params=["bias"] if self.zero_bias else None
        )


@dataclass(frozen=True)
class ZBox(LayerRule):
    """The z-beta rule (Montavon et al. 2017) for inputs in [low, high], as Zennit's ZBox:
    ``R_in = a * W^T c - (low W+ + high W-)^T c`` with ``c = R / s(z - low W+ - high W- ...)``."""

    low: float
    high: float
    needs_input_layer: ClassVar[bool] = True

    def modified(
        self, module: nn.Module, a: torch.Tensor, top: bool, nonneg: bool, leaves: list[torch.Tensor]
    ) -> torch.Tensor:
        weight, bias = _parameters(module)
        z = module(a)
        with torch.no_grad():
            w_pos, w_neg = weight.clamp(min=0), weight.clamp(max=0)
            b_pos = None if bias is None else bias.clamp(min=0)
            b_neg = None if bias is None else bias.clamp(max=0)
            one = torch.ones((1, *a.shape[1:]), dtype=a.dtype, device=a.device)
            lower = _affine(module, one * self.low, w_pos, b_pos)
            upper = _affine(module, one * self.high, w_neg, b_neg)
            value = z.detach()
            scale = (1.0 if top else value) / stabilize(value - (lower + upper), 1e-6)
        # The bounds' terms: a leaf at the input whose gradient is -(low W+ + high W-)^T c.
        leaf = torch.zeros_like(a, requires_grad=True)
        bounds = _affine(module, leaf, self.low * w_pos + self.high * w_neg, None)
        leaves.append(leaf)
        return _rerouted(value, z - bounds, scale)

    def zennit(self) -> Hook:
        from zennit.rules import ZBox as ZennitZBox

        return ZennitZBox(low=self.low, high=self.high)
