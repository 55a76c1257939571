"""The model process's side of the sandbox (workers/sandbox.py starts it): its first code, the
imports it does before any model, then one job: read it, confine the process (workers.confine),
limit it, run it (workers.jobs.run_job), send progress, metrics and the result as frames
(workers.sandbox_wire), exit. A spawned child and a child forked by the zygote
(workers.forkserver) run the same per-job code."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import sys
from collections.abc import Mapping
from typing import IO, Any

from workers.sandbox_wire import METRIC_OPS, NO_CONFINEMENT, encode_result, write_frame
from xaudit.contract.errors import FailedPrecondition, XauditError
from xaudit.contract.process import die_with_parent
from xaudit.contract.spec import JobSpec
from xaudit.contract.units import MiB

__all__ = ["child_main"]


# -- metrics: recorded here, counted by the worker -------------------------------------------------


class _Recorder:
    """Stands in for a prometheus metric in the child: keeps each call for the worker to replay."""

    def __init__(self, name: str, log: list[list[Any]], labels: tuple[str, ...] = ()) -> None:
        self._name, self._log, self._labels = name, log, labels

    def labels(self, *labels: str) -> _Recorder:
        return _Recorder(self._name, self._log, tuple(str(v) for v in labels))

    def _record(self, op: str, value: float) -> None:
        self._log.append([self._name, list(self._labels), op, float(value)])

    def inc(self, value: float = 1.0) -> None:
        self._record("inc", value)

    def observe(self, value: float) -> None:
        self._record("observe", value)

    def set(self, value: float) -> None:
        self._record("set", value)


class _RecordingMetrics:
    def __init__(self) -> None:
        self.log: list[list[Any]] = []
        for name in METRIC_OPS:
            setattr(self, name, _Recorder(name, self.log))


def _vm_size() -> int:
    with open("/proc/self/status") as status:  # no guess: a wrong size would starve or free the model
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _apply_limits(limits: Mapping[str, Any], vm_size: int) -> None:
    """``vm_size``: the address space in use before the model, measured before the confinement
    (which closes /proc)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file
    memory = limits.get("memory_bytes")
    if memory:
        ceiling = vm_size + int(memory)
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    cpu = limits.get("cpu_seconds")
    if cpu:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + int(cpu)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))


# Messages of allocators that failed under RLIMIT_AS (torch, onnxruntime, C++).
_ALLOCATION_FAILURES = ("bad_alloc", "failed to allocate", "can't allocate memory", "out of memory")


def _failure(exc: BaseException, limits: Mapping[str, Any]) -> tuple[str, str]:
    """The code and message the worker gets for an exception of the job."""
    if isinstance(exc, XauditError):
        return exc.code, str(exc)
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(m in text for m in _ALLOCATION_FAILURES):
        memory = limits.get("memory_bytes")
        size = f" of {int(memory) // MiB} MiB" if memory else ""
        return "RESOURCE_EXHAUSTED", f"the model ran out of its memory limit{size} (an allocation failed)"
    logging.getLogger(__name__).error("sandboxed job failed: %s: %s", type(exc).__name__, str(exc)[:500])
    return "INTERNAL", f"internal error while running the model ({type(exc).__name__})"


def _result_channel() -> IO[bytes]:
    """fd 1 becomes the private result channel; anything the model or a library prints goes to stderr."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return channel


def _import_core() -> None:
    """What every job needs, imported before the confinement and the limits (imports need files and
    address space)."""
    import onnxruntime  # noqa: F401

    import workers.confine
    import workers.jobs
    import workers.metrics
    import workers.models.onnx_model
    import workers.models.torchscript_model  # noqa: F401


def _import_rest() -> None:
    """The rest of the compute core, for a process that imports ahead of its job (a spare child, the
    zygote). captum brings matplotlib, whose font list is read from the user's cache: once confined,
    the child could neither read nor save it and would rebuild it for every job."""
    import captum.attr  # noqa: F401
    import torch.onnx  # noqa: F401

    import workers.audit
    import workers.explain  # noqa: F401


def child_main(zygote_control: int | None = None) -> None:
    """A model process's first code: a spawned child runs one job; with ``zygote_control`` (its
    control socket's descriptor) the process is the zygote, and each child it forks runs one job."""
    if zygote_control is not None:
        os.dup2(2, 1)  # nothing it prints reaches the worker's stdout
        _import_core()
        _import_rest()
        from workers.forkserver import serve

        serve(zygote_control, lambda: _run_job_here(_result_channel()))
    channel = _result_channel()
    die_with_parent()
    _import_core()
    # One with a job waiting leaves the rest to the job (Landlock keeps the code readable).
    if not select.select([sys.stdin], [], [], 0)[0]:
        _import_rest()
    _run_job_here(channel)


def _run_job_here(channel: IO[bytes]) -> None:
    """The per-job part of every model process (spawned or forked): read the job, confine this
    process, limit it, run the job, send its frames, exit."""
    from workers import metrics
    from workers.confine import confine
    from workers.jobs import run_job

    try:
        job = pickle.load(sys.stdin.buffer)  # from the worker (trusted), before any model code runs
    except EOFError:  # a spare child whose worker stopped: nothing to do
        os._exit(0)

    def send(kind: bytes, message: object) -> None:
        write_frame(channel, kind, json.dumps(message).encode())

    recording = _RecordingMetrics()
    metrics.activate(recording)  # type: ignore[arg-type]  # the worker replays what it records
    try:
        vm_size = _vm_size()
        confinement = confine()
        if job["need_filesystem"] and not confinement.filesystem:
            raise FailedPrecondition(NO_CONFINEMENT)
        _apply_limits(job["limits"], vm_size)
        send(b"S", confinement.describe())

        def send_progress(fraction: float, message: str) -> None:
            send(b"P", {"fraction": fraction, "message": message})

        result = run_job(
            JobSpec.from_json(job["spec"]), job["model"], job["format"], job["tensors"], send_progress
        )
        send(b"M", recording.log)
        write_frame(channel, b"R", encode_result(result))
    except BaseException as exc:
        code, message = _failure(exc, job["limits"])
        with contextlib.suppress(Exception):
            send(b"M", recording.log)
        send(b"E", {"code": code, "message": message})
    channel.close()
    os._exit(0)


if __name__ == "__main__":
    child_main()
