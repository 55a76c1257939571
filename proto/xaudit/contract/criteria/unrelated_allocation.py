"""Criterion 2, no unrelated allocation: the effect of a set goes only to its members, and absent
units get nothing."""

from __future__ import annotations

from xaudit.contract.criteria._base import Criterion, Masses, Parts


def _parts(scores: Masses) -> Parts:
    return ((scores.out_of_set, scores.mass), (scores.absent, scores.attribution_mass))


UNRELATED_ALLOCATION = Criterion(
    name="unrelated_allocation",
    title="No unrelated allocation",
    question="Does the effect of a set go only to its members (mass given outside the set, or to absent units)?",
    failure="the method credits units with effects they take no part in",
    default_tolerance=0.05,
    parts=_parts,
)
