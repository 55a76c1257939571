"""Prometheus metrics of the workers, and the HTTP endpoint that exposes them.

:class:`WorkerMetrics` takes the registry it registers on. The compute core records through the
module-level helpers (``count_forward``, ``count_backward``, ``observe_method``, ...): one call at
each site, a no-op until a process :func:`activate` s a :class:`WorkerMetrics`, so the library and
the local CLI pay nothing.

Celery's prefork pool computes in child processes: set ``PROMETHEUS_MULTIPROC_DIR`` (an empty
directory) before any metric is created - :func:`use_multiprocess_dir` does it - and expose
:func:`multiprocess_registry` from the parent; each child writes its values to its own file there.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from xaudit.contract.metrics_http import serve_metrics
from xaudit.contract.names import VERDICTS

if TYPE_CHECKING:
    import torch

__all__ = [
    "COMPUTE_BUCKETS",
    "DeviceInfo",
    "WorkerMetrics",
    "activate",
    "active",
    "count_backward",
    "count_forward",
    "describe_device",
    "mark_process_dead",
    "multiprocess_registry",
    "observe_method",
    "record_cpu_fallback",
    "record_onnx_session",
    "record_verdict",
    "report_device",
    "serve_worker_metrics",
    "use_multiprocess_dir",
]

logger = logging.getLogger(__name__)

# Seconds one attribution method takes on one job.
COMPUTE_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
# Label values are clamped to these small sets.
VERDICT_OUTCOMES: tuple[str, ...] = VERDICTS  # the audit's four verdicts, one label each
FALLBACK_COMPONENTS: tuple[str, ...] = ("torch", "onnxruntime")
_ORT_PROVIDERS: frozenset[str] = frozenset(
    {
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "ROCMExecutionProvider",
        "MIGraphXExecutionProvider",
        "OpenVINOExecutionProvider",
        "DmlExecutionProvider",
        "CoreMLExecutionProvider",
    }
)
_OTHER = "other"


class WorkerMetrics:
    """The worker's metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.method_seconds = Histogram(
            "xaudit_method_compute_seconds",
            "Seconds one attribution method took on one job, by method.",
            ["method"],
            buckets=COMPUTE_BUCKETS,
            registry=registry,
        )
        self.forward_passes = Counter(
            "xaudit_model_forward_passes",
            "Batched forward calls of the model (one per chunk of rows).",
            registry=registry,
        )
        self.forward_samples = Counter(
            "xaudit_model_forward_samples", "Input rows evaluated by forward passes.", registry=registry
        )
        self.backward_passes = Counter(
            "xaudit_model_backward_passes",
            "Backward passes (gradients of the target w.r.t. the input; one per chunk of rows).",
            registry=registry,
        )
        self.backward_samples = Counter(
            "xaudit_model_backward_samples",
            "Input rows differentiated by backward passes.",
            registry=registry,
        )
        self.verdicts = Counter(
            "xaudit_audit_verdicts",
            "Audit verdicts by attribution method and outcome (see VERDICT_OUTCOMES).",
            ["method", "outcome"],
            registry=registry,
        )
        self.onnx_sessions = Counter(
            "xaudit_onnxruntime_sessions",
            "ONNX Runtime sessions created, by the device requested and the provider they really got first.",
            ["requested", "provider"],
            registry=registry,
        )
        self.cpu_fallbacks = Counter(
            "xaudit_cpu_fallbacks",
            "Times a worker computed on the CPU where CUDA was asked for or looked for, by component.",
            ["component"],
            registry=registry,
        )
        self.device_info = Gauge(
            "xaudit_worker_device_info",
            "The device this worker computes on (value 1): device is cpu or cuda, name the GPU model.",
            ["device", "name"],
            registry=registry,
            multiprocess_mode="max",
        )
        for component in FALLBACK_COMPONENTS:
            self.cpu_fallbacks.labels(component)


_active: WorkerMetrics | None = None
_active_lock = threading.Lock()


def activate(metrics: WorkerMetrics | None) -> WorkerMetrics | None:
    """Make ``metrics`` the instance the helpers record to (None: record nothing); return the previous."""
    global _active
    with _active_lock:
        previous, _active = _active, metrics
    return previous


def active() -> WorkerMetrics | None:
    return _active


# --- one-line helpers for the compute core ------------------------------------------------------
def count_forward(samples: int, batches: int = 1) -> None:
    m = _active
    if m is not None:
        m.forward_passes.inc(batches)
        m.forward_samples.inc(samples)


