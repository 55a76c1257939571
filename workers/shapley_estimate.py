"""Shapley values of one sample's game, exact where affordable and estimated beyond.

A player whose elements equal the reference is a null player (x_T with it added is the same input),
so its value is 0 and only the k present players are played: exact over 2^k coalitions up to
MAX_EXACT_PLAYERS present players, permutation sampling above (antithetic pairs: each permutation and
its reverse; docs/science.md, "Shapley beyond the exact limit"). The estimate comes with its standard
error per player.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from workers.interactions import moebius, shapley_from_interactions, subsets_up_to
from workers.players import subset_bits

__all__ = ["MAX_EXACT_PRESENT", "ShapleyEstimate", "estimate_shapley"]

# Present players up to which Shapley values are computed exactly (2^k coalitions).
MAX_EXACT_PRESENT = 16

# Coalitions (n,) bool rows -> game values.
ValueFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ShapleyEstimate:
    values: np.ndarray  # (n,)
    standard_error: np.ndarray  # (n,) 0 when exact
    exact: bool
    evaluations: int


def estimate_shapley(
    value: ValueFn, present: np.ndarray, permutations: int, rng: np.random.Generator
) -> ShapleyEstimate:
    """Shapley values of the game ``value`` on n players, of which only ``present`` (n,) bool matter."""
    n = len(present)
    players = np.flatnonzero(present)
    k = len(players)
    out = np.zeros(n)
    if k == 0:
        return ShapleyEstimate(out, np.zeros(n), True, 0)
    if k <= MAX_EXACT_PRESENT:
        local = subsets_up_to(k, k)
        bits = np.zeros((len(local), n), dtype=bool)
        bits[:, players] = subset_bits(local, k)
        interactions = moebius(value(bits), k)
        out[players] = shapley_from_interactions(local, interactions, k)
        return ShapleyEstimate(out, np.zeros(n), True, len(local))
    pairs = max(1, (permutations + 1) // 2)
    orders = np.argsort(rng.random((pairs, k)), axis=1)
    orders = np.concatenate([orders, orders[:, ::-1]])  # antithetic: every order and its reverse
    p = len(orders)
    # Prefix coalitions of every order: row j of order q holds its first j players.
    rank = np.empty_like(orders)
    np.put_along_axis(rank, orders, np.arange(k)[None, :], axis=1)  # position of each player
    steps = np.arange(k + 1)[None, :, None]
    local_bits = rank[:, None, :] < steps  # (p, k+1, k)
    bits = np.zeros((p * (k + 1), n), dtype=bool)
    bits[:, players] = local_bits.reshape(-1, k)
    values = value(bits).reshape(p, k + 1)
    gains = np.diff(values, axis=1)  # (p, k): gain of the j-th player of each order
    per_player = np.empty_like(gains)
    np.put_along_axis(per_player, orders, gains, axis=1)  # (p, k) by player
    # Antithetic pairs are one draw each: the standard error comes from the pair means.
    pair_means = 0.5 * (per_player[:pairs] + per_player[pairs:])
    out[players] = pair_means.mean(axis=0)
    se = np.zeros(n)
    if pairs > 1:
        se[players] = pair_means.std(axis=0, ddof=1) / np.sqrt(pairs)
    return ShapleyEstimate(out, se, False, len(bits))
