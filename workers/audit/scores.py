"""The three criteria as shares of effect mass (docs/science.md, section 5.3), per sample, per order and pooled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.criteria import criterion as registered
from workers.interactions import moebius, moebius_dense_limited, popcounts
from workers.players import subset_bits

__all__ = ["AllocationScores", "moebius_shares", "score_allocation"]


def moebius_shares(subsets: np.ndarray, per_player: np.ndarray, n: int) -> np.ndarray:
    """A_i(S) = sum_{T subset S} (-1)^{|S|-|T|} a_i(x_T): (B, m, n) from (B, m, n) over the subset axis."""
    moved = np.moveaxis(per_player, 1, -1)  # (B, n, m)
    shares = moebius(moved, n) if len(subsets) == 2**n else moebius_dense_limited(subsets, moved, n)
    return np.moveaxis(shares, -1, 1)


@dataclass(frozen=True)
class AllocationScores:
    """Numerators and denominators per sample, so that scores pool over samples by mass."""

    dropped: np.ndarray  # (B,) audited mass not handed out
    excess: np.ndarray  # (B,) mass handed out more than once
    out_of_set: np.ndarray  # (B,) mass given outside S, plus attribution at the reference itself
    mass: np.ndarray  # (B,) audited effect mass sum |I(S)|
    excluded_mass: np.ndarray  # (B,) effect mass under the noise floor, left out of the ratios
    absent: np.ndarray  # (B,) attribution mass given to absent units on sub-inputs
    attribution_mass: np.ndarray  # (B,) all attribution mass on sub-inputs
    residual: np.ndarray  # (B,) sum_T |d(T)|
    game_mass: np.ndarray  # (B,) sum_T |v(T) - v(empty)|
    by_order: list[dict[str, float | int | None]]
    # Per-set detail for evidence: (B, m) arrays.
    ratio: np.ndarray
    set_dropped: np.ndarray
    set_excess: np.ndarray
    set_out_of_set: np.ndarray
    audited: np.ndarray  # (B, m) bool

    def per_sample(self, criterion: str) -> np.ndarray:
        return registered(criterion).per_sample(self)

    def pooled(self, criterion: str) -> float:
        """Mass-weighted over samples."""
        return registered(criterion).pooled(self)

    @property
    def out_of_set_share(self) -> float:
        total = float(self.mass.sum())
        return float(self.out_of_set.sum()) / total if total > 0 else 0.0

    @property
    def absent_share(self) -> float:
        total = float(self.attribution_mass.sum())
        return float(self.absent.sum()) / total if total > 0 else 0.0

    @property
    def completeness_residual(self) -> float:
        total = float(self.game_mass.sum())
        return float(self.residual.sum()) / total if total > 0 else float(self.residual.sum())

    @property
    def excluded_share(self) -> float:
        total = float(self.mass.sum() + self.excluded_mass.sum())
        return float(self.excluded_mass.sum()) / total if total > 0 else 0.0


def score_allocation(
    subsets: np.ndarray,
    n: int,
    values: np.ndarray,
    interactions: np.ndarray,
    per_player: np.ndarray,
    shares: np.ndarray,
    floor: np.ndarray,
    max_order: int,
    absent_mass: np.ndarray,
    attribution_mass: np.ndarray,
) -> AllocationScores:
    """Score one method's allocation against the game.

    values, interactions: (B, m) over ``subsets``; per_player a_i(x_T) and shares A_i(S): (B, m, n);
    floor: (B, m). Sets with 1 <= |S| <= max_order and |I(S)| above the floor are judged.
    Effects of orders above ``max_order`` are the audit's unaudited mass
    (:mod:`workers.audit.unaudited`), never a method's dropped mass.
    ``absent_mass``, ``attribution_mass`` (B,): measured on the sub-inputs themselves
    (:class:`workers.audit.subinputs.SubInputAttributions`; for distribution methods averaged over
    constituents, where averaging the attributions first could cancel signs).
    """
    sizes = popcounts(subsets)
    members = subset_bits(subsets, n)  # (m, n)
    in_range = (sizes >= 1) & (sizes <= max_order)
    effect = np.abs(interactions)
    audited = in_range[None, :] & (effect > floor)
    handed = shares.sum(axis=2)
    safe_i = np.where(audited, interactions, 1.0)
    ratio = np.where(audited, handed / safe_i, np.nan)
    set_dropped = np.where(audited, effect * np.clip(1.0 - np.nan_to_num(ratio), 0.0, 1.0), 0.0)
    set_excess = np.where(audited, effect * np.maximum(np.nan_to_num(ratio) - 1.0, 0.0), 0.0)
    outside = (np.abs(shares) * (~members)[None]).sum(axis=2)
    set_out = np.where(audited, outside, 0.0)
    mass = np.where(audited, effect, 0.0).sum(axis=1)
    excluded = np.where(in_range[None, :] & ~audited, effect, 0.0).sum(axis=1)
    empty = subsets == 0
    at_reference = np.abs(shares[:, empty, :]).sum(axis=(1, 2))
    dropped = set_dropped.sum(axis=1)
    residual = per_player.sum(axis=2) - (values - values[:, :1])
    by_order = []
    for k in range(1, max_order + 1):
        sel = audited & (sizes == k)[None, :]
        order_mass = float(np.where(sel, effect, 0.0).sum())
        by_order.append(
            {
                "order": k,
                "sets": int((sizes == k).sum()),
                "audited_sets": int(sel.sum()),
                "mass": order_mass,
                "dropped": float(set_dropped[sel].sum()) / order_mass if order_mass else 0.0,
                "excess": float(set_excess[sel].sum()) / order_mass if order_mass else 0.0,
                "out_of_set": float(set_out[sel].sum()) / order_mass if order_mass else 0.0,
                "mean_ratio": float(np.nanmean(ratio[sel])) if sel.any() else None,
            }
        )
    return AllocationScores(
        dropped=dropped,
        excess=set_excess.sum(axis=1),
        out_of_set=set_out.sum(axis=1) + at_reference,
        mass=mass,
        excluded_mass=excluded,
        absent=absent_mass,
        attribution_mass=attribution_mass,
        residual=np.abs(residual).sum(axis=1),
        game_mass=np.abs(values - values[:, :1]).sum(axis=1),
        by_order=by_order,
        ratio=ratio,
        set_dropped=set_dropped,
        set_excess=set_excess,
        set_out_of_set=set_out,
        audited=audited,
    )
