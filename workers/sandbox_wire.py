"""What the worker and a model's process say to each other (workers/sandbox.py, the worker's side;
workers/sandbox_child.py, the model process's): typed frames on the child's stdout, the result as
``.npz`` data read with ``allow_pickle=False`` (nothing the child sends can run code in the worker),
and the metric calls the worker accepts from a child."""

from __future__ import annotations

import io
import json
import queue
import struct
from typing import IO

import numpy as np

from workers.jobs import JobResult

__all__ = [
    "ALLOW_UNCONFINED_ENV",
    "METRIC_OPS",
    "NO_CONFINEMENT",
    "decode_result",
    "encode_result",
    "read_frames",
    "write_frame",
]

_HEADER = struct.Struct(">cQ")  # frame type, payload length
_MAX_FRAME = 2 << 30

ALLOW_UNCONFINED_ENV = "XAUDIT_SANDBOX_ALLOW_UNCONFINED"
NO_CONFINEMENT = (
    "this worker cannot confine a model's file access (its kernel has no Landlock), so it refuses to "
    f"run TorchScript, which can run code; the operator may allow it with {ALLOW_UNCONFINED_ENV}=1"
)

# What the child may ask the worker to record (workers.metrics.WorkerMetrics attributes).
METRIC_OPS = {
    "forward_passes": "inc", "forward_samples": "inc", "backward_passes": "inc",
    "backward_samples": "inc", "method_seconds": "observe", "verdicts": "inc",
    "onnx_sessions": "inc", "cpu_fallbacks": "inc", "device_info": "set",
}  # fmt: skip


def write_frame(out: IO[bytes], kind: bytes, payload: bytes) -> None:
    out.write(_HEADER.pack(kind, len(payload)))
    out.write(payload)
    out.flush()


def read_frames(stream: IO[bytes], frames: queue.Queue[tuple[bytes, bytes] | None]) -> None:
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


def encode_result(result: JobResult) -> bytes:
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


def decode_result(payload: bytes) -> JobResult:
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
