"""LRP rules as modified gradients: each rule rewrites one layer's output so that its value is
unchanged and its gradient is the rule's (docs/science.md 5.8).

:mod:`workers.methods._modified_backward` carries a modified gradient ``g`` with relevance
``R = value * g`` between rule layers (ReLU, reshapes and max-pooling pass it, as they pass
relevance in Zennit). A layer ``z = W a + b`` whose rule sends relevance ``R_in = a * W'^T (R / d)``
then needs ``g_in = W'^T (k * g)`` with ``k = z / d`` (``k = 1 / d`` on the topmost rule layer,
which receives relevance itself). Each rule is Zennit's rule of the same name with the same
denominators and stabiliser (:func:`stabilize`), so results agree with Zennit to float32 rounding
(tests/unit/methods/test_modified_backward.py); ``zennit()`` gives that hook for the graphs the fast
path leaves to Zennit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from workers.methods._reroute import rerouted
from workers.methods._transposed import TRANSPOSED_TYPES, output_axis, transposed_convolution
from workers.models.dense_conv import affine_with_dense_backward

if TYPE_CHECKING:
    from zennit.core import Hook

__all__ = ["AlphaBeta", "Epsilon", "LayerRule", "ZBox", "release_derived", "stabilize"]


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Zennit's stabiliser: ``z + epsilon * sign(z)``, with sign +1 at zero. The same numbers in
    place on one copy (``+ 0.0`` makes -0.0 a +0.0): new tensors, not arithmetic, cost here."""
    out = z + 0.0
    return out.abs().add_(epsilon).copysign_(out)


def _over(numerator: torch.Tensor | float, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, written over the denominator (a temporary)."""
    if isinstance(numerator, float):
        return denominator.reciprocal_().mul_(numerator) if numerator != 1.0 else denominator.reciprocal_()
    return torch.div(numerator, denominator, out=denominator)


def _affine(
    module: nn.Module,
    a: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cache: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``module`` (Linear, Conv or ConvTranspose) with other parameters (a small convolution's input
    gradient as a dense product: workers.models.dense_conv, whose matrix ``cache`` keeps for this
    ``weight``)."""
    if isinstance(module, nn.Linear):
        return F.linear(a, weight, bias)
    if isinstance(module, TRANSPOSED_TYPES):
        return transposed_convolution(module, a, weight, bias)
    assert isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d)
    return affine_with_dense_backward(module, a, weight, bias, cache)


def _parameters(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight, bias = module.weight, module.bias
    assert isinstance(weight, torch.Tensor) and (bias is None or isinstance(bias, torch.Tensor))
    return weight, bias


def _channels(module: nn.Module) -> int:
    """The channel axis of ``module``'s inputs and outputs."""
    return -1 if isinstance(module, nn.Linear) else 1


@dataclass(frozen=True)
class _Blocks:
    """A rule's output blocks: block i is ``sum_j rows[i][j]`` applied to part j, the blocks stacked
    along the channels, with the tensors they need derived once per layer (:func:`_derived`)."""

    rows: list[list[torch.Tensor]]
    bias: torch.Tensor | None
    weight: torch.Tensor | None  # the rows as one weight; None for grouped convolutions
    cache: dict[str, Any] = field(default_factory=dict)  # the dense gradient matrix of ``weight``
    constants: dict[Hashable, torch.Tensor] = field(default_factory=dict)  # see :func:`_constant`


def _blocks(module: nn.Module, rows: list[list[torch.Tensor]], bias: torch.Tensor | None) -> _Blocks:
    if getattr(module, "groups", 1) != 1:  # grouped convolutions do not stack
        return _Blocks(rows, bias, None)
    out = output_axis(module)
    inner = 1 - out  # the weight's input axis (0 or 1)
    with torch.no_grad():
        weight = torch.cat([torch.cat(row, inner) if len(row) > 1 else row[0] for row in rows], out)
    # The rows kept as views of the stacked weight, not beside it: on VGG's 102M-weight Linear the
    # copies held another 0.8 GB for as long as the model lived.
    outputs = torch.split(weight, [row[0].shape[out] for row in rows], out)
    views = [
        list(torch.split(block, [w.shape[inner] for w in row], inner))
        for block, row in zip(outputs, rows, strict=True)
    ]
    return _Blocks(views, bias, weight)


_DERIVED: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, _Blocks]] = weakref.WeakKeyDictionary()


def release_derived() -> None:
    """Forget every layer's derived blocks (workers.methods.release_derived)."""
    _DERIVED.clear()


