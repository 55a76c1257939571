"""The report's schema name, environment section, JSON conversion and canonical bytes (the typed
document is workers.audit.document)."""

from __future__ import annotations

import json
import math
import platform
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import numpy as np

from workers.denormals import current as current_denormals
from workers.hardware import processors
from workers.threads import current as current_threads

__all__ = ["SCHEMA", "canonical_bytes", "environment", "jsonable"]

SCHEMA = "xaudit.report/v2"
_PACKAGES = (
    "xaudit",
    "numpy",
    "torch",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnx2torch",
    "captum",
    "zennit",
)


def environment(device: str, providers: list[str]) -> dict[str, Any]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "packages": versions,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "device": device,
        "processors": processors(device),  # CPU model and kernels, GPU model: workers/hardware.py
        "execution_providers": providers,
        "threads": current_threads().as_dict(),
        "denormals": current_denormals(),  # subnormal floats flushed or kept: workers/denormals.py
    }


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays to plain JSON values; NaN and Inf to None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def canonical_bytes(report: dict[str, Any]) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes that get signed and stored."""
    return json.dumps(jsonable(report), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
