"""Data-set audits: hundreds of samples in batches, memory bounded by the batch.

Every batch is audited with the same sets (one plan for the data set) and keeps only what pools
(workers.audit.pooling): per sample, each criterion's numerator and denominator; per set, sums over
the batch. Memory therefore grows with the batch, not with the number of samples, apart from a few
numbers per sample (the per-sample breakdown) and the attribution maps of the inputs, which are the
job's output. Verdicts are over the whole data set; the report lists each sample's scores and the
worst samples with their worst sets as evidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from workers.audit.plan import audit_plan
from workers.audit.pooling import merge
from workers.audit.report import canonical_bytes, jsonable
from workers.audit.runner import MAX_HIDDEN_SHARE, AuditResult, run_audit
from workers.audit.scores import AllocationScores
from workers.prepare import Prepared
from xaudit.contract.spec import CRITERIA, tensor_digest

__all__ = ["DATASET_BATCH", "WORST_SAMPLES", "audit"]

# Samples audited together; larger data sets are streamed in batches of this many.
DATASET_BATCH = 32
# Samples shown as evidence in a data-set report.
WORST_SAMPLES = 5

Progress = Callable[[float, str], None]


def _batch(prep: Prepared, start: int, stop: int) -> Prepared:
    return dataclasses.replace(
        prep,
        inputs=prep.inputs[start:stop],
        baselines=prep.baselines[start:stop],
        classes=prep.classes[start:stop],
        full_outputs=prep.full_outputs[start:stop],
    )


def audit(prep: Prepared, progress: Progress | None = None, batch: int = DATASET_BATCH) -> AuditResult:
    """The audit of ``prep``: in one go up to ``batch`` samples, streamed in batches above.

    Models whose held inputs differ per sample are audited in one go (their sample index is global).
    """
    samples = len(prep.inputs)
    if samples <= batch or prep.model.per_sample:
        return run_audit(prep, progress)
    report_progress = progress or (lambda fraction, message: None)
    plan = audit_plan(prep)  # one set of audited sets for every batch, sized for the whole data set
    starts = list(range(0, samples, batch))
    reports: list[dict[str, Any]] = []
    scores: dict[str, list[AllocationScores]] = {}
    maps: dict[str, list[np.ndarray]] = {}
    not_applicable: dict[str, str] = {}
    for k, start in enumerate(starts):
        stop = min(samples, start + batch)

        def scaled(
            fraction: float, message: str, k: int = k, first: int = start, last: int = stop - 1
        ) -> None:
            report_progress((k + fraction) / len(starts), f"samples {first}-{last}: {message}")

        result = run_audit(_batch(prep, start, stop), scaled, plan)
        reports.append(_offset(result.report, start))
        for name, part in result.scores.items():
            scores.setdefault(name, []).append(part)
        for name, array in result.attributions.items():
            maps.setdefault(name, []).append(array)
        not_applicable.update(result.not_applicable)
    report = _merged_report(prep, reports, {m: merge(parts) for m, parts in scores.items()}, batch)
    report = jsonable(report)
    attributions = {m: np.concatenate(parts) for m, parts in maps.items() if len(parts) == len(starts)}
    return AuditResult(report, canonical_bytes(report), attributions, not_applicable)


def _offset(report: dict[str, Any], start: int) -> dict[str, Any]:
    """Sample indices of a batch's evidence made global."""
    for entry in report["methods"]:
        for item in entry.get("evidence", []):
            item["sample"] = int(item["sample"]) + start
    return report


def _criteria(
    merged: AllocationScores, tolerances: dict[str, float], spreads: dict[str, float]
) -> dict[str, Any]:
    out = {}
    for name in CRITERIA:
        per_sample = merged.per_sample(name)
        score, tolerance = merged.pooled(name), float(tolerances[name])
        out[name] = {
            "score": score,
            "tolerance": tolerance,
            "passed": bool(score <= tolerance),
            "mean": float(per_sample.mean()),
            "worst": float(per_sample.max()),
            "fraction_failing": float((per_sample > tolerance).mean()),
            "spread": spreads.get(name, 0.0),
            "sampling_se": merged.sampling_se(name),
        }
    return out


