"""Subnormal floats flushed to zero on the CPU, in torch's kernels and in onnxruntime's.

A float32 below 2^-126 (1.2e-38) is subnormal, and an x86 core computes with one through a slow
microcode path unless its thread's MXCSR register says to flush such results to zero (FTZ) and read
such inputs as zero (DAZ). Transformers make them: a saturated softmax's probabilities and the
gradients through them underflow. On the BERT of bench/suite.py's text section (width 256, 128
tokens) a fifth of one attention product's operand was subnormal or nearly so; that product took
38-78 ms where its twins took 1.5, and a forward+backward of 36 rows took 918 ms on one thread
instead of 458. onnxruntime's forward of the same rows took 131 ms instead of 112.

Flushing moves a value by less than 1.2e-38. Attributions are compared at float32's relative
rounding (6e-8 of their size) and judged to 0.05 of the effect mass (docs/science.md 5.4, which says so), so no
score or verdict can tell; TensorFlow and XLA flush on CPUs by default. ``XAUDIT_FLUSH_DENORMALS=0``
keeps subnormals, and the report's environment section says which ran.

The register belongs to each thread. torch sets it on the calling thread only, and OpenMP's threads
copy it from the thread that starts them, so it is set before torch's first parallel region (from
``load_model``, after the thread policy) and then checked by a product that runs on every thread.
An onnxruntime session sets the calling thread's register from its own option, off by default: a
session made without :func:`flush_in_onnxruntime` turned the flushing off for torch too.
"""

from __future__ import annotations

import logging
from typing import Any

from workers.switches import switch

__all__ = [
    "FLUSH_ENV",
    "ORT_OPTION",
    "current",
    "flush_in_onnxruntime",
    "flush_in_torch",
    "flushes_on_every_thread",
]

logger = logging.getLogger(__name__)

FLUSH_ENV = "XAUDIT_FLUSH_DENORMALS"  # on by default; 0 keeps subnormals
ORT_OPTION = "session.set_denormal_as_zero"  # onnxruntime's session config key
_SUBNORMAL_BITS = 1 << 19  # 2^-130 as float32 bits: written as bits, since a conversion would flush it
_PROBE_PER_THREAD = 1 << 16  # twice torch's grain: a product of this many per thread is split among all
FLUSHED, PARTLY = "flushed to zero", "flushed on some threads only"
_state: str | None = None


def flush_in_torch() -> str:
    """Flush on this thread and the threads torch starts from it (once per process); what holds now,
    as the report's environment section says it."""
    global _state
    if _state is not None:
        return _state
    if not switch(FLUSH_ENV, True):
        _state = f"kept ({FLUSH_ENV}=0)"
        return _state
    import torch

    if not torch.set_flush_denormal(True):
        _state = "kept (this CPU has no flush-to-zero mode)"
    elif flushes_on_every_thread():
        _state = FLUSHED
    else:  # torch's threads started before: only new ones would copy the register
        _state = PARTLY
        logger.warning("subnormal floats flushed on some threads only: torch's threads started before")
    return _state


def flushes_on_every_thread() -> bool:
    """A subnormal read by products that torch splits among all its threads counts as zero on each:
    an elementwise product (torch's own threads) and a matrix product (its BLAS's)."""
    import torch

    threads = torch.get_num_threads()
    elements = torch.full((_PROBE_PER_THREAD * threads,), _SUBNORMAL_BITS, dtype=torch.int32)
    matrix = torch.full((64 * threads, 64), _SUBNORMAL_BITS, dtype=torch.int32).view(torch.float32)
    large = torch.full((64, 256), 2.0**100)  # subnormal x 2^100 is a normal float where it is read
    return bool(((elements.view(torch.float32) * 2.0**100) == 0).all()) and bool(
        ((matrix @ large) == 0).all()
    )


def flush_in_onnxruntime(options: Any) -> Any:
    """Ask an ``onnxruntime.SessionOptions`` to flush on its threads and the calling one, as torch does."""
    if switch(FLUSH_ENV, True):
        options.add_session_config_entry(ORT_OPTION, "1")
    return options


def current() -> str:
    """What holds now, as reports record it (flushing first where no model was loaded yet): checked
    again, because an onnxruntime session made elsewhere in the process turns the calling thread's off."""
    state = flush_in_torch()
    if state == FLUSHED and not flushes_on_every_thread():
        return PARTLY
    return state
