"""Per-tenant quotas and TorchScript refusal against a real `xaudit serve --tokens`; mTLS identities on
a server in this process (create_server on a loopback port) over real TLS channels."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from clients._embedded import free_port
from service.config import ServerConfig
from service.server import create_server
from service.tokens import create_token
from tests.integration.conftest import Service, start_serve, stop_process
from tests.integration.security._certs import write_certs
from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request
from tests.models import MLP_FEATURES, relu_mlp, to_torchscript
from xaudit.contract.channel import BearerInterceptor
from xaudit.v1 import audit_pb2, audit_pb2_grpc

pytestmark = pytest.mark.integration


def _api(address: str, token: str) -> audit_pb2_grpc.AuditServiceStub:
    channel = grpc.intercept_channel(grpc.insecure_channel(address), BearerInterceptor(token))
    return audit_pb2_grpc.AuditServiceStub(channel)


@pytest.fixture
def quota_server(tmp_path: Path) -> Iterator[tuple[Service, dict[str, str]]]:
    """`xaudit serve --tokens` whose broker never answers (a closed loopback port): jobs stay QUEUED,
    which is what an active-jobs quota counts."""
    tokens = tmp_path / "tokens.yaml"
    issued = {t: create_token(tokens, t, "submit,read") for t in ("small", "roomy")}
    data = yaml.safe_load(tokens.read_text())
    data["defaults"] = {"max_active_jobs": 100}
    data["tenants"] = {"small": {"max_active_jobs": 2, "max_stored_bytes": 40_000, "torchscript": False}}
    tokens.write_text(yaml.safe_dump(data))
    closed = f"redis://127.0.0.1:{free_port()}/0"
    service = start_serve(tmp_path / "home", "--tokens", str(tokens), "--broker", closed)
    try:
        yield service, issued
    finally:
        stop_process(service.proc, signal.SIGKILL)


def _code(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_active_job_and_storage_quotas_and_torchscript_refusal(quota_server) -> None:  # type: ignore[no-untyped-def]
    srv, issued = quota_server
    small, roomy = _api(srv.address, issued["small"]), _api(srv.address, issued["roomy"])
    sha = small.UploadModel(chunks(mlp_onnx()), timeout=60).sha256
    jobs = [
        small.SubmitAudit(request(sha, inputs(seed=i), {"gradient_x_input": {}}), timeout=30)
        for i in range(2)
    ]
    err = _code(lambda: small.SubmitAudit(request(sha, inputs(seed=9), {"gradient_x_input": {}}), timeout=30))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "quota is 2" in err.details()
    again = small.SubmitAudit(request(sha, inputs(seed=1), {"gradient_x_input": {}}), timeout=30)
    assert again.id == jobs[1].id  # a resubmission at the limit returns the existing job
    # Another tenant is not held back by it.
    roomy_sha = roomy.UploadModel(chunks(mlp_onnx()), timeout=60).sha256
    for i in range(3):
        roomy.SubmitAudit(request(roomy_sha, inputs(seed=i), {"gradient_x_input": {}}), timeout=30)
    # A cancelled job no longer counts.
    small.CancelJob(audit_pb2.CancelJobRequest(job_id=jobs[0].id), timeout=10)
    small.SubmitAudit(request(sha, inputs(seed=9), {"gradient_x_input": {}}), timeout=30)

    ts = to_torchscript(relu_mlp(0), torch.zeros(2, MLP_FEATURES))
    err = _code(lambda: small.UploadModel(chunks(ts, fmt=audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=60))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "TorchScript" in err.details()
    # Undeclared format: detected from the bytes, refused all the same.
    err = _code(lambda: small.UploadModel(chunks(ts, fmt=audit_pb2.MODEL_FORMAT_UNSPECIFIED), timeout=60))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert roomy.UploadModel(chunks(ts, fmt=audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=60).sha256

    bigger = to_big_onnx()  # about 150 kB: more than what is left of the 40 kB quota
    err = _code(lambda: small.UploadModel(chunks(bigger), timeout=60))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota of 40000 bytes" in err.details()


def to_big_onnx() -> bytes:
    from tests.models import to_onnx

    wide = torch.nn.Sequential(torch.nn.Linear(MLP_FEATURES, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 3))
    return to_onnx(wide, torch.zeros(2, MLP_FEATURES))


# -- mTLS ---------------------------------------------------------------------------------------


def test_mtls_client_certificate_names_the_tenant(tmp_path: Path) -> None:
    files = write_certs(tmp_path)
    config = ServerConfig(
        listen="127.0.0.1:0",
        home=tmp_path / "home",
        tls_cert_file=files["server.pem"],
        tls_key_file=files["server.key"],
        tls_client_ca_file=files["ca.pem"],
        sweep_seconds=60,
    )
    srv, port = create_server(config, sender=lambda job, queue: None)
    srv.start()
    try:
        ca = files["ca.pem"].read_bytes()
        with_cert = grpc.ssl_channel_credentials(
            ca, files["client.key"].read_bytes(), files["client.pem"].read_bytes()
        )
        api = audit_pb2_grpc.AuditServiceStub(grpc.secure_channel(f"127.0.0.1:{port}", with_cert))
        sha = api.UploadModel(chunks(mlp_onnx()), timeout=60).sha256
        job = api.SubmitAudit(request(sha, inputs(), {"gradient_x_input": {}}), timeout=30)
        assert srv.store.get_job("team-cert", job.id).tenant == "team-cert"
        # No client certificate: the TLS handshake itself is refused.
        bare = audit_pb2_grpc.AuditServiceStub(
            grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca))
        )
        assert _code(lambda: bare.ListJobs(audit_pb2.ListJobsRequest(), timeout=10)).code() == (
            grpc.StatusCode.UNAVAILABLE
        )
        # Plaintext to a TLS port gets nowhere either.
        plain = audit_pb2_grpc.AuditServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        assert _code(lambda: plain.ListJobs(audit_pb2.ListJobsRequest(), timeout=10)).code() == (
            grpc.StatusCode.UNAVAILABLE
        )
    finally:
        srv.stop(0)


def test_worker_over_mtls_with_a_worker_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `xaudit worker` does against an mTLS server: its certificate for the transport, its worker
    token for the identity (a certificate alone only carries the client scopes)."""
    from xaudit.contract.channel import open_worker_channel
    from xaudit.v1 import worker_pb2, worker_pb2_grpc

    files = write_certs(tmp_path)
    tokens = tmp_path / "tokens.yaml"
    worker_token = create_token(tokens, "workers", "worker")
    config = ServerConfig(
        listen="127.0.0.1:0",
        home=tmp_path / "home",
        tokens_file=tokens,
        tls_cert_file=files["server.pem"],
        tls_key_file=files["server.key"],
        tls_client_ca_file=files["ca.pem"],
        sweep_seconds=60,
    )
    srv, port = create_server(config, sender=lambda job, queue: None)
    srv.start()
    monkeypatch.setenv("XAUDIT_TLS_CA", str(files["ca.pem"]))
    monkeypatch.setenv("XAUDIT_TLS_CERT", str(files["client.pem"]))
    monkeypatch.setenv("XAUDIT_TLS_KEY", str(files["client.key"]))
    fetch = worker_pb2.FetchJobRequest(job_id="nope", worker_id="w")
    try:
        with open_worker_channel(f"127.0.0.1:{port}", []) as channel:  # certificate only
            err = _code(lambda: worker_pb2_grpc.WorkerServiceStub(channel).FetchJob(fetch, timeout=10))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        monkeypatch.setenv("XAUDIT_WORKER_TOKEN", worker_token)
        with open_worker_channel(f"127.0.0.1:{port}", []) as channel:
            err = _code(lambda: worker_pb2_grpc.WorkerServiceStub(channel).FetchJob(fetch, timeout=10))
            assert err.code() == grpc.StatusCode.NOT_FOUND  # in, and told the job does not exist
    finally:
        srv.stop(0)


