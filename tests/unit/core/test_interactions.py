"""Moebius transform, efficiency and Shapley values against brute-force definitions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workers.interactions import (
    moebius,
    moebius_dense_limited,
    popcounts,
    shapley_from_interactions,
    subsets_up_to,
)


def brute_force_interactions(values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(2**n)
    for s in range(2**n):
        for t in range(2**n):
            if t & s == t:
                out[s] += (-1) ** (bin(s).count("1") - bin(t).count("1")) * values[t]
    return out


def brute_force_shapley(values: np.ndarray, n: int) -> np.ndarray:
    phi = np.zeros(n)
    for perm in itertools.permutations(range(n)):
        coalition = 0
        for i in perm:
            phi[i] += values[coalition | (1 << i)] - values[coalition]
            coalition |= 1 << i
    return phi / math.factorial(n)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_moebius_matches_definition_and_efficiency(n: int) -> None:
    values = np.random.default_rng(n).normal(size=2**n)
    interactions = moebius(values, n)
    np.testing.assert_allclose(interactions, brute_force_interactions(values, n), atol=1e-12)
    assert interactions[1:].sum() == pytest.approx(values[-1] - values[0], abs=1e-12)


def test_moebius_over_leading_axes() -> None:
    values = np.random.default_rng(0).normal(size=(3, 2, 16))
    out = moebius(values, 4)
    for idx in np.ndindex(3, 2):
        np.testing.assert_allclose(out[idx], brute_force_interactions(values[idx], 4), atol=1e-12)


def test_order_limited_transform_is_exact_on_low_orders() -> None:
    n, order = 6, 2
    values = np.random.default_rng(1).normal(size=2**n)
    subsets = subsets_up_to(n, order)
    assert popcounts(subsets).max() == order
    limited = moebius_dense_limited(subsets, values[subsets.astype(np.int64)], n)
    np.testing.assert_allclose(limited, moebius(values, n)[subsets.astype(np.int64)], atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_shapley_from_interactions_matches_permutations(n: int) -> None:
    values = np.random.default_rng(n + 10).normal(size=2**n)
    subsets = np.arange(2**n, dtype=np.uint64)
    phi = shapley_from_interactions(subsets, moebius(values, n), n)
    np.testing.assert_allclose(phi, brute_force_shapley(values, n), atol=1e-12)
    assert phi.sum() == pytest.approx(values[-1] - values[0])
