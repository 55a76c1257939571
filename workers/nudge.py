"""A tiny change of an input, to tell a model's value there from rounding noise (docs/science.md 6).

Some models have no value at some inputs, only rounding noise: a normalisation of a map that is
constant there (MONAI's instance norms after a convolution of an all-zero image with default
affine parameters) divides float32 rounding residue by sqrt(eps), and each such layer after it
multiplies the residue again. Two runtimes, or the same one at another batch size, then give
different numbers, and no attribution of the model there means anything. A model that has a value
at an input, however steep, changes about ten times as much for a step ten times as large; noise
changes as much for any step (measured on MONAI's BasicUNet at an all-zero image: 0.27 at a step of
1e-6 of the inputs' scale, 0.38 at 1e-5, 0.11 at 1e-7; at the image's mean, a steep point with a
value, 4.1e-4 and 3.8e-3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["NUDGE", "Nudged", "nudge_test", "nudged"]

NUDGE = 1e-6  # of the scale: above float32's 6e-8, far below any change an audit measures


def nudged(rows: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """``rows`` (float32) moved by +-NUDGE * ``scale`` (one per row, or one for all) entry by entry,
    the signs drawn once from a fixed seed: the same change on every call."""
    rows = np.asarray(rows, dtype=np.float32)
    signs = np.random.default_rng(0).integers(0, 2, size=rows.shape[1:]).astype(np.float32) * 2 - 1
    steps = np.asarray(scale, dtype=np.float32).reshape(-1, *[1] * (rows.ndim - 1)) * NUDGE
    return (rows + steps * signs).astype(np.float32)


@dataclass(frozen=True)
class Nudged:
    """A function's values at rows and one step away, and the change each row may show: ``floor``, or a
    third of the change ten steps away, whichever is larger (a value's changes grow with the step)."""

    at: np.ndarray  # (k, ...) per row
    near: np.ndarray  # (k, ...)
    tolerance: np.ndarray  # (k,)

    @property
    def change(self) -> np.ndarray:
        """(k,) the largest change of each row one step away."""
        return _largest(self.near - self.at)

    @property
    def noise(self) -> np.ndarray:
        """(k,) bool: rows whose value is rounding noise."""
        return self.change > self.tolerance


def nudge_test(
    f: Callable[[np.ndarray], np.ndarray],
    rows: np.ndarray,
    scale: np.ndarray | float,
    floor: np.ndarray | float,
    at: np.ndarray | None = None,
) -> Nudged:
    """``f`` (rows -> values, first axis the rows) at ``rows``, nudged by NUDGE * ``scale``, and by ten
    times that; ``at``: ``f(rows)`` where the caller has it already."""
    at = np.asarray(f(rows) if at is None else at, dtype=np.float64)
    near = np.asarray(f(nudged(rows, scale)), dtype=np.float64)
    farther = np.asarray(f(nudged(rows, 10 * np.asarray(scale))), dtype=np.float64)
    tolerance = np.maximum(floor, _largest(farther - at) / 3)
    return Nudged(at, near, np.broadcast_to(tolerance, (len(at),)).copy())


def _largest(differences: np.ndarray) -> np.ndarray:
    return np.abs(differences).reshape(len(differences), -1).max(axis=1)
