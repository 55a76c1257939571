"""One method's criteria with confidence intervals, and its verdict (docs/science.md, section 6)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.audit.confidence import Interval, interval
from workers.audit.document import CriterionResult, CriterionStatus
from workers.audit.scores import AllocationScores
from workers.audit.unaudited import Unaudited
from workers.audit.verdict import Judged, MethodLevers, judge
from workers.methods import derived_seed
from xaudit.contract.criteria import REGISTRY

__all__ = ["Judgement", "completeness_check", "judge_method"]


@dataclass(frozen=True)
class Judgement:
    judged: Judged
    criteria: Mapping[str, CriterionResult]


def _status(iv: Interval, tolerance: float) -> CriterionStatus:
    if iv.lower > tolerance:
        return "fails"
    return "holds" if iv.upper <= tolerance else "undecided"


def _evidence_text(evidence: Sequence[Mapping[str, Any]]) -> str:
    if not evidence:
        return ""
    worst = evidence[0]
    ratio = worst.get("ratio")
    shown = "n/a" if ratio is None else f"{ratio:.2f}"
    return (
        f"set {{{', '.join(worst['set'])}}} of sample {worst['sample']}: effect {worst['effect']:.3g}, "
        f"handed out x{shown}"
    )


def judge_method(
    method: str,
    scores: AllocationScores,
    tolerances: Mapping[str, float],
    levers: MethodLevers,
    level: float,
    seed: int,
    seed_sd: Mapping[str, float],
    set_sampling_se: Mapping[str, float],
    max_hidden_share: float,
    unaudited: Unaudited,
    failed_checks: Sequence[str],
    evidence: Sequence[Mapping[str, Any]],
) -> Judgement:
    """Intervals for every registered criterion, then the verdict.

    ``set_sampling_se`` is the standard error of each criterion's score from sampled sets (empty
    when every set of the audited orders was enumerated).
    """
    intervals: dict[str, Interval] = {}
    results: dict[str, CriterionResult] = {}
    for c in REGISTRY:
        tolerance = float(tolerances[c.name])
        iv = interval(
            c.parts(scores),
            level,
            derived_seed(seed, "bootstrap", method, c.name),
            seed_sd.get(c.name, 0.0),
            set_sampling_se.get(c.name, 0.0),
        )
        per_sample = scores.per_sample(c.name)
        intervals[c.name] = iv
        results[c.name] = CriterionResult(
            score=iv.score,
            lower=iv.lower,
            upper=iv.upper,
            level=level,
            tolerance=tolerance,
            status=_status(iv, tolerance),
            passed=bool(iv.score <= tolerance),
            mean=float(per_sample.mean()),
            worst=float(per_sample.max()),
            fraction_failing=float((per_sample > tolerance).mean()),
            spread=seed_sd.get(c.name, 0.0),
            interval=iv.section(),
        )
    judged = judge(
        method, intervals, tolerances, levers, scores.excluded_share, max_hidden_share, unaudited,
        failed_checks, _evidence_text(evidence), effect_mass=scores.effect_mass,
    )  # fmt: skip
    return Judgement(judged, results)


def completeness_check(
    per_player: np.ndarray, values: np.ndarray, subsets: np.ndarray, names: Sequence[str]
) -> dict[str, Any]:
    """Per-sub-input completeness residuals d(T) = sum_i a_i(x_T) - (v(T) - v(empty)): a check
    that can fail (methods that are complete on every sub-input have d = 0 up to numerics)."""
    gains = values - values[:, :1]
    residual = per_player.sum(axis=2) - gains  # (B, m)
    mass = np.abs(gains).sum(axis=1)
    per_sample = np.where(mass > 0, np.abs(residual).sum(axis=1) / np.where(mass > 0, mass, 1.0), 0.0)
    sample, k = np.unravel_index(int(np.argmax(np.abs(residual))), residual.shape)
    members = [names[i] for i in range(len(names)) if (int(subsets[k]) >> i) & 1]
    return {
        "residual_share": float(np.abs(residual).sum() / mass.sum()) if mass.sum() > 0 else 0.0,
        "per_sample": per_sample,
        "max_abs_residual": float(np.abs(residual[sample, k])),
        "worst": {"sample": int(sample), "set": members, "residual": float(residual[sample, k])},
    }
