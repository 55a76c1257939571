"""Embedded mode (`xaudit serve` with no options: local worker, filesystem broker, SQLite), no Redis."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.conftest import Service, start_serve, stop_process
from tests.integration.service._helpers import inputs, mlp_onnx, request, stub, upload, wait_done
from workers.jobs import run_job
from xaudit.contract.spec import JobSpec, tensor_digest
from xaudit.contract.tensors import decode_tensor
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_attribution_end_to_end_matches_local_run(embedded_service: Service) -> None:
    api = stub(embedded_service.address)
    model = mlp_onnx()
    sha = upload(api, model)
    assert upload(api, model) == sha  # same bytes, same ref
    # Long enough (about a second of Integrated Gradients) for progress to be streamed between the
    # methods: the worker sends progress at most every 0.2 s, and a forked model process starts at once.
    x = inputs(batch=1024)
    methods = {"gradient_x_input": {}, "integrated_gradients": {"steps": "1024"}}
    job = api.SubmitAttribution(request(sha, x, methods), timeout=30)
    assert job.state == audit_pb2.JOB_STATE_QUEUED
    seen = list(api.WatchJob(audit_pb2.WatchJobRequest(job_id=job.id), timeout=120))
    states = [j.state for j in seen]
    assert states[-1] == audit_pb2.JOB_STATE_SUCCEEDED, seen[-1]
    assert audit_pb2.JOB_STATE_RUNNING in states
    assert any(0 < j.progress < 1 for j in seen), "no intermediate progress was streamed"
    assert seen[-1].compute_seconds > 0 and seen[-1].report_available
    result = api.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=job.id), timeout=30)
    got = {t.name: decode_tensor(t) for t in result.attributions}
    spec = JobSpec(
        kind="attribution",
        players="features",
        methods=tuple(methods),
        method_params={"integrated_gradients": {"steps": 1024}},
        device="cpu",
    )
    local = run_job(spec, model, "onnx", {"inputs": x})
    assert sorted(got) == sorted(local.attributions)
    for name, expected in local.attributions.items():
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(decode_tensor(result.target_classes), local.target_classes)
    # The same request again is the same job (idempotency key from model, tensors and config).
    again = api.SubmitAttribution(request(sha, x, methods), timeout=30)
    assert again.id == job.id
    listed = api.ListJobs(audit_pb2.ListJobsRequest(page_size=10), timeout=10)
    assert [j.id for j in listed.jobs] == [job.id]


def test_audit_end_to_end_returns_signed_report(embedded_service: Service) -> None:
    from clients.verify import check_inputs_subject, check_model_subject, verify_envelope

    api = stub(embedded_service.address)
    model = mlp_onnx(seed=1)
    sha = upload(api, model)
    x = inputs(seed=1)
    job = api.SubmitAudit(request(sha, x, {"shapley_value": {}, "occlusion_1": {}}), timeout=30)
    done = wait_done(api, job.id)
    assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    report = api.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=30)
    assert report.content_type == "application/vnd.dsse.envelope.v1+json"
    keys = api.GetSigningKeys(audit_pb2.GetSigningKeysRequest(), timeout=10).keys
    verified = verify_envelope(report.report, [k.public_key_pem for k in keys])
    check_model_subject(verified.statement, model)
    check_inputs_subject(verified.statement, tensor_digest(x))
    verdicts = json.dumps(verified.report)
    assert "shapley_value" in verdicts and "occlusion_1" in verdicts
    # An audit's report is stable: asking twice gives the exact same bytes.
    assert api.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=30).report == report.report


def test_restart_with_queued_jobs_completes_them_and_keeps_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    service = start_serve(home, "--lease-seconds", "3")
    try:
        api = stub(service.address)
        sha = upload(api, mlp_onnx())
        first = api.SubmitAttribution(request(sha, inputs(0), {"gradient_x_input": {}}), timeout=30)
        assert wait_done(api, first.id).state == audit_pb2.JOB_STATE_SUCCEEDED
        queued = [
            api.SubmitAttribution(
                request(sha, inputs(seed), {"integrated_gradients": {"steps": "64"}}), timeout=30
            ).id
            for seed in range(1, 5)
        ]
    finally:
        stop_process(service.proc)  # SIGTERM right after submitting: most jobs are still queued
    service = start_serve(home, "--lease-seconds", "3", log_name="serve-2.log")
    try:
        api = stub(service.address)
        for job_id in queued:
            done = wait_done(api, job_id)
            assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (job_id, done.message, done.error_message)
        kept = api.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=first.id), timeout=30)
        assert [t.name for t in kept.attributions] == ["gradient_x_input"]
    finally:
        stop_process(service.proc)
