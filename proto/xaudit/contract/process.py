"""Process helpers shared by the service (its embedded worker) and the workers (their pool children)."""

from __future__ import annotations

import logging
import signal
import sys

__all__ = ["die_with_parent"]

logger = logging.getLogger(__name__)


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, so a killed service or
    worker main process never leaves orphans computing (their jobs are re-dispatched anyway)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")
