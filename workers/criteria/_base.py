"""What a criterion is: a name, words for the reader, a default tolerance, and its score as a
mass-weighted ratio (or the largest of several) over the audited samples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workers.audit.scores import AllocationScores

__all__ = ["Criterion", "Parts"]

# (numerator, denominator) per sample, each (B,): the score is sum(num) / sum(den), the largest over parts.
Parts = tuple[tuple[np.ndarray, np.ndarray], ...]


@dataclass(frozen=True)
class Criterion:
    name: str
    title: str  # heading for tables and pages
    question: str  # what it asks, one sentence for the reader
    failure: str  # what a failure means, one sentence
    default_tolerance: float
    parts: Callable[[AllocationScores], Parts]

    def pooled(self, scores: AllocationScores) -> float:
        """The score over all samples: mass-weighted, the largest part."""
        return max(_ratio(float(num.sum()), float(den.sum())) for num, den in self.parts(scores))

    def per_sample(self, scores: AllocationScores) -> np.ndarray:
        ratios = [
            np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0) for num, den in self.parts(scores)
        ]
        return np.max(np.stack(ratios), axis=0)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0
