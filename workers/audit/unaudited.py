"""Unaudited mass: the effects of orders the audit did not classify (docs/science.md, section 5.7).

It belongs to the audit, not to any method: a method's coverage measures what it drops of the
audited effects, and this mass is reported on its own line. Two measures:
- net: the remainder v(N) - v(empty) - sum over 1 <= |S| <= K of I(S), the part of the model's
  total effect that the audited sets do not explain: what a complete method hands out beyond what
  the audit can check. Known in every mode; the limit applies to its share.
- absolute: sum over |S| > K of |I(S)|, known only when every set was enumerated (exact game). It
  counts high-order effects that cancel each other, and their number grows combinatorially with
  the players, so it is shown, not used for the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.interactions import popcounts

__all__ = ["MAX_UNAUDITED_SHARE", "Unaudited", "unaudited_mass"]

# Above this share of the effect mass unaudited, no verdict can be reached (docs/science.md 5.7).
MAX_UNAUDITED_SHARE = 0.5


def _share(part: np.ndarray, rest: np.ndarray) -> float:
    total = float(part.sum() + rest.sum())
    return float(part.sum()) / total if total > 0 else 0.0


@dataclass(frozen=True)
class Unaudited:
    audit_order: int
    audited_mass: np.ndarray  # (B,) sum of |I(S)| over 1 <= |S| <= K
    net_remainder: np.ndarray  # (B,) v(N) - v(empty) - sum_{1<=|S|<=K} I(S), signed
    absolute_mass: np.ndarray | None  # (B,) sum of |I(S)| over |S| > K, when enumerated
    limit: float = MAX_UNAUDITED_SHARE

    @property
    def share(self) -> float:
        """|net remainder| over itself plus the audited mass, pooled over samples."""
        return _share(np.abs(self.net_remainder), self.audited_mass)

    @property
    def absolute_share(self) -> float | None:
        return None if self.absolute_mass is None else _share(self.absolute_mass, self.audited_mass)

    @property
    def too_large(self) -> bool:
        return self.share > self.limit

    def section(self) -> dict[str, object]:
        out: dict[str, object] = {
            "audit_order": self.audit_order,
            "share": self.share,
            "limit": self.limit,
            "net_remainder": self.net_remainder,
            "audited_mass": self.audited_mass,
        }
        if self.absolute_mass is not None:
            out["absolute_mass"] = self.absolute_mass
            out["absolute_share"] = self.absolute_share
        return out


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
    absolute = effect[:, sizes > order].sum(axis=1) if exact else None
    return Unaudited(order, (effect * w)[:, low].sum(axis=1), net, absolute)