def count_backward(samples: int, passes: int = 1) -> None:
    m = _active
    if m is not None:
        m.backward_passes.inc(passes)
        m.backward_samples.inc(samples)


def observe_method(method: str, seconds: float) -> None:
    m = _active
    if m is not None:
        m.method_seconds.labels(method).observe(max(0.0, seconds))


def record_verdict(method: str, outcome: str) -> None:
    m = _active
    if m is not None:
        m.verdicts.labels(method, outcome if outcome in VERDICT_OUTCOMES else _OTHER).inc()


def record_onnx_session(requested: str, providers: Sequence[str]) -> None:
    """A session asked for ``requested`` (a torch device type) and runs on ``providers`` (first wins)."""
    m = _active
    if m is None:
        return
    first = providers[0] if providers else _OTHER
    requested = requested if requested in ("cpu", "cuda") else _OTHER
    m.onnx_sessions.labels(requested, first if first in _ORT_PROVIDERS else _OTHER).inc()
    if requested == "cuda" and first == "CPUExecutionProvider":
        m.cpu_fallbacks.labels("onnxruntime").inc()


def record_cpu_fallback(component: str) -> None:
    m = _active
    if m is not None:
        m.cpu_fallbacks.labels(component if component in FALLBACK_COMPONENTS else _OTHER).inc()


# --- the device ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceInfo:
    device: str  # "cpu" | "cuda"
    name: str  # GPU model, or "cpu"
    index: int | None
    memory_bytes: int | None


def describe_device(device: torch.device | str) -> DeviceInfo:
    """What ``device`` (a ``torch.device`` or its name) is, asking torch only about CUDA devices."""
    import torch

    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type != "cuda":
        return DeviceInfo("cpu", "cpu", None, None)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo("cuda", str(props.name), index, int(props.total_memory))


def report_device(device: torch.device | str) -> DeviceInfo:
    """Log the device this worker computes on and expose it as ``xaudit_worker_device_info``."""
    info = describe_device(device)
    if info.device == "cuda":
        gib = (info.memory_bytes or 0) / 2**30
        logger.info("worker computes on cuda:%s (%s, %.1f GiB)", info.index, info.name, gib)
    else:
        logger.info("worker computes on the CPU")
    m = _active
    if m is not None:
        m.device_info.labels(info.device, info.name).set(1)
    return info


# --- exposition ---------------------------------------------------------------------------------
def use_multiprocess_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Turn on prometheus_client's multiprocess mode with ``path`` (default: the environment's
    ``PROMETHEUS_MULTIPROC_DIR``, else a new temporary directory). Call it before metrics are created;
    the directory must be emptied between runs of the worker (stale files would add up)."""
    chosen = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    directory = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="xaudit-metrics-"))
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    from prometheus_client import values

    # The value class is chosen when prometheus_client is imported; choose again now the variable is set.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return directory


def multiprocess_registry() -> CollectorRegistry:
    """A registry that reads every process's values from ``PROMETHEUS_MULTIPROC_DIR``."""
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def mark_process_dead(pid: int) -> None:
    """Call from the pool's process-exit hook so that live gauges forget a dead child."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


# --- the `xaudit worker --metrics-port` wiring ----------------------------------------------------
def serve_worker_metrics(port: int | None, addr: str = "0.0.0.0") -> int | None:
    """Expose a Celery prefork worker's metrics on ``port``; returns the bound port.

    Call it in the worker's main process before the pool starts: it turns on multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``, emptied of a previous run's files), serves the merged values of
    all pool processes, and has each pool child activate its :class:`WorkerMetrics` and report its
    device when it starts (CUDA is initialised in the child, never in the parent). None: do nothing.
    """
    if port is None:
        return None
    from celery import signals

    directory = use_multiprocess_dir()
    for stale in directory.glob("*.db"):
        stale.unlink()
    signals.worker_process_init.connect(_pool_child_started, weak=False)
    signals.worker_process_shutdown.connect(_pool_child_exiting, weak=False)
    _, bound = serve_metrics(port, multiprocess_registry(), addr)
    return bound


def _pool_child_started(**_: object) -> None:
    import torch

    activate(WorkerMetrics(CollectorRegistry()))
    report_device("cuda" if torch.cuda.is_available() else "cpu")


def _pool_child_exiting(pid: int | None = None, **_: object) -> None:
    mark_process_dead(pid if pid is not None else os.getpid())
