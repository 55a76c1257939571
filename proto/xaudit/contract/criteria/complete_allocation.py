"""Criterion 3, complete allocation: each effect is handed out exactly once, not more."""

from __future__ import annotations

from xaudit.contract.criteria._base import Criterion, Masses, Parts


def _parts(scores: Masses) -> Parts:
    return ((scores.excess, scores.mass),)


COMPLETE_ALLOCATION = Criterion(
    name="complete_allocation",
    title="Complete allocation (nothing handed out twice)",
    question="Is each effect handed out exactly once (mass handed out more than once)?",
    failure="the method counts some effects several times: its map overstates them",
    default_tolerance=0.05,
    parts=_parts,
)
