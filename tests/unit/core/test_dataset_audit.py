"""Data-set audits in batches pool to the same scores as one audit of every sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workers.audit.dataset import audit
from workers.audit.runner import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import CRITERIA, JobSpec

ASSETS = Path(__file__).resolve().parents[3] / "workers" / "assets"
METHODS = ("gradient_x_input", "deeplift_rescale", "occlusion_1")


@pytest.mark.parametrize("players", ["grid:2x4", "grid:4x4"])
def test_batches_pool_to_the_one_go_scores(players: str) -> None:
    inputs = np.concatenate(
        [np.load(ASSETS / "digits_inputs.npy"), np.load(ASSETS / "digits_background.npy")]
    )[:7]
    spec = JobSpec(players=players, device="cpu", methods=METHODS)
    prep = prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", {"inputs": inputs})
    whole = run_audit(prep).report
    streamed = audit(prep, batch=3).report
    assert streamed["dataset"]["batches"] == 3 and streamed["inputs"]["count"] == 7
    for one, many in zip(whole["methods"], streamed["methods"], strict=True):
        assert one["verdict"] == many["verdict"], one["name"]
        for c in CRITERIA:
            assert many["criteria"][c]["score"] == pytest.approx(
                one["criteria"][c]["score"], rel=1e-9, abs=1e-12
            )
            assert len(many["per_sample"][c]) == 7
        assert [row["mass"] for row in many["by_order"]] == pytest.approx(
            [row["mass"] for row in one["by_order"]]
        )
        worst = many["worst_samples"]
        assert len(worst) == 5 and all(0 <= w["sample"] < 7 for w in worst)
        if many["verdict"] == "unreliable":
            assert many["evidence"] and any(w["evidence"] for w in worst)
    assert streamed["summary"] == whole["summary"]
    from workers.audit.schema import validate_report

    validate_report(streamed)


def test_a_streamed_audit_counts_each_verdict_once() -> None:
    """The dashboards' verdict counter moves once per job, not once per batch of samples."""
    from prometheus_client import CollectorRegistry

    from workers import metrics as wm

    inputs = np.load(ASSETS / "digits_inputs.npy")
    spec = JobSpec(players="grid:2x4", device="cpu", methods=("gradient_x_input",))
    prep = prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", {"inputs": inputs})
    metrics = wm.WorkerMetrics(CollectorRegistry())
    previous = wm.activate(metrics)
    try:
        report = audit(prep, batch=2).report  # 4 samples: two batches
    finally:
        wm.activate(previous)
    assert report["dataset"]["batches"] == 2
    verdict = report["methods"][0]["verdict"]
    counted = metrics.registry.get_sample_value(
        "xaudit_audit_verdicts_total", {"method": "gradient_x_input", "outcome": verdict}
    )
    assert counted == 1
