"""The typed Python client of the xaudit service; callers see dataclasses, numpy arrays and XauditError.

    with XauditClient("127.0.0.1:50051") as client:
        model = client.upload_model("model.onnx")
        job = client.submit_audit(model, inputs=x, players="grid:2x4", methods="all")
        for update in client.watch(job.id):
            print(update.state, update.progress)
        report = client.get_report(job.id)

Importing this module loads grpc, protobuf and numpy only (no torch): CI gates import it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np

from clients._defaults import DEFAULT_SERVER
from clients._errors import translate_rpc_error
from clients._requests import guess_format, model_chunks, read_head, spec_with_options, submit_request
from clients._types import (
    TERMINAL_STATES,
    AttributionResult,
    Job,
    JobState,
    ModelFormat,
    ModelRef,
    SigningKey,
)
from xaudit.contract.errors import InvalidInput, Unavailable
from xaudit.contract.spec import JobSpec
from xaudit.v1 import audit_pb2, audit_pb2_grpc

__all__ = [
    "DEFAULT_SERVER",
    "TERMINAL_STATES",
    "AttributionResult",
    "Job",
    "JobState",
    "ModelFormat",
    "ModelRef",
    "SigningKey",
    "XauditClient",
    "default_server",
]

logger = logging.getLogger(__name__)

_MAX_RECEIVE_BYTES = 256 * 1024 * 1024  # reports and attribution maps; the server caps what it sends
_T = TypeVar("_T")


def default_server() -> str:
    """$XAUDIT_SERVER, else 127.0.0.1:50051."""
    return os.environ.get("XAUDIT_SERVER") or DEFAULT_SERVER


def _self_contained(path: Path) -> bytes:
    """An ONNX file with its side files (model.onnx.data) read in from its directory: the service
    reads no paths, so one self-contained model is sent."""
    data = path.read_bytes()
    try:
        from xaudit.contract.onnx_external import inline_external_data
    except ImportError:  # a thin install without the onnx package: the service explains what to do
        return data
    return inline_external_data(path, data)


class XauditClient:
    """A connection to one xaudit server. Thread-safe (one gRPC channel); close it or use ``with``.

    ``timeout`` bounds every unary call in seconds (None: no deadline); streaming calls (upload,
    watch) run as long as they need.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        timeout: float | None = 30.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address or default_server()
        self.timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES)]
        # credentials: TLS (and a client certificate for mTLS), e.g. grpc.ssl_channel_credentials(...).
        self._channel = (
            grpc.secure_channel(self.address, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(self.address, options=options)
        )
        self._stub = audit_pb2_grpc.AuditServiceStub(self._channel)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> XauditClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_until_ready(self, timeout: float = 10.0) -> None:
        """Block until the channel connects; Unavailable naming the address otherwise."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise Unavailable(
                f"cannot reach the xaudit server at {self.address} (no connection after {timeout:g} s)"
            ) from None

    def _call(self, fn: Callable[..., _T], request: Any, *, timeout: float | None = None, **kw: Any) -> _T:
        try:
            return fn(
                request,
                timeout=timeout if timeout is not None else self.timeout,
                metadata=self._metadata,
                **kw,
            )
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, self.address) from None

    # -- models ----------------------------------------------------------------------------------

    def upload_model(
        self, model: str | os.PathLike[str] | bytes, *, format: str | None = None, name: str | None = None
    ) -> ModelRef:
        """Stream a model file (or its bytes) to the service in 1 MiB chunks; returns its ModelRef.

        ``format`` (onnx | torchscript) defaults to a guess from the file name, then the bytes.
        """
        if isinstance(model, bytes):
            fmt = format or guess_format(model[:4], name or "")
            return self._upload(model, len(model), fmt, name or "")
        path = Path(model)
        try:
            size = path.stat().st_size
            fmt = format or guess_format(read_head(path), path.name)
            if fmt == "onnx":
                data = _self_contained(path)
                return self._upload(data, len(data), fmt, name or path.name)
            with path.open("rb") as fh:
                return self._upload(fh, size, fmt, name or path.name)
        except FileNotFoundError:
            raise InvalidInput(f"model file not found: {path}") from None
        except IsADirectoryError:
            raise InvalidInput(f"model path is a directory: {path}") from None

    def _upload(self, source: Any, size: int, fmt: str, name: str) -> ModelRef:
        chunks = model_chunks(source, size, fmt, name)
        # Upload time grows with size: no fixed deadline, the server's cap bounds it.
        ref = self._call(
            self._stub.UploadModel, chunks, timeout=None if self.timeout is None else max(self.timeout, 600.0)
        )
        return ModelRef.from_proto(ref)

    # -- jobs ------------------------------------------------------------------------------------

    def submit_audit(
        self,
        model: ModelRef | str,
        spec: JobSpec | None = None,
        tensors: Mapping[str, np.ndarray] | None = None,
        *,
        idempotency_key: str = "",
        **options: Any,
    ) -> Job:
        """Queue a criterion audit. ``options`` are JobSpec fields (players, methods, ...) or tensor
        names (inputs, background, baseline, player_mask, player_groups) and override ``spec``/``tensors``.
        Resubmitting the same request returns the existing job."""
        return self._submit(self._stub.SubmitAudit, "audit", model, spec, tensors, idempotency_key, options)

    def plan_audit(
        self,
        model: ModelRef | str,
        spec: JobSpec | None = None,
        tensors: Mapping[str, np.ndarray] | None = None,
        **options: Any,
    ) -> audit_pb2.AuditPlan:
        """What the audit would cost (sub-inputs, sets, passes per method), before submitting it."""
        full_spec, full_tensors = spec_with_options(spec, tensors, "audit", options)
        sha = model.sha256 if isinstance(model, ModelRef) else model
        plan: audit_pb2.AuditPlan = self._call(
            self._stub.PlanAudit, submit_request(sha, full_spec, full_tensors, "")
        )
        return plan

    def submit_attribution(
        self,
        model: ModelRef | str,
        spec: JobSpec | None = None,
        tensors: Mapping[str, np.ndarray] | None = None,
        *,
        idempotency_key: str = "",
        **options: Any,
    ) -> Job:
        """Queue an attribution job (maps from every requested method); options as for submit_audit."""
        return self._submit(
            self._stub.SubmitAttribution, "attribution", model, spec, tensors, idempotency_key, options
        )

    def _submit(
        self,
        fn: Callable[..., audit_pb2.Job],
        kind: str,
        model: ModelRef | str,
        spec: JobSpec | None,
        tensors: Mapping[str, np.ndarray] | None,
        idempotency_key: str,
        options: Mapping[str, Any],
    ) -> Job:
        full_spec, full_tensors = spec_with_options(spec, tensors, kind, options)
        sha = model.sha256 if isinstance(model, ModelRef) else model
        request = submit_request(sha, full_spec, full_tensors, idempotency_key)
        return Job.from_proto(self._call(fn, request))

    def get_job(self, job_id: str) -> Job:
        return Job.from_proto(self._call(self._stub.GetJob, audit_pb2.GetJobRequest(job_id=job_id)))

    def list_jobs(self, *, page_size: int = 50, limit: int | None = None) -> Iterator[Job]:
        """Every job, newest first, fetching pages as the iteration goes (``limit`` stops early)."""
        token = ""
        seen = 0
        while True:
            page = self._call(
                self._stub.ListJobs, audit_pb2.ListJobsRequest(page_size=page_size, page_token=token)
            )
            for msg in page.jobs:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield Job.from_proto(msg)
            token = page.next_page_token
            if not token:
                return

    def watch(self, job_id: str, *, reconnect_seconds: float = 30.0) -> Iterator[Job]:
        """Yield the job whenever it changes, ending with its terminal state.

        A stream broken by a server restart is resumed for up to ``reconnect_seconds``."""
        last: Job | None = None
        broken_since: float | None = None
        while True:
            try:
                stream = self._stub.WatchJob(
                    audit_pb2.WatchJobRequest(job_id=job_id), metadata=self._metadata
                )
                for msg in stream:
                    broken_since = None
                    job = Job.from_proto(msg)
                    if job != last:
                        yield job
                    last = job
                    if job.terminal:
                        stream.cancel()
                        return
            except grpc.RpcError as exc:
                error = translate_rpc_error(exc, self.address)
                # Only a dropped connection is worth waiting out; any other status is an answer.
                if not isinstance(error, Unavailable) or last is None:
                    raise error from None
                now = time.monotonic()
                broken_since = broken_since or now
                if now - broken_since > reconnect_seconds:
                    raise error from None
                logger.info("watch of job %s interrupted (%s); reconnecting", job_id, error)
                time.sleep(0.5)
                continue
            if last is not None and last.terminal:
                return
            # The stream ended without a terminal state (server shutting down): ask again.
            now = time.monotonic()
            broken_since = broken_since or now
            if now - broken_since > reconnect_seconds:
                raise Unavailable(f"lost the job stream from the xaudit server at {self.address}")
            time.sleep(0.5)

    def wait(self, job_id: str, progress: Callable[[Job], None] | None = None) -> Job:
        """Watch until the job is terminal and return it (whatever the terminal state)."""
        job: Job | None = None
        for job in self.watch(job_id):
            if progress is not None:
                progress(job)
        if job is None:  # pragma: no cover - watch yields at least the terminal state
            job = self.get_job(job_id)
        return job

    def cancel(self, job_id: str) -> Job:
        """Cancel a job; a job that already finished is returned unchanged."""
        return Job.from_proto(self._call(self._stub.CancelJob, audit_pb2.CancelJobRequest(job_id=job_id)))

    # -- results ---------------------------------------------------------------------------------

    def get_report(self, job_id: str) -> bytes:
        """The exact stored report bytes (a DSSE envelope when signed): verify them as they are."""
        report: audit_pb2.Report = self._call(self._stub.GetReport, audit_pb2.GetReportRequest(job_id=job_id))
        return bytes(report.report)

    def get_attribution_result(self, job_id: str) -> AttributionResult:
        msg = self._call(self._stub.GetAttributions, audit_pb2.GetAttributionsRequest(job_id=job_id))
        return AttributionResult.from_proto(msg)

    def get_attributions(self, job_id: str) -> dict[str, np.ndarray]:
        """Method name -> (batch, *sample_shape) float32 map, for the methods that ran."""
        return dict(self.get_attribution_result(job_id).attributions)

    def signing_keys(self) -> tuple[SigningKey, ...]:
        keys = self._call(self._stub.GetSigningKeys, audit_pb2.GetSigningKeysRequest())
        return tuple(SigningKey(k.key_id, k.public_key_pem) for k in keys.keys)
