"""Criterion 3, complete allocation: each effect is handed out exactly once, not more."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.criteria._base import Criterion, Parts

if TYPE_CHECKING:
    from workers.audit.scores import AllocationScores


def _parts(scores: AllocationScores) -> Parts:
    return ((scores.excess, scores.mass),)


COMPLETE_ALLOCATION = Criterion(
    name="complete_allocation",
    title="Complete allocation (nothing handed out twice)",
    question="Is each effect handed out exactly once (mass handed out more than once)?",
    failure="the method counts some effects several times: its map overstates them",
    default_tolerance=0.05,
    parts=_parts,
)