def _derived(module: nn.Module, key: Hashable, build: Callable[[], _Blocks]) -> _Blocks:
    """The blocks a rule (``key``) derives from ``module``'s parameters, built on its first call
    only. Derived anew on every call, they were new tensors each time, and a small convolution's
    dense gradient matrix, kept per weight tensor, was probed again on every call: 40% of LRP
    alpha-beta's time on the digits CNN (bench/suite.py, methods). A method's graph is never
    trained, so its parameters do not change under the cache."""
    held = _DERIVED.setdefault(module, {})
    if key not in held:
        held[key] = build()
    return held[key]


def _constant(blocks: _Blocks, values: tuple[float, ...], like: torch.Tensor) -> torch.Tensor:
    """``values`` on ``like``'s device and dtype, made once per layer. A tensor made from Python
    numbers on a GPU is a copy from the host, which waits for the device to finish its queue: an
    H200 profile of alpha-beta at 224x224 spent 0.13 s of 0.27 s in 42 of them (two per layer)."""
    key = (values, like.dtype, like.device)
    held = blocks.constants.get(key)
    if held is None:
        held = blocks.constants[key] = torch.tensor(values, dtype=like.dtype, device=like.device)
    return held


def _block(module: nn.Module, parts: list[torch.Tensor], blocks: _Blocks) -> torch.Tensor:
    """The blocks applied to ``parts``: one layer call (and one in the backward pass) instead of
    one per term, except for grouped convolutions."""
    axis = _channels(module)
    if blocks.weight is None:
        terms = [
            sum(_affine(module, p, w, None) for p, w in zip(parts, row, strict=True)) for row in blocks.rows
        ]
        out = torch.cat(terms, axis)  # type: ignore[arg-type]
        bias = blocks.bias
        return out if bias is None else out + bias.reshape(-1, *[1] * (out.ndim - 2))
    a = parts[0] if len(parts) == 1 else torch.cat(parts, axis)
    return _affine(module, a, blocks.weight, blocks.bias, blocks.cache)


