"""Games of sub-inputs, read off the main game.

The game of a sub-input x_T (reference unchanged) is the restriction of the main game:
v_T(U) = v(U ∩ T), because x_T with the players outside U replaced is x_{U ∩ T} element for element.
So any method that is a function of the game (Shapley values, occlusions) can be computed on every
x_T from values the audit already has, without a model evaluation (docs/science.md, "sub-inputs").

This needs the audited family of sets to be downward closed (every subset of an audited T is
audited): true for exhaustive and order-limited enumeration. Elsewhere :func:`subset_positions`
returns None and callers evaluate the model instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.interactions import popcounts
from workers.players import as_masks, masks_from_bits, subset_bits

__all__ = ["SubInputGame", "restricted_removals", "restricted_shapley", "subset_positions"]


@dataclass(frozen=True)
class SubInputGame:
    """The main game on a family of sets: what a game-derived method reads."""

    n: int
    subsets: np.ndarray  # (m,) uint64 bitmasks, sorted
    values: np.ndarray  # (B, m) v(T)
    interactions: np.ndarray  # (B, m) I(S) on the same sets


def subset_positions(subsets: np.ndarray, masks: np.ndarray) -> np.ndarray | None:
    """Index in ``subsets`` (sorted bitmasks) of every bitmask in ``masks``; None if one is missing."""
    if len(subsets) > 1 and not bool(np.all(subsets[1:] > subsets[:-1])):
        return None
    masks = masks.astype(subsets.dtype)
    pos = np.searchsorted(subsets, masks)
    inside = pos < len(subsets)
    if not bool(inside.all()) or not bool(np.all(subsets[pos] == masks)):
        return None
    return pos


def _without_player(subsets: np.ndarray, i: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows with player i, index of the same set without i), or None if the family is not closed."""
    bit = as_masks([1 << i], n)[0]
    rows = np.flatnonzero(subsets & bit)
    parents = subset_positions(subsets, subsets[rows] & ~bit)
    return None if parents is None else (rows, parents)


def restricted_shapley(game: SubInputGame) -> np.ndarray | None:
    """Shapley values of every restricted game v_T: (B, m, n).

    The Harsanyi dividends of v_T are I(S) for S within T and 0 otherwise, so
    phi_i(v_T) = sum over S within T containing i of I(S)/|S|: a subset sum (zeta transform) of the
    per-set shares I(S)/|S| [i in S], one vectorised pass per player.
    """
    subsets, n = as_masks(game.subsets, game.n), game.n
    sizes = popcounts(subsets)
    share = np.where(sizes > 0, game.interactions / np.maximum(sizes, 1), 0.0)  # (B, m)
    out = share[:, :, None] * subset_bits(subsets, n)[None].astype(np.float64)  # (B, m, n)
    for i in range(n):
        step = _without_player(subsets, i, n)
        if step is None:
            return None
        rows, parents = step
        out[:, rows] += out[:, parents]
    return out


def restricted_removals(game: SubInputGame, removed: np.ndarray) -> np.ndarray | None:
    """v(T) - v(T minus W_w) for every set T and every player set W_w in ``removed`` (w, n) bool: (B, m, w).

    This is the occlusion of W_w on x_T (occluding players outside T changes nothing).
    """
    subsets = as_masks(game.subsets, game.n)
    window_masks = masks_from_bits(removed.astype(bool))  # (w,)
    kept = subsets[:, None] & ~window_masks[None, :]  # (m, w)
    pos = subset_positions(subsets, kept.ravel())
    if pos is None:
        return None
    values = game.values
    return values[:, :, None] - values[:, pos].reshape(values.shape[0], *kept.shape)
