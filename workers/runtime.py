"""What a worker does with one job id: claim it from the service, fetch its payload and model blob
(cached by digest, verified), run the compute core while heartbeating, and hand back the result.

Workers hold no database connection and share no disk with the service; everything goes over the
internal ``WorkerService``. Idempotent: a job that is terminal, or held by another worker's live
lease, is skipped; the service keeps exactly one result per job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np

from xaudit.contract.errors import Cancelled, XauditError
from xaudit.v1 import worker_pb2, worker_pb2_grpc

__all__ = ["BlobCache", "RuntimeConfig", "execute", "worker_id"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_FORMATS = {1: "onnx", 2: "torchscript"}


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class RuntimeConfig:
    server: str
    cache_dir: Path
    max_message_bytes: int = 256 * 1024 * 1024
    # How long to keep retrying the service while it is unreachable (e.g. restarting).
    retry_seconds: float = 120.0
    rpc_timeout_s: float = 30.0
    # Shortest gap between two heartbeats sent for progress alone.
    min_progress_gap_s: float = 0.2


def _retrying(call: Callable[[], T], what: str, config: RuntimeConfig) -> T:
    """Retry while the service is UNAVAILABLE (restarting, not yet listening), up to retry_seconds."""
    deadline = time.monotonic() + config.retry_seconds
    delay = 0.2
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            if time.monotonic() > deadline:
                raise
            logger.warning("%s: service unavailable (%s); retrying", what, code)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class BlobCache:
    """Model blobs by sha256 under ``root``, fetched from the service once and verified every time."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, sha256: str, stub: worker_pb2_grpc.WorkerServiceStub, config: RuntimeConfig) -> bytes:
        path = self.root / sha256[:2] / sha256
        if path.is_file():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == sha256:
                return data
            logger.warning("cached blob %s is corrupt: fetching it again", sha256)
            path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)

        def fetch() -> bytes:
            h = hashlib.sha256()
            parts = []
            for chunk in stub.FetchBlob(
                worker_pb2.FetchBlobRequest(sha256=sha256), timeout=config.rpc_timeout_s * 10
            ):
                h.update(chunk.data)
                parts.append(chunk.data)
            if h.hexdigest() != sha256:
                raise XauditError(f"blob {sha256} arrived with digest {h.hexdigest()}")
            return b"".join(parts)

        data = _retrying(fetch, "FetchBlob", config)
        # temp + rename: concurrent worker processes never read a partial file.
        fd, tmp = tempfile.mkstemp(prefix=".blob-", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        return data


class _Heartbeat:
    """Renews the lease every ``interval`` seconds and forwards progress; remembers a cancel request."""

    def __init__(
        self, stub: Any, job_id: str, wid: str, secret: str, interval: float, config: RuntimeConfig
    ) -> None:
        self._stub, self._job_id, self._wid, self._interval = stub, job_id, wid, interval
        self._secret = secret
        self._config = config
        self._state = (0.0, "started")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def progress(self, fraction: float, message: str) -> None:
        self._state = (fraction, message)
        self._wake.set()

    def should_stop(self) -> bool:
        return self.cancelled

    def _send(self) -> None:
        fraction, message = self._state
        request = worker_pb2.HeartbeatRequest(
            job_id=self._job_id,
            worker_id=self._wid,
            progress=fraction,
            message=message,
            lease_secret=self._secret,
        )
        try:
            reply = self._stub.Heartbeat(request, timeout=self._config.rpc_timeout_s)
        except grpc.RpcError as exc:
            # Keep computing: the service may be restarting. The lease decides.
            logger.warning(
                "heartbeat for job %s failed: %s", self._job_id, exc.code() if hasattr(exc, "code") else exc
            )
            return
        if reply.cancel and not self.cancelled:
            logger.info("job %s: cancelled by the service (or its lease was lost)", self._job_id)
            self.cancelled = True

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            if self._stop.is_set():
                return
            self._wake.clear()
            gap = time.monotonic() - last
            if gap < self._config.min_progress_gap_s:
                time.sleep(self._config.min_progress_gap_s - gap)
            self._send()
            last = time.monotonic()


def _decode(tensors: Any) -> dict[str, np.ndarray]:
    from xaudit.contract.tensors import decode_tensor

    return {t.name: decode_tensor(t, finite=False) for t in tensors}


def execute(job_id: str, config: RuntimeConfig) -> str:
    """Run job ``job_id`` end to end; returns what happened (``succeeded``, ``failed``, ``skipped``...)."""
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
    ]
    wid = worker_id()
    from xaudit.contract.channel import open_worker_channel  # its token and TLS, from the environment

    with open_worker_channel(config.server, options) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        try:
            payload = _retrying(
                lambda: stub.FetchJob(
                    worker_pb2.FetchJobRequest(job_id=job_id, worker_id=wid),
                    timeout=config.rpc_timeout_s,
                    wait_for_ready=True,
                ),
                "FetchJob",
                config,
            )
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise
            # An expired, revoked or too narrow worker token: no traceback per task. The job stays
            # queued in the service, which sends it again (requeue_after_seconds).
            logger.error(
                "job %s: the service refused this worker's credentials (%s: %s); set "
                "$XAUDIT_WORKER_TOKEN to a valid worker token. The job stays queued and is sent again.",
                job_id,
                exc.code().name,
                exc.details(),
            )
            return "refused"
        if not payload.claimed:
            logger.info("job %s: nothing to do (state %s)", job_id, payload.state)
            return "skipped"
        return _run_claimed(stub, payload, wid, config)


