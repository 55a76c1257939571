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
from dataclasses import dataclass

import torch

from workers.methods._revealcancel_maps import AffineMaps

__all__ = [
    "Pair",
    "Reveal",
    "Split",
    "affine_backward",
    "affine_split",
    "collapse",
    "reveal_cancel",
    "reveal_cancel_clipped",
    "reveal_cancel_smooth",
    "scaled_pair",
    "scaled_split",
    "sign_split",
]


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
class Split:
    """A difference ``total`` in parts ``pos`` (>= 0) + ``neg`` (<= 0), and ``spread`` = pos - neg,
    the sum of the magnitudes of its terms (the scale of its rounding)."""

    pos: torch.Tensor
    neg: torch.Tensor
    total: torch.Tensor
    spread: torch.Tensor

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Split:
        return Split(fn(self.pos), fn(self.neg), fn(self.total), fn(self.spread))


def sign_split(delta: torch.Tensor) -> Split:
    return Split(delta.clamp(min=0), delta.clamp(max=0), delta, delta.abs())


def affine_split(maps: AffineMaps, delta_in: torch.Tensor) -> Split:
    """The output difference W da and its split dz+ = W+ da+ + W- da-, dz- = W+ da- + W- da+ (the bias
    has no difference).

    Two passes instead of four: dz+ + dz- = W da and dz+ - dz- = |W| |da|. Where both passes sum the
    same terms in the same order and dtype, a part with no terms (all w*da of one sign) comes out
    exactly zero; where |W| |da| is rounded in float32 (float64 plans), within that rounding of zero.
    """
    total, spread = maps.linear(delta_in), maps.magnitude(delta_in.abs())
    if maps.rounded_magnitude:  # |W| |da| >= |W da|, which rounding alone may break: parts keep their signs
        spread = torch.maximum(spread, total.abs(), out=spread)
    pos = torch.lerp(total, spread, 0.5)
    return Split(pos, total - pos, total, spread)


def scaled_split(parts: Split, scale: torch.Tensor) -> Split:
    """The split of ``s * d`` (a batch norm's difference; its shift has none): the parts scaled, and
    swapped where ``s < 0``. The same as folding ``s`` into the layer that made the parts, and the
    rule of DeepLIFT's reference implementation for batch norms."""
    up, down = scale.clamp(min=0), scale.clamp(max=0)
    return Split(
        up * parts.pos + down * parts.neg,
        up * parts.neg + down * parts.pos,
        scale * parts.total,
        scale.abs() * parts.spread,
    )


def scaled_pair(out: Pair, scale: torch.Tensor) -> Pair:
    """Multipliers back through ``s * d``: m+ = s+ g+ + s- g-, m- = s+ g- + s- g+, that is
    ``s`` times the mean and ``|s|`` times the half difference."""
    return Pair(out.mean * scale, None if out.half_diff is None else out.half_diff * scale.abs())


def affine_backward(maps: AffineMaps, delta_in: torch.Tensor, out: Pair) -> torch.Tensor:
    """Multiplier of the layer input: [da>0](W+^T g+ + W-^T g-) + [da<0](W+^T g- + W-^T g+)
    + [da=0] W^T (g+ + g-)/2.

    An input with no difference feeds neither part, but a change in it would (the published rule:
    the mean of the two, see docs/science.md 5.8). With a plain pair this is the ordinary gradient
    W^T g (linear layers not followed by a ReLU). Two transposed passes instead of four: with
    g+/- = mean +/- half_diff, the multiplier is W^T mean + sign(da) |W|^T half_diff.
    """
    both = maps.linear_t(out.mean, delta_in)
    if out.half_diff is None:
        return both
    return both.addcmul_(maps.magnitude_t(out.half_diff, delta_in), delta_in.sign())


def collapse(pair: Pair, delta: torch.Tensor) -> torch.Tensor:
    """One multiplier per element for a node whose difference is split by its own sign."""
    if pair.half_diff is None:
        return pair.mean
    return torch.addcmul(pair.mean, pair.half_diff, delta.sign())


