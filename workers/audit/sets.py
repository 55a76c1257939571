"""Which sets S the audit judges: every set of an order when they are few, a seeded random sample
per order otherwise (docs/science.md, "sets beyond exhaustive enumeration").

Each audited set needs only the sub-inputs x_T with T a subset of S, so the audit's work and memory
grow with the sets audited (their downward closure), never with 2^n. Scores over a sample of sets are
survey estimates: a sampled set of order k stands for C(n, k) / s_k sets (its inverse inclusion
probability), and :mod:`workers.audit.scores` weighs it so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.audit.scores import SetDesign
from workers.interactions import FamilyIndex, downward_closure, family_index, popcounts
from workers.players import as_masks, masks_from_bits

__all__ = [
    "ALL_ORDER_MAX_PLAYERS",
    "DEFAULT_SETS_PER_ORDER",
    "AuditedSets",
    "Stratum",
    "choose_sets",
    "design",
    "enumerated_sets",
]

# Up to this many players every sub-input is attributed (all 2^n, exact game); above, sets are
# chosen here.
ALL_ORDER_MAX_PLAYERS = 10
# Sets audited per order when no budget is given: all of them up to this many (C(64, 2) = 2016 are
# enumerated), a uniform sample of this many above.
DEFAULT_SETS_PER_ORDER = 2048


@dataclass(frozen=True)
class Stratum:
    """One order k: C(n, k) sets in the model, ``sampled`` of them audited."""

    order: int
    population: int
    sampled: int

    @property
    def exhaustive(self) -> bool:
        return self.sampled >= self.population

    @property
    def weight(self) -> float:
        """Inverse inclusion probability of each audited set of this order."""
        return self.population / self.sampled if self.sampled else 0.0


@dataclass(frozen=True)
class AuditedSets:
    """The audited sets (1 <= |S| <= order), their sub-input family and one weight per family row."""

    n: int
    order: int
    seed: int
    strata: tuple[Stratum, ...]
    family: FamilyIndex  # downward closure of the audited sets (always holds the empty set)
    weights: np.ndarray  # (u,) per family row: inverse inclusion probability, 0 if not audited
    stratum_of: np.ndarray  # (u,) order of the row's stratum (0: not audited)

    @property
    def subsets(self) -> np.ndarray:
        return self.family.subsets

    @property
    def sampled(self) -> bool:
        return not all(s.exhaustive for s in self.strata)

    def section(self) -> dict[str, Any]:
        """The report's record: enough to draw the same sets again."""
        return {
            "mode": "sampled" if self.sampled else "enumerated",
            "seed": self.seed,
            "sub_inputs": len(self.subsets),
            "by_order": [
                {
                    "order": s.order,
                    "sets": s.population,
                    "audited": s.sampled,
                    "exhaustive": s.exhaustive,
                    "weight": s.weight,
                }
                for s in self.strata
            ],
        }


def _random_sets(n: int, k: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct uniform k-subsets of n players, as bitmasks (rejection of repeats)."""
    chosen = as_masks([], n)
    while len(chosen) < count:
        draw = max(16, int(1.25 * (count - len(chosen))))
        picks = np.argsort(rng.random((draw, n)), axis=1)[:, :k]
        bits = np.zeros((draw, n), dtype=bool)
        np.put_along_axis(bits, picks, True, axis=1)
        fresh = masks_from_bits(bits)
        # Keep first occurrences in draw order, so the sample depends on the seed only.
        merged = np.concatenate([chosen, fresh])
        _, first = np.unique(merged, return_index=True)
        chosen = merged[np.sort(first)][:count]
    return chosen


def _all_sets(n: int, k: int) -> np.ndarray:
    combos = np.array(list(_combinations(n, k)), dtype=np.int64).reshape(-1, k)
    bits = np.zeros((len(combos), n), dtype=bool)
    if k:
        np.put_along_axis(bits, combos, True, axis=1)
    return masks_from_bits(bits)


def _combinations(n: int, k: int) -> Any:
    import itertools

    return itertools.combinations(range(n), k)


def choose_sets(n: int, order: int, seed: int, per_order: int = DEFAULT_SETS_PER_ORDER) -> AuditedSets:
    """All sets of each order 1..``order`` when C(n, k) <= ``per_order``, else ``per_order`` of them
    drawn uniformly without replacement under ``seed`` (one generator, orders in turn)."""
    order = max(1, min(order, n))
    rng = np.random.default_rng([seed, n, order, per_order])
    strata, drawn = [], []
    for k in range(1, order + 1):
        population = math.comb(n, k)
        sets = _all_sets(n, k) if population <= per_order else _random_sets(n, k, per_order, rng)
        strata.append(Stratum(k, population, len(sets)))
        drawn.append(sets)
    audited = np.concatenate(drawn) if drawn else as_masks([], n)
    family = family_index(downward_closure(audited, n), n)
    return _weighted(n, order, seed, tuple(strata), family, audited)


def enumerated_sets(n: int, subsets: np.ndarray, order: int) -> AuditedSets:
    """Every set of every order up to ``order`` on an already enumerated, downward-closed family."""
    family = family_index(subsets, n)
    sizes = popcounts(family.subsets)
    strata = tuple(Stratum(k, math.comb(n, k), math.comb(n, k)) for k in range(1, min(order, n) + 1))
    audited = family.subsets[(sizes >= 1) & (sizes <= order)]
    return _weighted(n, order, 0, strata, family, audited)


def _weighted(
    n: int, order: int, seed: int, strata: tuple[Stratum, ...], family: FamilyIndex, audited: np.ndarray
) -> AuditedSets:
    rows = family.positions(audited) if len(audited) else np.zeros(0, dtype=np.int64)
    sizes = popcounts(family.subsets)
    weights = np.zeros(len(family.subsets))
    stratum_of = np.zeros(len(family.subsets), dtype=np.int64)
    by_order = {s.order: s for s in strata}
    weights[rows] = [by_order[int(k)].weight for k in sizes[rows]]
    stratum_of[rows] = sizes[rows]
    return AuditedSets(n, order, seed, strata, family, weights, stratum_of)


def design(sets: AuditedSets) -> SetDesign:
    """The survey design the scores weigh by."""
    sampled = tuple((s.order, s.population, s.sampled) for s in sets.strata if not s.exhaustive)
    return SetDesign(sets.weights, sets.stratum_of, sampled)
