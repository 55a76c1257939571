"""Run an untrusted model's job in a child process with resource limits.

TorchScript runs code when it is loaded and when it is called, so the worker never loads it in its
own process: :func:`run_sandboxed` starts ``python -m workers.sandbox`` (a fresh interpreter, not a
fork of a threaded worker), which imports the compute core, then limits its own address space
(RLIMIT_AS: its size after the imports plus ``memory_bytes``) and CPU time (RLIMIT_CPU), and only
then loads the model and runs :func:`workers.jobs.run_job`. Progress and the result come back as
framed JSON and ``.npz`` data (read with ``allow_pickle=False``: nothing the child sends can run code
in the worker). The parent kills the child on cancellation, on the wall-clock limit, or when the
Celery task is stopped; a child that dies (out of memory, SIGXCPU, segfault, exit) fails its job with
a reason and the worker carries on.

Environment: XAUDIT_SANDBOX_FORMATS (``torchscript`` by default; ``all`` or ``none``),
XAUDIT_SANDBOX_MEMORY_MB (4096), XAUDIT_SANDBOX_CPU_SECONDS (3600), XAUDIT_SANDBOX_WALL_SECONDS (unset).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import IO, Any

import numpy as np

from workers.jobs import JobResult, Progress
from xaudit.contract.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidModel,
    ResourceExhausted,
    XauditError,
    error_for_code,
)
from xaudit.contract.spec import JobSpec

__all__ = ["SandboxLimits", "isolated_formats", "run_sandboxed"]

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
_HEADER = struct.Struct(">cQ")  # frame type, payload length
_MAX_FRAME = 2 << 30
# Codes a child may report; anything else is reported as a crash of the model.
_CHILD_CODES = (
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "INTERNAL",
)


@dataclass(frozen=True)
class SandboxLimits:
    # Address space the model may add to the child's size after its imports (RLIMIT_AS).
    memory_bytes: int | None = 4096 * MiB
    # CPU seconds (all threads) for loading and running the model (RLIMIT_CPU; SIGXCPU past it).
    cpu_seconds: int | None = 3600
    # Wall-clock seconds before the parent kills the child; None: the Celery time limit decides.
    wall_seconds: float | None = None

    @classmethod
    def from_env(cls) -> SandboxLimits:
        def number(name: str, default: float | None) -> float | None:
            text = os.environ.get(name, "").strip()
            if not text:
                return default
            value = float(text)
            return None if value <= 0 else value

        memory = number("XAUDIT_SANDBOX_MEMORY_MB", 4096)
        cpu = number("XAUDIT_SANDBOX_CPU_SECONDS", 3600)
        return cls(
            None if memory is None else int(memory * MiB),
            None if cpu is None else max(1, int(cpu)),
            number("XAUDIT_SANDBOX_WALL_SECONDS", None),
        )


def isolated_formats() -> frozenset[str]:
    text = os.environ.get("XAUDIT_SANDBOX_FORMATS", "torchscript").strip().lower()
    if text == "all":
        return frozenset({"onnx", "torchscript"})
    if text in ("", "none"):
        return frozenset()
    return frozenset(f.strip() for f in text.split(",") if f.strip())


def run_sandboxed(
    spec: JobSpec,
    model_bytes: bytes,
    model_format: str | None,
    tensors: Mapping[str, np.ndarray],
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    limits: SandboxLimits | None = None,
) -> JobResult:
    """:func:`workers.jobs.run_job`, in a limited child process for the formats that need one."""
    from workers.jobs import run_job
    from workers.models import detect_format

    fmt = model_format or detect_format(model_bytes)
    if fmt not in isolated_formats():
        return run_job(spec, model_bytes, fmt, tensors, progress, should_stop)
    return _Child(limits or SandboxLimits.from_env()).run(
        spec, model_bytes, fmt, tensors, progress, should_stop
    )


# -- parent side -----------------------------------------------------------------------------------


def _write_frame(out: IO[bytes], kind: bytes, payload: bytes) -> None:
    out.write(_HEADER.pack(kind, len(payload)))
    out.write(payload)
    out.flush()


def _read_frames(stream: IO[bytes], frames: queue.Queue[tuple[bytes, bytes] | None]) -> None:
    try:
        while True:
            header = stream.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return
            kind, size = _HEADER.unpack(header)
            if size > _MAX_FRAME:
                return
            payload = stream.read(size)
            if len(payload) < size:
                return
            frames.put((kind, payload))
    except (OSError, ValueError):
        return
    finally:
        frames.put(None)


def _decode_result(payload: bytes) -> JobResult:
    with np.load(io.BytesIO(payload), allow_pickle=False) as data:
        meta = json.loads(bytes(data["__meta__"]).decode("utf-8"))
        report = bytes(data["__report__"]) if "__report__" in data.files else None
        attributions = {
            name[len("attr/") :]: np.array(data[name]) for name in data.files if name.startswith("attr/")
        }
        target_values = np.array(data["target_values"]) if "target_values" in data.files else None
        target_classes = np.array(data["target_classes"]) if "target_classes" in data.files else None
    return JobResult(
        str(meta["kind"]),
        report,
        attributions,
        {str(k): str(v) for k, v in dict(meta.get("not_applicable") or {}).items()},
        target_values,
        target_classes,
    )


def _death_reason(returncode: int, limits: SandboxLimits) -> XauditError:
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        if sig == signal.SIGXCPU:
            return ResourceExhausted(
                f"the model used up its CPU time limit of {limits.cpu_seconds} s (its process got SIGXCPU)"
            )
        if sig == signal.SIGKILL:
            return ResourceExhausted(
                "the model's process was killed (SIGKILL): out of memory, or past its CPU hard limit"
            )
        return InvalidModel(f"the model crashed its process ({name})")
    return InvalidModel(f"the model's process exited with status {returncode} before finishing its job")


# Credentials the model's process has no use for.
_SECRET_ENV = ("XAUDIT_WORKER_TOKEN", "XAUDIT_TOKEN", "XAUDIT_TLS_KEY", "XAUDIT_TLS_CERT")


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}


class _Child:
    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits

    def run(
        self,
        spec: JobSpec,
        model_bytes: bytes,
        fmt: str,
        tensors: Mapping[str, np.ndarray],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
    ) -> JobResult:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=_child_env(),
        )
        logger.info("sandbox %d started for a %s model (limits %s)", proc.pid, fmt, self.limits)
        assert proc.stdin is not None and proc.stdout is not None
        frames: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        reader = threading.Thread(target=_read_frames, args=(proc.stdout, frames), daemon=True)
        reader.start()
        try:
            job = {
                "spec": spec.to_json(),
                "model": model_bytes,
                "format": fmt,
                "tensors": {k: np.asarray(v) for k, v in tensors.items()},
                "limits": asdict(self.limits),
            }
            with contextlib.suppress(BrokenPipeError):  # a child that died at once: its status says why
                pickle.dump(job, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.close()
            return self._wait(proc, frames, progress, should_stop)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(timeout=5)
            with contextlib.suppress(OSError):
                proc.stdout.close()

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        frames: queue.Queue[tuple[bytes, bytes] | None],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
    ) -> JobResult:
        deadline = None if self.limits.wall_seconds is None else time.monotonic() + self.limits.wall_seconds
        while True:
            try:
                frame = frames.get(timeout=0.2)
            except queue.Empty:
                frame = b"", b""
            if frame is None:  # the child closed its channel: exited, or died
                status = proc.wait()
                logger.warning("sandbox %d ended without a result (status %d)", proc.pid, status)
                raise _death_reason(status, self.limits)
            kind, payload = frame
            if kind == b"P" and progress is not None:
                message = json.loads(payload)
                progress(float(message["fraction"]), str(message["message"])[:500])
            elif kind == b"R":
                try:
                    return _decode_result(payload)
                except Exception as exc:  # whatever the child sent, it is no result
                    raise InvalidModel(
                        f"the model's process sent a malformed result ({type(exc).__name__})"
                    ) from None
            elif kind == b"E":
                message = json.loads(payload)
                code = str(message.get("code"))
                text = str(message.get("message"))[:1000]
                if code not in _CHILD_CODES:
                    raise InvalidModel(f"the model's process failed: {text}")
                raise error_for_code(code, text)
            if should_stop is not None and should_stop():
                proc.kill()
                raise Cancelled("the job was cancelled")
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                raise DeadlineExceeded(
                    f"the model ran past its wall-clock limit of {self.limits.wall_seconds:g} s and was stopped"
                )


# -- child side ------------------------------------------------------------------------------------


def _vm_size() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _apply_limits(limits: Mapping[str, Any]) -> None:
    import resource

    memory = limits.get("memory_bytes")
    if memory:
        ceiling = _vm_size() + int(memory)
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    cpu = limits.get("cpu_seconds")
    if cpu:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + int(cpu)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _encode_result(result: JobResult) -> bytes:
    arrays: dict[str, np.ndarray] = {
        "__meta__": np.frombuffer(
            json.dumps({"kind": result.kind, "not_applicable": result.not_applicable}).encode(), np.uint8
        )
    }
    if result.report is not None:
        arrays["__report__"] = np.frombuffer(result.report, np.uint8)
    for name, array in result.attributions.items():
        arrays[f"attr/{name}"] = np.asarray(array)
    if result.target_values is not None:
        arrays["target_values"] = np.asarray(result.target_values)
    if result.target_classes is not None:
        arrays["target_classes"] = np.asarray(result.target_classes)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _child_main() -> None:
    # fd 1 becomes the private result channel; anything the model or a library prints goes to stderr.
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _die_with_parent()
    job = pickle.load(sys.stdin.buffer)  # from the worker (trusted), before any model code runs
    import workers.audit
    import workers.explain  # noqa: F401  (imported before the limits: imports need address space)
    from workers.jobs import run_job
    from workers.metrics import activate_from_environment

    activate_from_environment()  # a metrics-serving worker's counters, in its multiprocess directory
    _apply_limits(job["limits"])

    def send_progress(fraction: float, message: str) -> None:
        _write_frame(channel, b"P", json.dumps({"fraction": fraction, "message": message}).encode())

    try:
        result = run_job(
            JobSpec.from_json(job["spec"]), job["model"], job["format"], job["tensors"], send_progress
        )
        _write_frame(channel, b"R", _encode_result(result))
    except XauditError as exc:
        _write_frame(channel, b"E", json.dumps({"code": exc.code, "message": str(exc)}).encode())
    except MemoryError:
        message = "the model ran out of its memory limit"
        _write_frame(channel, b"E", json.dumps({"code": "RESOURCE_EXHAUSTED", "message": message}).encode())
    except Exception as exc:
        logging.getLogger(__name__).exception("sandboxed job failed")
        message = f"internal error while running the model ({type(exc).__name__})"
        _write_frame(channel, b"E", json.dumps({"code": "INTERNAL", "message": message}).encode())
    channel.close()
    os._exit(0)


if __name__ == "__main__":
    _child_main()
