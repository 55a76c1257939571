"""What a criterion is: a name, words for the reader, a default tolerance, and which per-sample
masses make its score: sum(numerator) / sum(denominator) over samples, the largest over its parts.

Pure data and attribute picking (standard library only): the audit evaluates the parts with numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Criterion", "Masses", "Parts"]

# (numerator, denominator) per sample, each an array (B,).
Parts = tuple[tuple[Any, Any], ...]


class Masses(Protocol):
    """The per-sample masses an allocation's scores are made of (workers.audit.scores)."""

    dropped: Any  # audited effect mass not handed out
    excess: Any  # mass handed out more than once
    out_of_set: Any  # mass given outside the set, plus attribution at the reference
    mass: Any  # audited effect mass
    absent: Any  # attribution given to absent units on sub-inputs
    attribution_mass: Any  # all attribution on sub-inputs


@dataclass(frozen=True)
class Criterion:
    name: str
    title: str  # heading for tables and pages
    question: str  # what it asks, one sentence for the reader
    failure: str  # what a failure means, one sentence
    default_tolerance: float
    parts: Callable[[Masses], Parts]
