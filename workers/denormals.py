"""Subnormal floats flushed to zero on the CPU while a job computes, in torch's kernels and
onnxruntime's.

A float32 below 2^-126 (1.2e-38) is subnormal, and an x86 core computes with one through a slow
microcode path unless its thread's MXCSR register says to flush such results to zero (FTZ) and read
such inputs as zero (DAZ). Transformers make them: a saturated softmax's probabilities and the
gradients through them underflow. On the BERT of bench/suite.py's text section (width 256, 128
tokens) a fifth of one attention product's operand was subnormal or nearly so; that product took
38-78 ms where its twins took 1.5, and a forward+backward of 36 rows took 918 ms on one thread
instead of 458. onnxruntime's forward of the same rows took 131 ms instead of 112.

Flushing moves a value by less than 1.2e-38. Attributions are compared at float32's relative
rounding (6e-8 of their size) and judged to 0.05 of the effect mass (docs/science.md 5.4, which says
so), so no score or verdict can tell. TensorFlow and XLA's CPU runtime flush them the same way: on
their compute threads and, scoped, on the calling thread while a kernel or an executable runs.
``XAUDIT_FLUSH_DENORMALS=0`` keeps subnormals, and the report's environment section says which ran.

The register belongs to each thread, and it changes the arithmetic of everything that runs there,
Python's own floats included (Hypothesis refuses to run under it). So it is set only while a job
computes (:func:`flushing`, around :func:`workers.jobs.run_job` and the CLI's local jobs) and put
back after. torch sets it on the calling thread only, and OpenMP's threads copy it when they start:
entered before the job's first parallel region, the scope covers them, and the threads keep it
(no Python code runs on them). An onnxruntime session sets the calling thread's register from its
own option, off by default: inside the scope every session asks for it (:func:`flush_in_onnxruntime`),
else a session made during the job turned the flushing off for torch too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from workers.switches import switch

__all__ = [
    "FLUSHED",
    "FLUSH_ENV",
    "NO_MODE",
    "ORT_OPTION",
    "current",
    "flush_in_onnxruntime",
    "flushes_on_every_thread",
    "flushing",
]

logger = logging.getLogger(__name__)

FLUSH_ENV = "XAUDIT_FLUSH_DENORMALS"  # on by default; 0 keeps subnormals
ORT_OPTION = "session.set_denormal_as_zero"  # onnxruntime's session config key
_SUBNORMAL_BITS = 1 << 19  # 2^-130 as float32 bits: written as bits, since a conversion would flush it
_PROBE_PER_THREAD = 1 << 16  # twice torch's grain: a product of this many per thread is split among all
FLUSHED, PARTLY = "flushed to zero", "flushed on some threads only"
NO_MODE = "kept (this CPU has no flush-to-zero mode)"


class _Scopes(threading.local):
    """This thread's flushing() scopes entered and not yet left (the register is per thread)."""

    depth = 0


_scopes = _Scopes()
_no_mode = False  # torch found no flush-to-zero mode on this CPU


@contextlib.contextmanager
def flushing() -> Iterator[None]:
    """Flush on this thread and the threads torch starts from it while the block runs; put this
    thread's register back after."""
    global _no_mode
    if not switch(FLUSH_ENV, True):
        yield
        return
    import torch

    before = _flushes_here()
    if not torch.set_flush_denormal(True):
        _no_mode = True
        yield
        return
    _scopes.depth += 1
    try:
        yield
    finally:
        _scopes.depth -= 1
        if not before and _scopes.depth == 0:
            torch.set_flush_denormal(False)


def current() -> str:
    """What holds now, as the report's environment section records it."""
    if not switch(FLUSH_ENV, True):
        return f"kept ({FLUSH_ENV}=0)"
    if _no_mode:
        return NO_MODE
    if _scopes.depth == 0:
        return "kept (computed outside a job)" if not _flushes_here() else FLUSHED
    if flushes_on_every_thread():
        return FLUSHED
    # torch's threads started before the job (or an onnxruntime session without the option): only
    # new threads would copy the register
    logger.warning("subnormal floats flushed on some threads only")
    return PARTLY


def flushes_on_every_thread() -> bool:
    """A subnormal read by products that torch splits among all its threads counts as zero on each:
    an elementwise product (torch's own threads) and a matrix product (its BLAS's)."""
    import torch

    threads = torch.get_num_threads()
    elements = torch.full((_PROBE_PER_THREAD * threads,), _SUBNORMAL_BITS, dtype=torch.int32)
    matrix = torch.full((64 * threads, 64), _SUBNORMAL_BITS, dtype=torch.int32).view(torch.float32)
    large = torch.full((64, 256), 2.0**100)  # subnormal x 2^100 is a normal float where it is read
    every = bool(((elements.view(torch.float32) * 2.0**100) == 0).all())
    return every and bool(((matrix @ large) == 0).all())


def _flushes_here() -> bool:
    """This thread reads a subnormal as zero (one element: no other thread takes part)."""
    import torch

    one = torch.full((1,), _SUBNORMAL_BITS, dtype=torch.int32).view(torch.float32)
    return bool((one * 2.0**100 == 0).all())


def flush_in_onnxruntime(options: Any) -> Any:
    """Inside :func:`flushing`, ask an ``onnxruntime.SessionOptions`` to flush on its threads and the
    calling one; outside, onnxruntime's default (which turns the calling thread's off)."""
    if _scopes.depth > 0:
        options.add_session_config_entry(ORT_OPTION, "1")
    return options
