"""Unaudited mass: the effects of orders the audit did not classify (docs/science.md, section 5.7).

It belongs to the audit, not to any method: a method's coverage measures what it drops of the
audited effects, and this mass is reported on its own line. When every set was enumerated (exact
game) its absolute size sum over |S| > K of |I(S)| is known; otherwise only the net remainder
v(N) - v(empty) - sum over |S| <= K of I(S) is, a lower bound of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from workers.interactions import popcounts

__all__ = ["MAX_UNAUDITED_SHARE", "Unaudited", "unaudited_mass"]

# Above this share of the effect mass unaudited, no verdict can be reached (docs/science.md 5.7).
MAX_UNAUDITED_SHARE = 0.5


@dataclass(frozen=True)
class Unaudited:
    audit_order: int
    measure: Literal["absolute", "net"]  # absolute: sum |I(S)| over |S| > K; net: |remainder|
    mass: np.ndarray  # (B,) unaudited effect mass
    audited_mass: np.ndarray  # (B,) sum of |I(S)| over 1 <= |S| <= K
    net_remainder: np.ndarray  # (B,) v(N) - v(empty) - sum_{1<=|S|<=K} I(S), signed
    limit: float = MAX_UNAUDITED_SHARE

    @property
    def share(self) -> float:
        """Unaudited over all effect mass, pooled over samples."""
        total = float(self.mass.sum() + self.audited_mass.sum())
        return float(self.mass.sum()) / total if total > 0 else 0.0

    @property
    def too_large(self) -> bool:
        return self.share > self.limit

    def section(self) -> dict[str, object]:
        return {
            "audit_order": self.audit_order,
            "measure": self.measure,
            "share": self.share,
            "limit": self.limit,
            "mass": self.mass,
            "audited_mass": self.audited_mass,
            "net_remainder": self.net_remainder,
        }


def unaudited_mass(
    subsets: np.ndarray,
    interactions: np.ndarray,
    full: np.ndarray,
    order: int,
    exact: bool,
    weights: np.ndarray | None = None,
) -> Unaudited:
    """From I(S) on ``subsets`` (B, m) and v(N) ``full`` (B,); ``subsets[0]`` is the empty set.

    ``weights`` (m,): survey weights of sampled sets (workers.audit.sets); the sums over audited
    orders are then estimates over all sets of those orders.
    """
    sizes = popcounts(subsets)
    low = (sizes >= 1) & (sizes <= order)
    w = np.ones(len(subsets)) if weights is None else weights
    effect = np.abs(interactions)
    net = full - interactions[:, 0] - (interactions * w)[:, low].sum(axis=1)
    audited = (effect * w)[:, low].sum(axis=1)
    if exact:
        mass = effect[:, sizes > order].sum(axis=1)
        return Unaudited(order, "absolute", mass, audited, net)
    return Unaudited(order, "net", np.abs(net), audited, net)
