"""Raw-stub helpers: the server's contract is tested without the client library in between."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import numpy as np
import torch

from service.config import ServerConfig
from service.server import Server, create_server
from tests.models import MLP_FEATURES, relu_mlp, to_onnx
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2, audit_pb2_grpc

TERMINAL = (audit_pb2.JOB_STATE_SUCCEEDED, audit_pb2.JOB_STATE_FAILED, audit_pb2.JOB_STATE_CANCELLED)


@contextmanager
def serving(config: ServerConfig, **options: Any) -> Iterator[Server]:
    """An in-process server on ``config``, started, and stopped on the way out. ``options`` go to
    ``create_server``; without a ``sender`` no broker is needed (jobs are recorded, never sent)."""
    options.setdefault("sender", lambda job, queue: None)
    srv, _ = create_server(config, **options)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop(0)


def mlp_onnx(seed: int = 0) -> bytes:
    return to_onnx(relu_mlp(seed), torch.zeros(2, MLP_FEATURES))


def inputs(seed: int = 0, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, MLP_FEATURES)).astype(np.float32)


def chunks(
    data: bytes, fmt: int = audit_pb2.MODEL_FORMAT_ONNX, size: int = 64 * 1024
) -> Iterator[audit_pb2.ModelChunk]:
    meta = audit_pb2.ModelMetadata(format=fmt, declared_size=len(data), name="test-model")
    yield audit_pb2.ModelChunk(metadata=meta)
    for start in range(0, len(data), size):
        yield audit_pb2.ModelChunk(data=data[start : start + size])


def stub(address: str) -> audit_pb2_grpc.AuditServiceStub:
    channel = grpc.insecure_channel(
        address,
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    return audit_pb2_grpc.AuditServiceStub(channel)


def upload(api: audit_pb2_grpc.AuditServiceStub, data: bytes) -> str:
    ref: audit_pb2.ModelRef = api.UploadModel(chunks(data), timeout=60)
    return ref.sha256


def request(
    model_sha: str, x: np.ndarray, methods: dict[str, dict[str, str]], **fields: object
) -> audit_pb2.SubmitRequest:
    specs = [audit_pb2.MethodSpec(name=name, params=params) for name, params in methods.items()]
    base: dict[str, object] = {"players": "features", "device": "cpu"}
    base.update(fields)
    return audit_pb2.SubmitRequest(
        model_sha256=model_sha, inputs=[encode_tensor("inputs", x)], methods=specs, **base
    )


def wait_state(
    api: audit_pb2_grpc.AuditServiceStub, job_id: str, predicate, timeout: float = 120.0
) -> audit_pb2.Job:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        job = api.GetJob(audit_pb2.GetJobRequest(job_id=job_id), timeout=10)
        if predicate(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {audit_pb2.JobState.Name(job.state)}: {job.message}")
        time.sleep(0.1)


def wait_done(api: audit_pb2_grpc.AuditServiceStub, job_id: str, timeout: float = 120.0) -> audit_pb2.Job:
    return wait_state(api, job_id, lambda j: j.state in TERMINAL, timeout)
