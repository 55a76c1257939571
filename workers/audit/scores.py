"""The three criteria as shares of effect mass (docs/science.md, section 5.3), per sample, per order and pooled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.interactions import FamilyIndex, family_index, moebius, popcounts
from workers.players import subset_bits
from xaudit.contract.criteria import criterion as registered

__all__ = ["AllocationScores", "SetDesign", "moebius_shares", "safe_ratio", "score_allocation"]


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else 0 (a share of no mass is no share)."""
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


@dataclass(frozen=True)
class SetDesign:
    """How the audited sets were chosen (built by workers.audit.sets): per set its weight (inverse
    inclusion probability; 0: in the family only as a sub-input) and stratum (its order when audited),
    and each sampled stratum as (order, population, sampled)."""

    weights: np.ndarray  # (m,)
    stratum_of: np.ndarray  # (m,)
    sampled_strata: tuple[tuple[int, int, int], ...]


def moebius_shares(
    subsets: np.ndarray, per_player: np.ndarray, n: int, index: FamilyIndex | None = None
) -> np.ndarray:
    """A_i(S) = sum_{T subset S} (-1)^{|S|-|T|} a_i(x_T): (B, m, n) from (B, m, n) over the subset axis.

    All 2^n sets: the dense fast transform. Any other (downward-closed) family: the sparse transform
    over the family itself (``index``, built here if not given), so nothing is 2^n.
    """
    moved = np.moveaxis(per_player, 1, -1)  # (B, n, m)
    if len(subsets) == 2**n:
        shares = moebius(moved, n)
    else:
        shares = (index or family_index(subsets, n)).moebius(moved)
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
    set_effect: np.ndarray  # (B, m) |I(S)|
    # Survey design of the audited sets (workers.audit.sets): weight and stratum per set, and per
    # sampled stratum (order, population, sampled). Empty when every set was enumerated.
    weights: np.ndarray | None = None  # (m,)
    stratum_of: np.ndarray | None = None  # (m,)
    sampled_strata: tuple[tuple[int, int, int], ...] = ()

    def per_sample(self, criterion: str) -> np.ndarray:
        ratios = [safe_ratio(num, den) for num, den in registered(criterion).parts(self)]
        return np.max(np.stack(ratios), axis=0)

    def pooled(self, criterion: str) -> float:
        """Mass-weighted over samples."""
        return max(
            float(num.sum()) / float(den.sum()) if float(den.sum()) > 0 else 0.0
            for num, den in registered(criterion).parts(self)
        )

    def sampling_se(self, criterion: str) -> float:
        """Standard error of :meth:`pooled` from sampling the sets (0 when every set was enumerated).

        The pooled score is a ratio estimator R = sum_j w_j y_j / sum_j w_j x_j over audited sets j
        (y: the criterion's mass, x: |I(S)|, both summed over samples); its linearised variance under
        stratified sampling without replacement is
        sum_k N_k^2 (1 - s_k/N_k) var_k(y - R x) / s_k, over X^2 (docs/science.md).
        """
        if not self.sampled_strata or self.weights is None or self.stratum_of is None:
            return 0.0
        numerator = {
            "coverage": self.set_dropped,
            "complete_allocation": self.set_excess,
            "unrelated_allocation": self.set_out_of_set,
        }[criterion]
        if criterion == "unrelated_allocation" and self.absent_share > self.out_of_set_share:
            return 0.0  # the absent-unit share is measured on every sub-input, not estimated
        effect = np.where(self.audited, self.set_effect, 0.0).sum(axis=0)  # (m,)
        y = numerator.sum(axis=0)
        total = float((self.weights * effect).sum())
        if total <= 0:
            return 0.0
        ratio = float((self.weights * y).sum()) / total
        variance = 0.0
        for order, population, sampled in self.sampled_strata:
            e = (y - ratio * effect)[self.stratum_of == order]
            if sampled > 1:
                variance += population**2 * (1 - sampled / population) * float(e.var(ddof=1)) / sampled
        return float(np.sqrt(variance)) / total

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
    def effect_mass(self) -> float:
        """All audited effect mass, the part under the noise floor included."""
        return float(self.mass.sum() + self.excluded_mass.sum())

    @property
    def excluded_share(self) -> float:
        total = self.effect_mass
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
    design: SetDesign | None = None,
) -> AllocationScores:
    """Score one method's allocation against the game.

    values, interactions: (B, m) over ``subsets``; per_player a_i(x_T) and shares A_i(S): (B, m, n);
    floor: (B, m). Sets with 1 <= |S| <= max_order and |I(S)| above the floor are judged.
    Effects of orders above ``max_order`` are the audit's unaudited mass
    (:mod:`workers.audit.unaudited`), never a method's dropped mass.
    ``absent_mass``, ``attribution_mass`` (B,): measured on the sub-inputs themselves
    (:class:`workers.audit.subinputs.SubInputAttributions`; for distribution methods averaged over
    constituents, where averaging the attributions first could cancel signs).
    ``design``: the weights of sampled sets (workers.audit.sets); without it every set in range
    counts once. Per-set arrays stay unweighted (evidence); sums are survey estimates.
    """
    sizes = popcounts(subsets)
    members = subset_bits(subsets, n)  # (m, n)
    weight = np.ones(len(subsets)) if design is None else design.weights
    in_range = (sizes >= 1) & (sizes <= max_order) & (weight > 0)
    effect = np.abs(interactions)
    audited = in_range[None, :] & (effect > floor)
    handed = shares.sum(axis=2)
    safe_i = np.where(audited, interactions, 1.0)
    ratio = np.where(audited, handed / safe_i, np.nan)
    set_dropped = np.where(audited, effect * np.clip(1.0 - np.nan_to_num(ratio), 0.0, 1.0), 0.0)
    set_excess = np.where(audited, effect * np.maximum(np.nan_to_num(ratio) - 1.0, 0.0), 0.0)
    outside = (np.abs(shares) * (~members)[None]).sum(axis=2)
    set_out = np.where(audited, outside, 0.0)
    mass = (np.where(audited, effect, 0.0) * weight).sum(axis=1)
    excluded = (np.where(in_range[None, :] & ~audited, effect, 0.0) * weight).sum(axis=1)
    empty = subsets == 0
    at_reference = np.abs(shares[:, empty, :]).sum(axis=(1, 2))
    dropped = (set_dropped * weight).sum(axis=1)
    residual = per_player.sum(axis=2) - (values - values[:, :1])
    by_order = []
    for k in range(1, max_order + 1):
        sel = audited & (sizes == k)[None, :]
        order_weight = np.where(sel, weight, 0.0)
        order_mass = float((effect * order_weight).sum())

        def share(per_set: np.ndarray, w: np.ndarray = order_weight, m: float = order_mass) -> float:
            return float((per_set * w).sum()) / m if m else 0.0

        by_order.append(
            {
                "order": k,
                "sets": round(float(weight[(sizes == k)].sum())),
                "audited_sets": int(sel.sum()),
                "mass": order_mass,
                "dropped": share(set_dropped),
                "excess": share(set_excess),
                "out_of_set": share(set_out),
                "mean_ratio": float(np.nanmean(ratio[sel])) if sel.any() else None,
            }
        )
    return AllocationScores(
        dropped=dropped,
        excess=(set_excess * weight).sum(axis=1),
        out_of_set=(set_out * weight).sum(axis=1) + at_reference,
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
        set_effect=effect,
        weights=None if design is None else design.weights,
        stratum_of=None if design is None else design.stratum_of,
        sampled_strata=() if design is None else design.sampled_strata,
    )
