"""Noise floors: how large an effect must be before its allocation can be judged set by set.

The shares A_i(S) are alternating sums over 2^|S| sub-inputs, so independent errors of size sigma on
each sub-input grow to about sigma * 2^(|S|/2) (docs/science.md, section 5.3). The floor is estimated from the
method's own completeness residuals d(T) = sum_i a_i(x_T) - (v(T) - v(empty)), from the part of them
that is noise rather than systematic allocation:
- discretisation: how much d(T) moves when the method's resolution (e.g. quadrature steps) is halved;
- Monte Carlo: how much d(T) moves between repeats under other seeds (stochastic methods);
- rounding: a float32 floor relative to the game's scale.
A method's systematic residual (Occlusion's over-allocation, say) does not move with resolution or
seed, so it never raises the floor and never hides itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.interactions import popcounts

__all__ = ["DEFAULT_Z", "NoiseFloor", "estimate_floor"]

DEFAULT_Z = 3.0
# float32 model outputs carry ~1e-7 relative rounding; allow a few ulps of the game's scale.
FLOAT_FLOOR = 1e-6


@dataclass(frozen=True)
class NoiseFloor:
    z: float
    rounding_sigma: np.ndarray  # (B,)
    discretisation_sigma: np.ndarray  # (B,)
    monte_carlo_sigma: np.ndarray  # (B,)
    per_set: np.ndarray  # (B, m): |I(S)| must exceed this to be judged

    def per_order(self, subsets: np.ndarray, max_order: int) -> list[float]:
        sizes = popcounts(subsets)
        return [
            float(self.per_set[:, sizes == k].mean()) if (sizes == k).any() else 0.0
            for k in range(1, max_order + 1)
        ]

    @property
    def sigma(self) -> np.ndarray:
        return np.sqrt(self.rounding_sigma**2 + self.discretisation_sigma**2 + self.monte_carlo_sigma**2)


def _rms(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(x**2, axis=1))


def estimate_floor(
    subsets: np.ndarray,
    values: np.ndarray,
    coarse_shift: np.ndarray | None = None,
    repeats: np.ndarray | None = None,
    z: float = DEFAULT_Z,
) -> NoiseFloor:
    """Floors (B, m) for a method's allocation against the game ``values`` (B, m).

    ``coarse_shift`` (B, k): how much sum_i a_i(x_T) moves at half resolution, on k sampled sub-inputs;
    ``repeats`` (R, B, m, n): the attributions under other seeds.
    """
    scale = np.abs(values).max(axis=1) + np.abs(values - values[:, :1]).max(axis=1)
    rounding = FLOAT_FLOOR * scale
    discretisation = _rms(coarse_shift) if coarse_shift is not None else np.zeros(len(values))
    if repeats is not None and len(repeats) > 1:
        monte_carlo = np.sqrt(np.mean(repeats.sum(axis=3).var(axis=0, ddof=1), axis=1))
    else:
        monte_carlo = np.zeros(len(values))
    sigma = np.sqrt(rounding**2 + discretisation**2 + monte_carlo**2)
    amplification = np.sqrt(2.0 ** popcounts(subsets))[None, :]
    return NoiseFloor(z, rounding, discretisation, monte_carlo, z * sigma[:, None] * amplification)
