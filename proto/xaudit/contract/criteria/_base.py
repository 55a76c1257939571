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

    @property
    def dropped(self) -> Any: ...  # audited effect mass not handed out
    @property
    def excess(self) -> Any: ...  # mass handed out more than once
    @property
    def out_of_set(self) -> Any: ...  # mass given outside the set, plus attribution at the reference
    @property
    def mass(self) -> Any: ...  # audited effect mass
    @property
    def absent(self) -> Any: ...  # attribution given to absent units on sub-inputs
    @property
    def attribution_mass(self) -> Any: ...  # all attribution on sub-inputs


@dataclass(frozen=True)
class Criterion:
    name: str
    title: str  # heading for tables and pages
    question: str  # what it asks, one sentence for the reader
    failure: str  # what a failure means, one sentence
    default_tolerance: float
    parts: Callable[[Masses], Parts]