def _method_entry(
    entries: list[dict[str, Any]], merged: AllocationScores | None, tolerances: dict[str, float]
) -> dict[str, Any]:
    entry = dict(entries[-1])
    entry["seconds"] = sum(float(e.get("seconds", 0.0)) for e in entries)
    if merged is None or "criteria" not in entry:
        return entry
    spreads = {c: float(np.mean([e["criteria"][c].get("spread") or 0.0 for e in entries])) for c in CRITERIA}
    criteria = _criteria(merged, tolerances, spreads)
    failing = [c for c in CRITERIA if not criteria[c]["passed"]]
    reasons = [f"fails {c} ({criteria[c]['score']:.3f} > {criteria[c]['tolerance']:.3f})" for c in failing]
    if merged.excluded_share > MAX_HIDDEN_SHARE:
        reasons.append(
            f"its noise floor hides {merged.excluded_share:.0%} of the effect mass (more than "
            f"{MAX_HIDDEN_SHARE:.0%}): its allocation cannot be shown; raise its steps or samples"
        )
    per_sample = {c: merged.per_sample(c) for c in CRITERIA}
    excess_over = np.max([per_sample[c] - tolerances[c] for c in CRITERIA], axis=0)
    worst = np.argsort(-excess_over, kind="stable")[:WORST_SAMPLES]
    evidence = sorted(
        (item for e in entries for item in e.get("evidence", [])),
        key=lambda item: -abs(float(item["effect"])) * abs(float(item["ratio"]) - 1.0),
    )
    entry.update(
        verdict="unreliable" if reasons else "reliable",
        reason="; ".join(reasons)
        if reasons
        else "all three criteria hold within tolerance over the data set",
        failing_criteria=failing,
        criteria=criteria,
        completeness_residual=merged.completeness_residual,
        out_of_set_share=merged.out_of_set_share,
        absent_unit_share=merged.absent_share,
        by_order=merged.by_order,
        evidence=evidence[:WORST_SAMPLES],
        per_sample={c: per_sample[c] for c in CRITERIA},
        worst_samples=[
            {
                "sample": int(s),
                "scores": {c: float(per_sample[c][s]) for c in CRITERIA},
                "evidence": [item for item in evidence if item["sample"] == int(s)],
            }
            for s in worst
        ],
    )
    entry["noise_floor"] = dict(entry["noise_floor"], excluded_mass_share=merged.excluded_share)
    return entry


def _merged_report(
    prep: Prepared, reports: list[dict[str, Any]], merged: dict[str, AllocationScores], batch: int
) -> dict[str, Any]:
    report = dict(reports[-1])
    tolerances = dict(prep.spec.tolerances)
    names = [e["name"] for e in report["methods"]]
    report["methods"] = [
        _method_entry([r["methods"][k] for r in reports], merged.get(name), tolerances)
        for k, name in enumerate(names)
    ]
    report["inputs"] = dict(
        report["inputs"],
        sha256=tensor_digest(prep.inputs),
        shape=list(prep.inputs.shape),
        count=len(prep.inputs),
    )
    game = dict(report["game"])
    for key in ("target_values", "reference_values"):
        game[key] = np.concatenate([np.asarray(r["game"][key]) for r in reports])
    game.pop("top_interactions", None)  # per batch; the worst samples' evidence stands in
    report["game"] = game
    report["dataset"] = {
        "samples": len(prep.inputs),
        "batch": batch,
        "batches": len(reports),
        "memory": "bounded by one batch; per sample only its scores and its attribution map are kept",
    }
    verdicts = ("reliable", "unreliable", "not_applicable")
    report["summary"] = {v: [e["name"] for e in report["methods"] if e["verdict"] == v] for v in verdicts}
    report["seconds"] = sum(float(r["seconds"]) for r in reports)
    return report