def _run_claimed(stub: Any, payload: Any, wid: str, config: RuntimeConfig) -> str:
    from workers.sandbox import run_sandboxed  # every model: an isolated, confined child process
    from xaudit.contract.spec import JobSpec
    from xaudit.contract.tensors import encode_tensor

    job_id = payload.job_id
    logger.info("job %s: attempt %d on %s", job_id, payload.attempt, wid)
    interval = payload.heartbeat_interval_seconds or 5.0
    code, message = "", ""
    secret = payload.lease_secret  # proves this worker's lease in every later call about the job
    with _Heartbeat(stub, job_id, wid, secret, interval, config) as beat:
        try:
            model = BlobCache(config.cache_dir).get(payload.model_sha256, stub, config)
            spec = JobSpec.from_json(payload.spec_json)
            started = time.perf_counter()
            result = run_sandboxed(
                spec,
                model,
                _FORMATS.get(payload.model_format),
                _decode(payload.tensors),
                beat.progress,
                beat.should_stop,
            )
            seconds = time.perf_counter() - started
        except Cancelled:
            code, message = "CANCELLED", "cancelled"
        except XauditError as exc:
            code, message = exc.code, str(exc)
        except Exception as exc:
            if type(exc).__name__ == "SoftTimeLimitExceeded":
                code, message = "DEADLINE_EXCEEDED", "the job ran past the worker's time limit"
            else:
                logger.exception("job %s: internal error", job_id)
                code, message = (
                    "INTERNAL",
                    f"internal error in the worker ({type(exc).__name__}); see the worker log",
                )
    if code:
        logger.info("job %s: %s: %s", job_id, code, message)
        request = worker_pb2.FailJobRequest(
            job_id=job_id, worker_id=wid, code=code, message=message, lease_secret=secret
        )
        _retrying(
            lambda: stub.FailJob(request, timeout=config.rpc_timeout_s, wait_for_ready=True),
            "FailJob",
            config,
        )
        return "cancelled" if code == "CANCELLED" else "failed"
    tensors = [
        encode_tensor(name, arr.astype(np.float32)) for name, arr in sorted(result.attributions.items())
    ]
    done = worker_pb2.CompleteJobRequest(
        job_id=job_id,
        worker_id=wid,
        report=result.report or b"",
        attributions=tensors,
        not_applicable=result.not_applicable,
        compute_seconds=seconds,
        lease_secret=secret,
    )
    if result.target_values is not None:
        done.target_values.CopyFrom(
            encode_tensor("target_values", np.asarray(result.target_values, np.float32))
        )
    if result.target_classes is not None:
        done.target_classes.CopyFrom(
            encode_tensor("target_classes", np.asarray(result.target_classes, np.int64))
        )
    try:
        reply = _retrying(
            lambda: stub.CompleteJob(done, timeout=config.rpc_timeout_s, wait_for_ready=True),
            "CompleteJob",
            config,
        )
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
            raise
        logger.warning("job %s: lease lost before the result was stored (%s)", job_id, exc.details())
        return "lost"
    logger.info(
        "job %s: done in %.2fs (%s)", job_id, seconds, "stored" if reply.accepted else "already finished"
    )
    return "succeeded"
