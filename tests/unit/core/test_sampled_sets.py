"""Sampled sets with sparse bookkeeping against closed forms (docs/science.md, sets beyond enumeration).

A polynomial game is defined by its interactions I(S) on every set of order <= 3; an allocation by
shares A_i(S) = I(S) * alpha(S) / |S| for i in S, so that r(S) = alpha(S) and the population scores
have closed forms. Sub-input attributions a_i(x_T) are the zeta transform of the shares, exactly
what a method would give; the audit must recover the scores from the sampled sets alone.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workers.audit.scores import moebius_shares, score_allocation
from workers.audit.sets import choose_sets, design, enumerated_sets
from workers.interactions import downward_closure, family_index, moebius, moebius_dense_limited, popcounts
from workers.players import as_masks, masks_from_bits, subset_bits

ORDER = 3


def _effect(members: tuple[int, ...]) -> float:
    """A deterministic I(S) for every set up to order 3 (large singletons, smaller pairs, triples)."""
    k = len(members)
    if k == 0:
        return 0.0
    key = sum((i + 1) * 7919 ** (j + 1) for j, i in enumerate(members))
    return (2.0 / k**2) * math.sin(0.37 * key) + (0.3 if k == 1 else 0.0)


def _alpha(members: tuple[int, ...]) -> float:
    """The share of I(S) a synthetic method hands out: sometimes too little, sometimes too much."""
    key = sum((i + 3) * 104729 ** (j + 1) for j, i in enumerate(members))
    return 1.0 + 0.6 * math.sin(1.3 * key)


def _members(masks: np.ndarray, n: int) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in np.flatnonzero(row)) for row in subset_bits(masks, n)]


def _population_scores(n: int) -> dict[str, float]:
    dropped = excess = mass = 0.0
    for k in range(1, ORDER + 1):
        for members in itertools.combinations(range(n), k):
            effect, alpha = abs(_effect(members)), _alpha(members)
            mass += effect
            dropped += effect * min(max(1.0 - alpha, 0.0), 1.0)
            excess += effect * max(alpha - 1.0, 0.0)
    return {"coverage": dropped / mass, "complete_allocation": excess / mass}


def _audit(n: int, sets) -> object:  # type: ignore[no-untyped-def]
    family = sets.family
    members = _members(family.subsets, n)
    interactions = np.array([[_effect(m) for m in members]])  # (1, u)
    values = family.zeta(interactions)
    shares = np.zeros((1, len(members), n))
    for row, m in enumerate(members):
        for i in m:
            shares[0, row, i] = interactions[0, row] * _alpha(m) / len(m)
    per_player = np.moveaxis(family.zeta(np.moveaxis(shares, 1, -1)), -1, 1)
    recovered = moebius_shares(family.subsets, per_player, n, family)
    np.testing.assert_allclose(recovered, shares, atol=1e-9)
    np.testing.assert_allclose(family.moebius(values), interactions, atol=1e-9)
    floor = np.zeros_like(values)
    ones = np.ones(1)
    return score_allocation(
        family.subsets, n, values, interactions, per_player, recovered, floor, ORDER,
        0 * ones, ones, design(sets),
    )  # fmt: skip


def test_family_transform_equals_dense() -> None:
    n = 7
    rng = np.random.default_rng(0)
    subsets = np.arange(2**n, dtype=np.uint64)
    limited = subsets[popcounts(subsets) <= 3]
    values = rng.normal(size=(3, len(limited)))
    index = family_index(limited, n)
    np.testing.assert_allclose(index.moebius(values), moebius_dense_limited(limited, values, n), atol=1e-12)
    np.testing.assert_allclose(index.zeta(index.moebius(values)), values, atol=1e-12)
    full = rng.normal(size=(2, 2**n))
    np.testing.assert_allclose(family_index(subsets, n).moebius(full), moebius(full, n), atol=1e-12)


def test_downward_closure_holds_every_subset_once() -> None:
    n = 9
    sets = as_masks([0b1011, 0b110000000, 0b1], n)
    closed = downward_closure(sets, n)
    expected = sorted({t for s in (0b1011, 0b110000000) for t in range(2**n) if t & s == t})
    assert [int(t) for t in closed] == expected


def test_masks_above_64_players_round_trip() -> None:
    n = 200
    bits = np.zeros((3, n), dtype=bool)
    bits[0, [0, 199]] = True
    bits[1, [64, 65, 130]] = True
    masks = masks_from_bits(bits)
    assert masks.dtype == object and int(masks[0]) == 1 | (1 << 199)
    np.testing.assert_array_equal(subset_bits(masks, n), bits)
    np.testing.assert_array_equal(popcounts(masks), [2, 3, 0])
    index = family_index(downward_closure(masks, n), n)
    assert len(index.subsets) == 4 + 8 - 1  # one empty set shared


def test_exhaustive_design_equals_the_unweighted_scores_exactly() -> None:
    n = 12
    sets = choose_sets(n, ORDER, seed=0)
    assert not sets.sampled and len(sets.subsets) == sum(math.comb(n, k) for k in range(ORDER + 1))
    weighted = _audit(n, sets)
    again = enumerated_sets(n, sets.subsets, ORDER)
    assert np.array_equal(again.weights, sets.weights)
    for criterion in ("coverage", "complete_allocation", "unrelated_allocation"):
        assert weighted.sampling_se(criterion) == 0.0
    truth = _population_scores(n)
    assert weighted.pooled("coverage") == pytest.approx(truth["coverage"], abs=1e-12)
    assert weighted.pooled("complete_allocation") == pytest.approx(truth["complete_allocation"], abs=1e-12)


def test_sampled_estimates_fall_within_their_standard_errors() -> None:
    n = 30  # 4525 sets up to order 3; 150 per order are drawn
    truth = _population_scores(n)
    z = {"coverage": [], "complete_allocation": []}
    for seed in range(12):
        sets = choose_sets(n, ORDER, seed=seed, per_order=150)
        assert sets.sampled and [s.sampled for s in sets.strata] == [30, 150, 150]
        scores = _audit(n, sets)
        for criterion, values in z.items():
            se = scores.sampling_se(criterion)
            assert se > 0
            values.append((scores.pooled(criterion) - truth[criterion]) / se)
    for criterion, values in z.items():
        zs = np.abs(values)
        assert zs.max() < 4.0, (criterion, values)
        assert (zs < 2.0).mean() >= 0.75, (criterion, values)


def test_sets_are_drawn_by_seed() -> None:
    a = choose_sets(64, 3, seed=5)
    b = choose_sets(64, 3, seed=5)
    c = choose_sets(64, 3, seed=6)
    assert np.array_equal(a.subsets, b.subsets) and not np.array_equal(a.subsets, c.subsets)
    assert [s.exhaustive for s in a.strata] == [True, True, False]
    assert a.section()["seed"] == 5 and a.section()["by_order"][2]["audited"] == 2048


def test_256_players_stay_sparse() -> None:
    sets = choose_sets(256, 3, seed=0, per_order=256)
    assert sets.subsets.dtype == object
    # 1 + 256 singletons + sampled pairs + the pairs and triples of sampled triples: thousands, not 2^256.
    assert len(sets.subsets) < 1 + 256 + 256 + 4 * 256
    assert int(popcounts(sets.subsets).max()) == 3