@dataclass(frozen=True)
class Reveal:
    """A ReLU's RevealCancel result: its output difference, its multipliers as a pair's parts (mean and
    half difference of m+ and m-) to be scaled by the output's multiplier, and where asked the rows
    whose output difference is within rounding of zero."""

    delta: torch.Tensor
    mean: torch.Tensor
    half_diff: torch.Tensor
    unresolved: torch.Tensor | None


# Bytes per tensor of one block of rows in :func:`reveal_cancel` on a CPU: its four buffers and the
# split's four parts then stay in a core's L2 cache (2 MiB here) across the rule's dozen passes. On
# the digits CNN's first layer (1,024 rows of 512 values) the rule took 3.39 ms whole and 2.6 ms in
# blocks of 128 to 256 rows (the whole RevealCancel call: 15.5 -> 14.9 ms).
_BLOCK_BYTES = 2**18


def reveal_cancel(z0: torch.Tensor, split: Split, tolerance: float | None = None) -> Reveal:
    """:func:`_reveal_cancel` in blocks of rows that stay in cache, written into whole tensors (on a
    GPU whole: more kernel launches there buy nothing)."""
    rows, row = len(split.total), split.total[0]
    step = max(1, _BLOCK_BYTES // max(1, row.numel() * row.element_size()))
    if rows <= step or row.device.type != "cpu":
        return _reveal_cancel(z0, split, tolerance)
    delta, mean, half_diff = (torch.empty_like(split.total) for _ in range(3))
    unresolved = None if tolerance is None else torch.empty(rows, dtype=torch.bool, device=delta.device)
    for start in range(0, rows, step):
        block = slice(start, start + step)
        part = _reveal_cancel(
            z0 if len(z0) == 1 else z0[block],
            Split(split.pos[block], split.neg[block], split.total[block], split.spread[block]),
            tolerance,
            (delta[block], mean[block], half_diff[block]),
        )
        if unresolved is not None and part.unresolved is not None:
            unresolved[block] = part.unresolved
    return Reveal(delta, mean, half_diff, unresolved)


def _reveal_cancel(
    z0: torch.Tensor,
    split: Split,
    tolerance: float | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Reveal:
    """Multipliers (m+, m-) of y = relu(z) at reference pre-activation ``z0`` by the RevealCancel rule:

    dy+ = 1/2 (f(z0 + dz+) - f(z0)) + 1/2 (f(z0 + dz- + dz+) - f(z0 + dz-))
    dy- = 1/2 (f(z0 + dz-) - f(z0)) + 1/2 (f(z0 + dz+ + dz-) - f(z0 + dz+))

    Each bracket is a ReLU difference R(a, d) = relu(a + d) - relu(a) in a form without cancellation:
    min(d, relu(a + d)) for d >= 0 and max(d, -relu(a)) for d <= 0. So dy+ lies in [0, dz+] and dy-
    in [dz-, 0] after rounding too, m+ and m- in [0, 1], and a part that is zero has multiplier 0
    (it never reaches an attribution). dy = dy+ + dy- is the ReLU's output difference, which keeps
    summation-to-delta with the multipliers.

    ``tolerance``: also flag the rows where some |dz| or |z0 + dz| is below ``tolerance`` times the
    unit's spread, that is within the rounding of a sum of that many terms: there the sign of dy,
    which routes multipliers back (:func:`affine_backward`), is not resolved. A unit with no spread
    (no difference in any input) is exact.
    """
    # Written in place over four buffers: large fresh allocations (each a page-faulting mmap with
    # glibc's defaults) cost more here than the arithmetic.
    pos, neg = split.pos, split.neg
    z = z0 + split.total  # a: z0 + dz
    unresolved = None
    if tolerance is None:
        up, scratch = torch.empty_like(z), torch.empty_like(z)  # b, c
    else:
        up, scratch = split.total.abs(), z.abs()
        near = torch.minimum(up, scratch, out=up).add_(split.spread, alpha=-tolerance)
        unresolved = near.reshape(len(near), -1).amin(dim=1) < 0  # a float reduction: fast
    # Each bracket in one clamp: min(d, relu(a + d)) = clamp(a + d, 0, d) for d >= 0, and
    # max(d, -relu(a)) = clamp(-a, d, 0) for d <= 0.
    zero = up.new_zeros(())
    at_pos = torch.add(z0, pos, out=scratch)  # c: z0 + dz+
    torch.clamp(at_pos, min=zero, max=pos, out=up).add_(torch.clamp(z, min=zero, max=pos, out=z))  # b: 2 dy+
    down = torch.maximum(neg, -torch.relu(z0), out=z)  # a
    down.add_(at_pos.neg_().clamp_(min=neg, max=zero))  # a: 2 dy-
    delta = torch.lerp(up, down, 0.5, out=scratch if out is None else out[0])  # c
    m_pos = torch.addcdiv(zero, up, pos, value=0.5, out=up).nan_to_num_(nan=0.0)  # 0/0: absent part
    m_neg = torch.addcdiv(zero, down, neg, value=0.5, out=down).nan_to_num_(nan=0.0)
    mean = torch.lerp(m_pos, m_neg, 0.5, out=None if out is None else out[1])
    half_diff = torch.sub(m_pos, mean, out=m_pos if out is None else out[2])
    return Reveal(delta, mean, half_diff, unresolved)


def reveal_cancel_clipped(
    z0: torch.Tensor, split: Split, cap: float, tolerance: float | None = None
) -> Reveal:
    """:func:`reveal_cancel` for y = clip(z, 0, cap) (ReLU6: cap 6) = relu(z) - relu(z - cap).

    The rule's dy+ and dy- are linear in the nonlinearity f, and so are m+ = dy+/dz+, m- = dy-/dz-:
    each is the ReLU's at ``z0`` minus the ReLU's at ``z0 - cap``. Each ReLU term is the share of
    its bracket's interval above its threshold, so the difference is the share between 0 and
    ``cap``: m+ and m- stay in [0, 1], and a unit saturated at both ends of every bracket gets
    exactly 0 (both terms are the whole interval). Rows are flagged where either ReLU's sign is
    within rounding (``z`` near 0 or near ``cap``)."""
    low = reveal_cancel(z0, split, tolerance)
    high = reveal_cancel(z0 - cap, split, tolerance)
    unresolved = (
        None if low.unresolved is None or high.unresolved is None else low.unresolved | high.unresolved
    )
    return Reveal(
        low.delta.sub_(high.delta), low.mean.sub_(high.mean), low.half_diff.sub_(high.half_diff), unresolved
    )


def reveal_cancel_smooth(
    z0: torch.Tensor, split: Split, function: Callable[[torch.Tensor], torch.Tensor]
) -> Reveal:
    """:func:`reveal_cancel` for any elementwise ``function`` (SiLU, Hardswish), from its values at
    the rule's four points. Differences of values cancel where ReLU's closed forms do not, so the
    plans that use it run in float64 (``_revealcancel_graph.needs_float64``). dy = (2 dy+ + 2 dy-) / 2
    keeps summation-to-delta with the multipliers; an absent part (0/0) gets multiplier 0."""
    pos, neg = split.pos, split.neg
    at_ref = function(z0)
    at_pos, at_neg, at_both = function(z0 + pos), function(z0 + neg), function(z0 + split.total)
    up = (at_pos - at_ref).add_(at_both - at_neg)  # 2 dy+
    down = (at_neg - at_ref).add_(at_both - at_pos)  # 2 dy-
    delta = torch.lerp(up, down, 0.5)
    m_pos = up.div_(pos).mul_(0.5).nan_to_num_(nan=0.0)
    m_neg = down.div_(neg).mul_(0.5).nan_to_num_(nan=0.0)
    mean = torch.lerp(m_pos, m_neg, 0.5)
    return Reveal(delta, mean, m_pos.sub_(mean), None)
