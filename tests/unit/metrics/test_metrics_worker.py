"""Worker metrics: the compute core's call sites move them; devices and ORT providers are reported."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from tests.models import MLP_FEATURES, relu_mlp, to_onnx, to_torchscript
from workers import metrics as wm
from workers.jobs import run_job
from xaudit.contract.spec import JobSpec


def value(m: wm.WorkerMetrics, series: str, **labels: str) -> float:
    got = m.registry.get_sample_value(series, labels)
    return 0.0 if got is None else got


def test_helpers_are_no_ops_until_activated() -> None:
    previous = wm.activate(None)
    try:
        wm.count_forward(10)
        wm.observe_method("saliency", 1.0)
        metrics = wm.WorkerMetrics(CollectorRegistry())
        wm.count_forward(10)  # still inactive: nothing recorded anywhere
        assert value(metrics, "xaudit_model_forward_samples_total") == 0
        wm.activate(metrics)
        wm.count_forward(10, batches=2)
        assert value(metrics, "xaudit_model_forward_samples_total") == 10
        assert value(metrics, "xaudit_model_forward_passes_total") == 2
    finally:
        wm.activate(previous)


def test_verdicts_clamped(worker_metrics: wm.WorkerMetrics) -> None:
    wm.record_verdict("saliency", "unreliable")
    wm.record_verdict("saliency", "unreliable")
    wm.record_verdict("saliency", "something-new")
    assert value(worker_metrics, "xaudit_audit_verdicts_total", method="saliency", outcome="unreliable") == 2
    assert value(worker_metrics, "xaudit_audit_verdicts_total", method="saliency", outcome="other") == 1


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_real_attribution_job_moves_compute_forward_and_backward(
    worker_metrics: wm.WorkerMetrics, fmt: str
) -> None:
    example = torch.randn(2, MLP_FEATURES)
    module = relu_mlp()
    data = to_onnx(module, example) if fmt == "onnx" else to_torchscript(module, example)
    spec = JobSpec(kind="attribution", methods=("gradient_x_input", "occlusion_1"), device="cpu")
    inputs = np.random.default_rng(0).standard_normal((2, MLP_FEATURES)).astype(np.float32)
    result = run_job(spec, data, fmt, {"inputs": inputs})
    assert set(result.attributions) == {"gradient_x_input", "occlusion_1"}
    m = worker_metrics
    for method in ("gradient_x_input", "occlusion_1"):
        assert value(m, "xaudit_method_compute_seconds_count", method=method) == 1
        assert value(m, "xaudit_method_compute_seconds_sum", method=method) > 0
    # occlusion_1 evaluates each input with each of the 6 features removed, plus the full input.
    assert value(m, "xaudit_model_forward_samples_total") >= 2 * (MLP_FEATURES + 1)
    assert value(m, "xaudit_model_forward_passes_total") >= 1
    assert value(m, "xaudit_model_backward_passes_total") >= 1
    assert value(m, "xaudit_model_backward_samples_total") == 2
    if fmt == "onnx":
        labels = {"requested": "cpu", "provider": "CPUExecutionProvider"}
        assert value(m, "xaudit_onnxruntime_sessions_total", **labels) == 1


def test_report_device_cpu(worker_metrics: wm.WorkerMetrics, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="workers.metrics"):
        info = wm.report_device(torch.device("cpu"))
    assert info == wm.DeviceInfo("cpu", "cpu", None, None)
    assert value(worker_metrics, "xaudit_worker_device_info", device="cpu", name="cpu") == 1
    assert "worker computes on the CPU" in caplog.text


def test_report_device_cuda_mocked(
    worker_metrics: wm.WorkerMetrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # No GPU here: fake what torch says about one. The real thing is checked on a GPU machine.
    props = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with caplog.at_level(logging.INFO, logger="workers.metrics"):
        info = wm.report_device(torch.device("cuda"))
    assert info == wm.DeviceInfo("cuda", "NVIDIA H200", 0, 141 * 2**30)
    assert value(worker_metrics, "xaudit_worker_device_info", device="cuda", name="NVIDIA H200") == 1
    assert "worker computes on cuda:0 (NVIDIA H200, 141.0 GiB)" in caplog.text


def test_auto_device_without_cuda_is_a_logged_cpu_fallback(
    worker_metrics: wm.WorkerMetrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.models.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="workers.models.devices"):
        assert resolve_device("auto") == torch.device("cpu")
    assert "no CUDA device available" in caplog.text
    assert value(worker_metrics, "xaudit_cpu_fallbacks_total", component="torch") == 1


def test_onnx_session_that_did_not_get_cuda_is_logged_and_counted(
    worker_metrics: wm.WorkerMetrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA requested, ORT silently on the CPU (the CPU wheel, or a broken CUDA install)."""
    import onnxruntime as ort

    from workers.models import onnx_model

    asked: list[list[Any]] = []
    real = ort.InferenceSession

    def fake_session(data: bytes, sess_options: Any = None, providers: list[Any] | None = None) -> Any:
        asked.append(list(providers or []))
        return real(data, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(onnx_model.ort, "InferenceSession", fake_session)
    data = to_onnx(relu_mlp(), torch.randn(1, MLP_FEATURES))
    with caplog.at_level(logging.WARNING, logger="workers.models.onnx_model"):
        onnx_model._session(data, torch.device("cuda"))
    assert asked == [
        [
            ("CUDAExecutionProvider", {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}),
            "CPUExecutionProvider",
        ]
    ]
    assert "CUDA requested but onnxruntime runs on" in caplog.text
    # This environment's onnxruntime is the CPU build (test_metrics_gpu_wheel.py runs the CUDA one).
    assert "has no CUDA provider" in caplog.text and "install xaudit[gpu] (onnxruntime-gpu)" in caplog.text
    m = worker_metrics
    on_cpu = {"requested": "cuda", "provider": "CPUExecutionProvider"}
    assert value(m, "xaudit_onnxruntime_sessions_total", **on_cpu) == 1
    assert value(m, "xaudit_cpu_fallbacks_total", component="onnxruntime") == 1


def test_onnx_session_that_got_cuda_is_not_a_fallback(
    worker_metrics: wm.WorkerMetrics,
) -> None:
    wm.record_onnx_session("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    m = worker_metrics
    on_gpu = {"requested": "cuda", "provider": "CUDAExecutionProvider"}
    assert value(m, "xaudit_onnxruntime_sessions_total", **on_gpu) == 1
    assert value(m, "xaudit_cpu_fallbacks_total", component="onnxruntime") == 0
