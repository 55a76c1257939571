"""The one entry point of the compute core: run a job, get its result.

Celery tasks and the local CLI both call :func:`run_job`; it knows nothing about the service.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from workers.denormals import flushing
from workers.prepare import prepare
from xaudit.contract.errors import Cancelled
from xaudit.contract.spec import JobSpec

__all__ = ["JobResult", "Progress", "run_job"]

Progress = Callable[[float, str], None]


@dataclass
class JobResult:
    kind: str
    # Canonical JSON bytes of the xaudit.report/v2 document (audit jobs; unsigned).
    report: bytes | None
    # Attribution maps of the inputs, method -> (B, *sample_shape) float32.
    attributions: dict[str, np.ndarray] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    target_values: np.ndarray | None = None
    target_classes: np.ndarray | None = None


def run_job(
    spec: JobSpec,
    model_bytes: bytes,
    model_format: str | None,
    tensors: Mapping[str, np.ndarray],
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> JobResult:
    """Validate, compute, and return the result. Raises errors of :mod:`xaudit.contract.errors` only on purpose;
    :class:`Cancelled` when ``should_stop`` turns true between steps."""

    def report_progress(fraction: float, message: str) -> None:
        if should_stop is not None and should_stop():
            raise Cancelled("the job was cancelled")
        if progress is not None:
            progress(fraction, message)

    with flushing():  # subnormal floats flushed while the job computes: workers/denormals.py
        return _compute(spec, model_bytes, model_format, tensors, report_progress)


def _compute(
    spec: JobSpec,
    model_bytes: bytes,
    model_format: str | None,
    tensors: Mapping[str, np.ndarray],
    report_progress: Progress,
) -> JobResult:
    report_progress(0.0, "loading the model")
    prep = prepare(spec, model_bytes, model_format, tensors)
    if spec.kind == "attribution":
        from workers.explain import explain

        result = explain(prep, spec.methods, report_progress)
        return JobResult(
            "attribution",
            None,
            result.attributions,
            result.not_applicable,
            prep.target_values,
            prep.classes,
        )
    from workers.audit import run_audit

    audit = run_audit(prep, report_progress)
    return JobResult(
        "audit",
        audit.report_bytes,
        audit.attributions,
        audit.not_applicable,
        prep.target_values,
        prep.classes,
    )
