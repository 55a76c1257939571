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

from workers.audit.checks import check_failure
from workers.audit.document import to_json
from workers.audit.judgement import judge_method
from workers.audit.plan import audit_plan
from workers.audit.pooling import merge
from workers.audit.report import canonical_bytes, jsonable
from workers.audit.runner import MAX_HIDDEN_SHARE, AuditResult, run_audit
from workers.audit.scores import AllocationScores
from workers.audit.unaudited import Unaudited
from workers.audit.verdict import VERDICTS, MethodLevers
from workers.explain import job_params
from workers.methods import get_method
from workers.metrics import record_verdict
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
        return _counted(run_audit(prep, progress))
    report_progress = progress or (lambda fraction, message: None)
    # Parameters fixed per job (Deep Taylor's input bounds) from every sample, not per batch.
    bound = {name: job_params(prep, name) for name in prep.spec.methods}
    prep = dataclasses.replace(prep, spec=dataclasses.replace(prep.spec, method_params=bound))
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
    return _counted(AuditResult(report, canonical_bytes(report), attributions, not_applicable))


def _counted(result: AuditResult) -> AuditResult:
    """The job's verdicts, counted once per job (not once per batch) for the dashboards."""
    for entry in result.report["methods"]:
        record_verdict(str(entry["name"]), str(entry["verdict"]))
    return result


def _offset(report: dict[str, Any], start: int) -> dict[str, Any]:
    """Sample indices of a batch's evidence made global."""
    for entry in report["methods"]:
        for item in entry.get("evidence", []):
            item["sample"] = int(item["sample"]) + start
    return report


def _unaudited(sections: list[dict[str, Any]]) -> Unaudited:
    """One unaudited line over every batch: the per-sample arrays joined."""
    first = sections[0]
    absolute = (
        np.concatenate([np.asarray(u["absolute_mass"], dtype=float) for u in sections])
        if all("absolute_mass" in u for u in sections)
        else None
    )
    return Unaudited(
        int(first["audit_order"]),
        np.concatenate([np.asarray(u["audited_mass"], dtype=float) for u in sections]),
        np.concatenate([np.asarray(u["net_remainder"], dtype=float) for u in sections]),
        absolute,
        float(first["limit"]),
    )


def _failed_checks(reports: list[dict[str, Any]]) -> list[str]:
    out = []
    for k, r in enumerate(reports):
        for c in r["game"].get("checks", []):
            if not c["passed"]:
                out.append(f"batch {k}: {check_failure(c['name'], c['max_abs_error'])}")
    return out


def _method_entry(
    prep: Prepared,
    entries: list[dict[str, Any]],
    merged: AllocationScores | None,
    failed_checks: list[str],
) -> dict[str, Any]:
    entry = dict(entries[-1])
    entry["seconds"] = sum(float(e.get("seconds", 0.0)) for e in entries)
    if merged is None or "criteria" not in entry:
        return entry
    tolerances = dict(prep.spec.tolerances)
    method = get_method(str(entry["name"]))
    seed_sd = {c: float(np.mean([e["criteria"][c].get("spread") or 0.0 for e in entries])) for c in CRITERIA}
    unaudited = _unaudited([e["unaudited"] for e in entries])
    per_sample = {c: merged.per_sample(c) for c in CRITERIA}
    excess_over = np.max([per_sample[c] - tolerances[c] for c in CRITERIA], axis=0)
    worst = np.argsort(-excess_over, kind="stable")[:WORST_SAMPLES]
    evidence = sorted(
        (item for e in entries for item in e.get("evidence", [])),
        key=lambda item: -abs(float(item["effect"])) * abs(float(item["ratio"] or 0.0) - 1.0),
    )
    judgement = judge_method(
        method.name, merged, tolerances, MethodLevers(method.resolution, method.capabilities.stochastic),
        prep.spec.confidence, prep.spec.seed, seed_sd, {c: merged.sampling_se(c) for c in CRITERIA},
        MAX_HIDDEN_SHARE, unaudited, failed_checks, evidence,
    )  # fmt: skip
    entry.update(
        verdict=judgement.judged.verdict,
        reason=judgement.judged.reason + " (over the data set)",
        failing_criteria=judgement.judged.failing,
        undecided_criteria=judgement.judged.undecided,
        criteria=to_json(judgement.criteria),
        completeness_residual=merged.completeness_residual,
        out_of_set_share=merged.out_of_set_share,
        absent_unit_share=merged.absent_share,
        by_order=merged.by_order,
        unaudited=unaudited.section(),
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
    entry.pop("completeness", None)  # per batch; the residual share above is over the data set
    entry["noise_floor"] = dict(entry["noise_floor"], excluded_mass_share=merged.excluded_share)
    return entry


def _merged_report(
    prep: Prepared, reports: list[dict[str, Any]], merged: dict[str, AllocationScores], batch: int
) -> dict[str, Any]:
    report = dict(reports[-1])
    failed_checks = _failed_checks(reports)
    names = [e["name"] for e in report["methods"]]
    report["methods"] = [
        _method_entry(prep, [r["methods"][k] for r in reports], merged.get(name), failed_checks)
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
    game["top_interactions"] = []  # per batch; the worst samples' evidence stands in
    game["unaudited"] = _unaudited([r["game"]["unaudited"] for r in reports]).section()
    game["checks"] = [
        dict(
            checks[0],
            passed=all(c["passed"] for c in checks),
            max_abs_error=max(float(c["max_abs_error"]) for c in checks),
            **{k: np.concatenate([np.asarray(c[k]) for c in checks]) for k in ("game", "plain", "tolerance")},
        )
        for checks in zip(*(r["game"]["checks"] for r in reports), strict=True)
    ]
    report["game"] = game
    report["dataset"] = {
        "samples": len(prep.inputs),
        "batch": batch,
        "batches": len(reports),
        "memory": "bounded by one batch; per sample only its scores and its attribution map are kept",
    }
    report["summary"] = {v: [e["name"] for e in report["methods"] if e["verdict"] == v] for v in VERDICTS}
    report["seconds"] = sum(float(r["seconds"]) for r in reports)
    return report
