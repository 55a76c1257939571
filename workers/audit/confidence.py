"""Confidence intervals of criterion scores (docs/science.md, section 6).

A score is a mass-weighted ratio over the audited samples. Its interval combines three sources:
- samples: a percentile bootstrap over the samples (which inputs happened to be audited);
- seeds: the spread of the score over repeats under other seeds (stochastic methods);
- set sampling: the standard error of a score estimated from a sample of sets (zero when every
  set of the audited orders was enumerated; the sampled-set estimator supplies it).
The bootstrap gives the interval's shape; the other two widen both ends in quadrature.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from workers.audit.scores import safe_ratio
from xaudit.contract.criteria import Parts

__all__ = ["BOOTSTRAP_RESAMPLES", "DEFAULT_LEVEL", "Interval", "interval"]

DEFAULT_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    score: float
    lower: float
    upper: float
    level: float
    bootstrap: tuple[float, float]  # percentile interval over samples alone
    seed_sd: float  # standard deviation over seeds (0 for deterministic methods)
    set_sampling_se: float  # standard error from sampled sets (0 when enumerated)
    samples: int

    def section(self) -> dict[str, object]:
        return {
            "lower": self.lower,
            "upper": self.upper,
            "level": self.level,
            "samples": self.samples,
            "sources": {
                "bootstrap": list(self.bootstrap),
                "seed_sd": self.seed_sd,
                "set_sampling_se": self.set_sampling_se,
            },
        }


def interval(
    parts: Parts,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
    seed_sd: float = 0.0,
    set_sampling_se: float = 0.0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Interval:
    """The score (largest part of sum(num) / sum(den)) and its interval at ``level``."""
    samples = len(parts[0][0])
    score = float(max(safe_ratio(np.asarray(n.sum()), np.asarray(d.sum())) for n, d in parts))
    if samples > 1:
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(samples, np.full(samples, 1.0 / samples), size=resamples).astype(float)
        boot = np.max(np.stack([safe_ratio(counts @ n, counts @ d) for n, d in parts]), axis=0)
        tail = (1.0 - level) / 2.0
        low, high = (float(q) for q in np.quantile(boot, [tail, 1.0 - tail]))
        low, high = min(low, score), max(high, score)
    else:
        low = high = score
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    extra = (z * seed_sd) ** 2 + (z * set_sampling_se) ** 2
    lower = max(0.0, score - float(np.sqrt((score - low) ** 2 + extra)))
    upper = score + float(np.sqrt((high - score) ** 2 + extra))
    return Interval(score, lower, upper, level, (low, high), seed_sd, set_sampling_se, samples)
