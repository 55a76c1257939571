"""Every onnxruntime session's options: its threads and spinning (workers/threads.py) and subnormal
floats flushed to zero (workers/denormals.py). The game's raw-ORT benchmarks take the same."""

from __future__ import annotations

import onnxruntime as ort

from workers.denormals import flush_in_onnxruntime
from workers.threads import ort_session_options

__all__ = ["session_options"]


def session_options() -> ort.SessionOptions:
    options: ort.SessionOptions = flush_in_onnxruntime(ort_session_options(ort.SessionOptions()))
    return options
