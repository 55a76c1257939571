"""Four verdicts from criterion intervals (docs/science.md, section 6): closed cases."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from workers.audit.confidence import interval
from workers.audit.unaudited import Unaudited
from workers.audit.verdict import MethodLevers, judge
from xaudit.contract.criteria import CRITERIA, DEFAULT_TOLERANCES

LEVERS = MethodLevers("steps", stochastic=False)
NONE_UNAUDITED = Unaudited(3, np.ones(4), np.zeros(4), None)


def _intervals(**shares: np.ndarray) -> dict:  # type: ignore[type-arg]
    out = {}
    for c in CRITERIA:
        num = shares.get(c, np.zeros(4))
        out[c] = interval(((num, np.ones(len(num))),), 0.95, seed=1)
    return out


def test_identical_samples_give_a_point_interval() -> None:
    iv = interval(((np.full(5, 0.2), np.ones(5)),), 0.95)
    assert iv.lower == pytest.approx(0.2) and iv.upper == pytest.approx(0.2)


def test_bootstrap_interval_covers_the_spread_of_samples() -> None:
    num = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    iv = interval(((num, np.ones(8)),), 0.95, seed=3)
    assert iv.score == pytest.approx(0.35)
    # Standard error of a mean of 8 values with sd 0.245: ~0.087; a 95% interval is about +-0.17.
    assert 0.12 < iv.score - iv.lower < 0.22 and 0.12 < iv.upper - iv.score < 0.22
    assert iv.samples == 8


def test_seed_spread_and_set_sampling_widen_in_quadrature() -> None:
    iv = interval(((np.full(3, 0.1), np.ones(3)),), 0.9, seed_sd=0.01, set_sampling_se=0.02)
    z = NormalDist().inv_cdf(0.95)
    half = z * np.hypot(0.01, 0.02)
    assert iv.upper == pytest.approx(0.1 + half) and iv.lower == pytest.approx(0.1 - half)


def test_reliable_needs_every_upper_bound_within_tolerance() -> None:
    judged = judge(
        "m",
        _intervals(coverage=np.full(4, 0.01)),
        DEFAULT_TOLERANCES,
        LEVERS,
        0.0,
        0.5,
        NONE_UNAUDITED,
        effect_mass=1.0,
    )
    assert judged.verdict == "reliable" and not judged.failing and not judged.undecided


def test_unreliable_names_the_criterion_and_its_evidence() -> None:
    judged = judge(
        "m", _intervals(complete_allocation=np.full(4, 0.5)), DEFAULT_TOLERANCES, LEVERS, 0.0, 0.5,
        NONE_UNAUDITED, evidence="set {a, b}", effect_mass=1.0,
    )  # fmt: skip
    assert judged.verdict == "unreliable" and judged.failing == ("complete_allocation",)
    assert "complete_allocation" in judged.reason and "set {a, b}" in judged.reason


def test_an_interval_across_the_tolerance_is_inconclusive_and_says_what_to_raise() -> None:
    judged = judge(
        "integrated_gradients", _intervals(coverage=np.array([0.0, 0.02, 0.08, 0.1])),
        DEFAULT_TOLERANCES, LEVERS, 0.0, 0.5, NONE_UNAUDITED, effect_mass=1.0,
    )  # fmt: skip
    assert judged.verdict == "inconclusive" and judged.undecided == ("coverage",)
    assert "samples (now 4)" in judged.reason and "integrated_gradients.steps" in judged.reason


def test_noise_hiding_the_effects_is_inconclusive_not_unreliable() -> None:
    judged = judge("m", _intervals(), DEFAULT_TOLERANCES, LEVERS, 0.55, 0.5, NONE_UNAUDITED, effect_mass=1.0)
    assert judged.verdict == "inconclusive" and "55%" in judged.reason and "m.steps" in judged.reason


def test_large_unaudited_mass_and_failed_game_checks_are_inconclusive() -> None:
    large = Unaudited(2, np.ones(4), np.full(4, 2.0), None)
    judged = judge("m", _intervals(), DEFAULT_TOLERANCES, LEVERS, 0.0, 0.5, large, effect_mass=1.0)
    assert judged.verdict == "inconclusive" and "audit order" in judged.reason
    judged = judge(
        "m",
        _intervals(),
        DEFAULT_TOLERANCES,
        LEVERS,
        0.0,
        0.5,
        NONE_UNAUDITED,
        ["v(N) differs"],
        effect_mass=1.0,
    )
    assert judged.verdict == "inconclusive" and "v(N) differs" in judged.reason


def test_a_game_without_effects_is_inconclusive_not_vacuously_reliable() -> None:
    """A distribution method whose background equals the input plays a constant game: every share
    is 0 of 0, which would read as reliable."""
    judged = judge("m", _intervals(), DEFAULT_TOLERANCES, LEVERS, 0.0, 0.5, NONE_UNAUDITED, effect_mass=0.0)
    assert judged.verdict == "inconclusive" and "no effect to allocate" in judged.reason
