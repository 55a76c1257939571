"""Criterion 1, low approximation error: every audited effect is handed out; none is dropped."""

from __future__ import annotations

from xaudit.contract.criteria._base import Criterion, Masses, Parts


def _parts(scores: Masses) -> Parts:
    return ((scores.dropped, scores.mass),)


COVERAGE = Criterion(
    name="coverage",
    title="Coverage (nothing dropped)",
    question="Does the method hand out every audited effect (dropped share of the effect mass)?",
    failure="the method drops part of the model's effects: its map misses what the model does",
    default_tolerance=0.05,
    parts=_parts,
)