@pytest.mark.slow
def test_mtls_end_to_end_serve_local_worker_client_and_cli(tmp_path: Path) -> None:
    """`xaudit serve --tls-* --tls-client-ca`: the local worker (client certificate from $XAUDIT_TLS_*,
    the server's in-memory worker token) runs a job submitted by XauditClient over mTLS, and the CLI
    lists it with the same environment."""
    import os
    import re
    import subprocess
    import sys
    import time

    import numpy as np

    from clients.client import XauditClient
    from tests.integration.conftest import ROOT

    files = write_certs(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(
        os.environ,
        XAUDIT_HOME=str(home),
        XAUDIT_WORKER_CACHE=str(home / "cache"),
        XAUDIT_TLS_CA=str(files["ca.pem"]),
        XAUDIT_TLS_CERT=str(files["client.pem"]),
        XAUDIT_TLS_KEY=str(files["client.key"]),
    )
    log = home / "serve.log"
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clients.cli.main", "-v", "serve", "--listen", "127.0.0.1:0",
             "--tls-cert", str(files["server.pem"]), "--tls-key", str(files["server.key"]),
             "--tls-client-ca", str(files["ca.pem"])],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (found := re.search(r"xaudit: serving on (\S+)", log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        address = found.group(1)
        credentials = grpc.ssl_channel_credentials(
            files["ca.pem"].read_bytes(), files["client.key"].read_bytes(), files["client.pem"].read_bytes()
        )
        with XauditClient(address, credentials=credentials) as client:
            client.wait_until_ready(30)
            model = client.upload_model(mlp_onnx(seed=8), format="onnx", name="mlp")
            x = np.random.default_rng(8).normal(size=(2, MLP_FEATURES)).astype(np.float32)
            job = client.submit_attribution(model, inputs=x, players="features", methods="gradient_x_input")
            done = client.wait(job.id)
            assert done.state == "succeeded", (done, log.read_text()[-2000:])
        listed = subprocess.run(
            [sys.executable, "-m", "clients.cli.main", "jobs", "--server", address],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert listed.returncode == 0 and job.id in listed.stdout, listed.stderr
    finally:
        stop_process(proc, signal.SIGKILL)
