"""Which background samples a distribution method averages over: the same for its maps and its audit.

Up to :data:`MAX_EXACT_REFERENCES` samples, all of them (the expectation over a finite background is
computed exactly, docs/science.md section 5.5). Beyond, a seeded sample of that many, and whoever
reports the result says so (:class:`ReferenceChoice` carries how many were given and used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.methods._base import derived_seed

__all__ = ["MAX_EXACT_REFERENCES", "ReferenceChoice", "choose_references", "references_used"]

MAX_EXACT_REFERENCES = 64


@dataclass(frozen=True)
class ReferenceChoice:
    references: np.ndarray  # (k, *sample_shape)
    given: int  # background samples attached to the job

    @property
    def used(self) -> int:
        return len(self.references)

    @property
    def sampled(self) -> bool:
        return self.used < self.given


def references_used(given: int) -> int:
    """How many of ``given`` background samples a job averages over (all up to the exact limit)."""
    return min(given, MAX_EXACT_REFERENCES)


def choose_references(background: np.ndarray, seed: int) -> ReferenceChoice:
    """All of ``background`` up to the exact limit; a seeded, order-preserving subset beyond it."""
    if references_used(len(background)) == len(background):
        return ReferenceChoice(background, len(background))
    rng = np.random.default_rng(derived_seed(seed, "references"))
    keep = np.sort(rng.choice(len(background), references_used(len(background)), replace=False))
    return ReferenceChoice(background[keep], len(background))
