"""Harsanyi interactions by the fast Moebius transform, Shapley values, the high-order remainder.

Subsets are bitmasks: bit i set <=> player i in the set. Dense arrays are indexed by bitmask.
"""

from __future__ import annotations

import numpy as np

from workers.players import subset_bits

__all__ = [
    "interaction_orders",
    "moebius",
    "moebius_dense_limited",
    "popcounts",
    "shapley_from_interactions",
    "subsets_up_to",
]


def popcounts(subsets: np.ndarray) -> np.ndarray:
    """|T| for each bitmask."""
    return np.bitwise_count(subsets.astype(np.uint64)).astype(np.int64)


def subsets_up_to(n: int, order: int) -> np.ndarray:
    """Bitmasks of all T with |T| <= order, sorted by bitmask (all 2^n when order >= n)."""
    everything = np.arange(2**n, dtype=np.uint64)
    return everything if order >= n else everything[popcounts(everything) <= order]


def moebius(values: np.ndarray, n: int) -> np.ndarray:
    """I(S) = sum_{T subset S} (-1)^{|S|-|T|} v(T) over the last axis (length 2^n), O(n 2^n)."""
    out = np.array(values, dtype=np.float64, copy=True)
    lead = out.shape[:-1]
    for i in range(n):
        view = out.reshape(*lead, 2 ** (n - i - 1), 2, 2**i)
        view[..., 1, :] -= view[..., 0, :]
    return out


def moebius_dense_limited(subsets: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Moebius transform from v known only on ``subsets`` (downward closed, e.g. all |T| <= K).

    Returns I on the same subsets. I(S) only involves subsets of S, so zero-filling the unknown
    entries of a dense array leaves every I(S) on a known S exact.
    """
    dense = np.zeros((*values.shape[:-1], 2**n))
    dense[..., subsets.astype(np.int64)] = values
    return moebius(dense, n)[..., subsets.astype(np.int64)]


def shapley_from_interactions(subsets: np.ndarray, interactions: np.ndarray, n: int) -> np.ndarray:
    """phi_i = sum over S containing i of I(S)/|S| (over the given, non-empty subsets)."""
    sizes = popcounts(subsets)
    share = np.where(sizes > 0, interactions / np.maximum(sizes, 1), 0.0)
    return share @ subset_bits(subsets, n).astype(np.float64)


def interaction_orders(subsets: np.ndarray, interactions: np.ndarray, max_order: int) -> np.ndarray:
    """Effect mass sum |I(S)| per order 1..max_order, over the last axis."""
    sizes = popcounts(subsets)
    return np.stack(
        [np.abs(interactions[..., sizes == k]).sum(axis=-1) for k in range(1, max_order + 1)], axis=-1
    )
