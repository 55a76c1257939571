"""Shapley values beyond the exact limit against closed forms: phi_i = sum over S containing i of I(S)/|S|."""

from __future__ import annotations

import numpy as np

from workers.shapley_estimate import MAX_EXACT_PRESENT, estimate_shapley


def _polynomial_game(n: int, seed: int) -> tuple[list[tuple[tuple[int, ...], float]], np.ndarray]:
    """A game with known interactions on random sets of order 1..4, and its Shapley values."""
    rng = np.random.default_rng(seed)
    terms = [((i,), float(rng.normal())) for i in range(n)]
    for k in (2, 3, 4):
        for _ in range(3 * n):
            terms.append((tuple(int(i) for i in rng.choice(n, k, replace=False)), float(rng.normal()) / k))
    phi = np.zeros(n)
    for members, effect in terms:
        phi[list(members)] += effect / len(members)
    return terms, phi


def _oracle(terms: list[tuple[tuple[int, ...], float]], n: int):  # type: ignore[no-untyped-def]
    index = np.zeros((len(terms), n), dtype=bool)
    for row, (members, _) in enumerate(terms):
        index[row, list(members)] = True
    effects = np.array([e for _, e in terms])
    sizes = index.sum(axis=1)

    def value(bits: np.ndarray) -> np.ndarray:
        covered = bits.astype(np.int64) @ index.T.astype(np.int64)  # members present per term
        return (covered == sizes[None]).astype(np.float64) @ effects

    return value


def test_exact_on_present_players_with_null_players() -> None:
    n = 40
    terms, phi = _polynomial_game(12, seed=1)  # players 0..11 carry every effect
    present = np.zeros(n, dtype=bool)
    present[:12] = True
    result = estimate_shapley(_oracle(terms, n), present, 64, np.random.default_rng(0))
    assert result.exact and result.evaluations == 2**12
    np.testing.assert_allclose(result.values[:12], phi, atol=1e-10)
    assert not result.values[12:].any()


def test_permutation_estimate_within_its_standard_error() -> None:
    n = 48
    assert n > MAX_EXACT_PRESENT
    terms, phi = _polynomial_game(n, seed=2)
    value = _oracle(terms, n)
    z = []
    for seed in range(4):
        result = estimate_shapley(value, np.ones(n, dtype=bool), 200, np.random.default_rng(seed))
        assert not result.exact and result.evaluations == 200 * (n + 1)
        # Efficiency holds for every permutation, hence for the estimate.
        assert np.isclose(result.values.sum(), value(np.ones((1, n), dtype=bool))[0])
        assert (result.standard_error > 0).all()
        z.append((result.values - phi) / result.standard_error)
    zs = np.abs(np.concatenate(z))
    assert zs.max() < 5.0
    assert (zs < 2.0).mean() >= 0.85  # about 95% for a calibrated standard error
    assert (zs < 0.5).mean() < 0.7  # and not wildly conservative