class _SignedParts(torch.autograd.Function):
    """The parts a+ = max(a, 0) and a- = min(a, 0) of ``a``, with the clamps' gradient
    [a > 0] g+ + [a < 0] g- (torch's, 0 at a = 0) as products with the parts' signs (exact: factors
    of 0 and 1) instead of boolean masks and ``where``. On this CPU's torch build ``where`` over a
    boolean mask ran 8x slower than a product, and autograd through the two clamps cost more than
    their layer's convolutions on efficientnet_b0's signed activations (bench/suite.py, methods)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos, neg = a.clamp(min=0), a.clamp(max=0)
        ctx.save_for_backward(pos, neg)
        return pos, neg

    @staticmethod
    def backward(ctx: Any, g_pos: torch.Tensor | None, g_neg: torch.Tensor | None) -> torch.Tensor:
        pos, neg = ctx.saved_tensors
        out = torch.zeros_like(pos) if g_pos is None else torch.mul(g_pos, pos.sign())
        return out if g_neg is None else out.addcmul_(g_neg, neg.sign(), value=-1)


def _signed_parts(a: torch.Tensor) -> list[torch.Tensor]:
    """[a+, a-] (:class:`_SignedParts`)."""
    if not a.requires_grad or not torch.is_grad_enabled():
        return [a.clamp(min=0), a.clamp(max=0)]
    pos, neg = _SignedParts.apply(a)
    return [pos, neg]


def _rerouted(module: nn.Module, z: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return rerouted(z, branch, scale, _channels(module))


class LayerRule:
    """One layer's rule: ``modified(module, a, top, nonneg, leaves)`` gives the layer's output with
    the rule's gradient. ``nonneg``: ``a`` is known to be >= 0 (it comes out of a ReLU), so terms of
    its negative part vanish. Rules with extra input terms (z-beta) append a leaf to ``leaves`` whose
    gradient is that term's relevance; ``bounds`` (two tensors (1, *a's shape)) are z-beta's bounds at
    each of ``a``'s positions where the input reaches the layer moved or scaled (None: the rule's
    own constant bounds)."""

    # The rule's extra leaf is relevance at the layer's input: needs the input to be a reshaped x.
    needs_input_layer: ClassVar[bool] = False

    def modified(
        self,
        module: nn.Module,
        a: torch.Tensor,
        top: bool,
        nonneg: bool,
        leaves: list[torch.Tensor],
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def zennit(self) -> Hook:
        raise NotImplementedError


@dataclass(frozen=True)
class Epsilon(LayerRule):
    """LRP-epsilon (Bach et al. 2015 eq. 58); with 1e-6 on pooling layers, Zennit's Norm (LRP-0)."""

    epsilon: float = 1e-6

    def modified(
        self,
        module: nn.Module,
        a: torch.Tensor,
        top: bool,
        nonneg: bool,
        leaves: list[torch.Tensor],
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        z = module(a)
        value = z.detach()
        scale = _over(1.0 if top else value, stabilize(value, self.epsilon))
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
        self,
        module: nn.Module,
        a: torch.Tensor,
        top: bool,
        nonneg: bool,
        leaves: list[torch.Tensor],
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        _, bias = _parameters(module)
        axis = _channels(module)
        # Inputs that happen to have no negative entry (images, masked with zeros) drop the a- terms:
        # they are exact zeros, so the result is the same for half the work. (A float minimum: 8x
        # faster here than ``(a < 0).any()``, which makes a boolean tensor first.)
        nonneg = nonneg or bool(a.detach().amin() >= 0)
        stacked = _derived(module, (self, nonneg), lambda: self._blocks(module, nonneg))
        branch = _block(module, [a] if nonneg else _signed_parts(a), stacked)
        with torch.no_grad():  # alpha / s(positive sums), -beta / s(negative sums), times z
            blocks = len(stacked.rows)
            at = axis % branch.ndim
            sums = branch.detach().reshape(*branch.shape[:at], blocks, -1, *branch.shape[at + 1 :])
            if blocks == 2 and (stacked.bias is not None or bias is None):
                # z = W a + b is the sum of the positive and negative sums: no second layer call.
                z = sums.select(at, 0) + sums.select(at, 1)
            else:
                z = module(a)
            # The positive sums are >= 0 and the negative ones <= 0 by construction, so Zennit's
            # stabiliser is +1e-6 and -1e-6 (at a negative sum of exactly 0 it adds +1e-6, but there
            # every term is 0: a = 0 wherever W- is not, and that relevance is 0 either way).
            block = (blocks, *[1] * (branch.ndim - at))
            epsilons = _constant(stacked, (1e-6, -1e-6)[:blocks], z).reshape(block)
            scale = _over(1.0 if top else z.unsqueeze(at), sums + epsilons)
            if (self.alpha, blocks) != (1.0, 1):
                coefficients = _constant(stacked, (self.alpha, -self.beta)[:blocks], z)
                scale.mul_(coefficients.reshape(block))
            scale = scale.flatten(at, at + 1)
        return _rerouted(module, z, branch, scale)

    def _blocks(self, module: nn.Module, nonneg: bool) -> _Blocks:
        """Positive contributions W+ a+ + W- a- (+ b+), negative ones W- a+ + W+ a- (+ b-); a- = 0
        after a ReLU."""
        weight, bias = _parameters(module)
        with torch.no_grad():
            w_pos, w_neg = weight.clamp(min=0), weight.clamp(max=0)
            kept = None if self.zero_bias else bias
            if kept is not None:  # b+ with the positive contributions, b- with the negative ones
                kept = torch.cat([kept.clamp(min=0), kept.clamp(max=0)]) if self.beta else kept.clamp(min=0)
        rows = [[w_pos] if nonneg else [w_pos, w_neg]]
        if self.beta:
            rows.append([w_neg] if nonneg else [w_neg, w_pos])
        return _blocks(module, rows, kept)

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
        self,
        module: nn.Module,
        a: torch.Tensor,
        top: bool,
        nonneg: bool,
        leaves: list[torch.Tensor],
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        weight, bias = _parameters(module)
        with torch.no_grad():
            z = module(a)
            w_pos, w_neg = weight.clamp(min=0), weight.clamp(max=0)
            b_pos = None if bias is None else bias.clamp(min=0)
            b_neg = None if bias is None else bias.clamp(max=0)
            if bounds is None:
                one = torch.ones((1, *a.shape[1:]), dtype=a.dtype, device=a.device)
                low, high = one * self.low, one * self.high
            else:
                low, high = bounds
            lower = _affine(module, low, w_pos, b_pos)
            upper = _affine(module, high, w_neg, b_neg)
            value = z
            scale = _over(1.0 if top else value, stabilize(value - (lower + upper), 1e-6))
        if bounds is None:  # the bounds' terms: a leaf at the input whose gradient is -(low W+ + high W-)^T c
            leaf = torch.zeros_like(a, requires_grad=True)
            terms = _derived(
                module,
                (self,),
                lambda: _blocks(module, [[weight, -(self.low * w_pos + self.high * w_neg)]], None),
            )
            branch = _block(module, [a, leaf], terms)
        else:  # bounds per position: a leaf of ones whose gradient is -(low W+^T c + high W-^T c)
            leaf = torch.ones_like(a, requires_grad=True)
            terms = _derived(
                module, (self, "per position"), lambda: _blocks(module, [[weight, -w_pos, -w_neg]], None)
            )
            branch = _block(module, [a, low * leaf, high * leaf], terms)
        leaves.append(leaf)
        return _rerouted(module, value, branch, scale)

    def zennit(self) -> Hook:
        from zennit.rules import ZBox as ZennitZBox

        return ZennitZBox(low=self.low, high=self.high)
