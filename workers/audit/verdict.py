"""From criterion intervals to one of four verdicts (docs/science.md, section 6).

- reliable: every criterion's upper bound is within its tolerance;
- unreliable: some criterion's lower bound exceeds its tolerance (named, with the worst evidence);
- inconclusive: neither; or the game's checks failed; or the unaudited mass is too large; or the
  game has no effect at all to allocate (every criterion would hold vacuously); or the method's
  noise floor hides too much of the effect mass. The reason says what to raise or change.
- not_applicable is decided before any of this (the method cannot run on the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from workers.audit.confidence import Interval
from workers.audit.unaudited import Unaudited
from xaudit.contract.criteria import CRITERIA
from xaudit.contract.names import VERDICTS as CONTRACT_VERDICTS

__all__ = ["VERDICTS", "Judged", "MethodLevers", "VerdictName", "judge"]

VerdictName = Literal["reliable", "unreliable", "inconclusive", "not_applicable"]
VERDICTS: tuple[VerdictName, ...] = ("reliable", "unreliable", "inconclusive", "not_applicable")
assert VERDICTS == CONTRACT_VERDICTS  # the contract names them for every role


@dataclass(frozen=True)
class MethodLevers:
    """What a user can raise to narrow a method's intervals or lower its noise floor."""

    resolution: str | None  # parameter name, e.g. "steps"
    stochastic: bool


@dataclass(frozen=True)
class Judged:
    verdict: VerdictName
    reason: str
    failing: tuple[str, ...]  # criteria whose lower bound exceeds the tolerance
    undecided: tuple[str, ...]  # criteria whose interval straddles the tolerance


def _advice(levers: MethodLevers, samples: int, method: str) -> str:
    raise_ = [f"samples (now {samples})"]
    if levers.resolution:
        raise_.append(f"{method}.{levers.resolution}")
    if levers.stochastic:
        raise_.append("repeats under other seeds")
    return "raise " + " or ".join(raise_)


def _bounds(name: str, iv: Interval, tolerance: float) -> str:
    return (
        f"{name} {iv.score:.3f} [{iv.lower:.3f}, {iv.upper:.3f}] at {iv.level:.0%} "
        f"vs tolerance {tolerance:.3f}"
    )


def judge(
    method: str,
    intervals: Mapping[str, Interval],
    tolerances: Mapping[str, float],
    levers: MethodLevers,
    hidden_share: float,
    max_hidden_share: float,
    unaudited: Unaudited,
    failed_checks: Sequence[str] = (),
    evidence: str = "",
    *,
    effect_mass: float,
) -> Judged:
    """The verdict on one method; ``evidence`` names the worst set (shown with a failure);
    ``effect_mass``: the audited effect mass of the game the method is judged on, summed over
    samples (0: the model gives the reference's output on every sub-input)."""
    samples = next(iter(intervals.values())).samples if intervals else 0
    failing = tuple(c for c in CRITERIA if intervals[c].lower > tolerances[c])
    undecided = tuple(c for c in CRITERIA if c not in failing and intervals[c].upper > tolerances[c])
    if failed_checks:
        return Judged(
            "inconclusive",
            "the game fails its checks (" + "; ".join(failed_checks) + "): the effects themselves "
            "are in doubt",
            failing,
            undecided,
        )
    if unaudited.too_large:
        return Judged(
            "inconclusive",
            f"{unaudited.share:.0%} of the effect mass lies above audit order {unaudited.audit_order} "
            f"(limit {unaudited.limit:.0%}): raise the audit order or use coarser players",
            failing,
            undecided,
        )
    if effect_mass <= 0:
        return Judged(
            "inconclusive",
            "no effect to allocate: the model gives the reference's output on every sub-input "
            "(effect mass 0), so every criterion would hold vacuously; use inputs and a reference "
            "(--baseline, or --background for distribution methods) that the model tells apart",
            failing,
            undecided,
        )
    if failing:
        text = "; ".join(f"fails {_bounds(c, intervals[c], tolerances[c])}" for c in failing)
        return Judged("unreliable", text + (f"; worst: {evidence}" if evidence else ""), failing, undecided)
    if hidden_share > max_hidden_share:
        lever = (
            f"raise {method}.{levers.resolution}" if levers.resolution else _advice(levers, samples, method)
        )
        return Judged(
            "inconclusive",
            f"its noise floor hides {hidden_share:.0%} of the effect mass (more than "
            f"{max_hidden_share:.0%}): too noisy to judge; {lever}",
            failing,
            undecided,
        )
    if undecided:
        text = "; ".join(_bounds(c, intervals[c], tolerances[c]) for c in undecided)
        return Judged(
            "inconclusive",
            f"cannot tell at this confidence: {text}; {_advice(levers, samples, method)}",
            failing,
            undecided,
        )
    level = next(iter(intervals.values())).level if intervals else 0.95
    return Judged(
        "reliable",
        f"every criterion's upper bound is within its tolerance at {level:.0%} confidence",
        failing,
        undecided,
    )
