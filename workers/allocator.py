"""Keep freed tensor memory in the process for the next tensor (glibc's malloc).

A method's elementwise steps allocate and free tensors of a few megabytes each, thousands of times
per audit. glibc serves such sizes with fresh ``mmap`` pages (or trims its heap after freeing them),
so every new tensor is page-faulted in again: 357 minor faults per step of DeepLIFT's ReLU rule on
one 512-row batch of the digits CNN, against 10 with the thresholds below: 17-21% of a rule
method's time in a fresh process, 3.3 s -> 2.8 s for the 8-player digits audit (README
"Performance"). Raising the mmap and trim thresholds keeps up to ``TRIM_THRESHOLD`` of freed memory
for reuse; the sandbox's address-space limit counts it as before.
"""

from __future__ import annotations

import ctypes
import logging
import platform

from xaudit.contract.units import MiB

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

logger = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 * MiB  # blocks below it come from the heap, not from fresh pages
TRIM_THRESHOLD = 128 * MiB  # free memory kept at the heap's top before it is given back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds, once per process; False where the C library is not glibc."""
    global _applied
    if _applied is None:
        _applied = False
        if platform.libc_ver()[0] == "glibc":
            try:
                libc = ctypes.CDLL(None)
                _applied = bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(
                    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                )
            except (OSError, AttributeError) as exc:
                logger.info("malloc thresholds left as they are: %s", exc)
    return _applied
