"""Periodic clean-up beside the dispatcher: blobs no model record points to.

Uploads record the model before moving its blob into place (service.uploads), so an orphan is only
what a crash leaves: a temporary ``.upload-*`` file, or a blob whose record was never committed.
Both are removed once older than a grace period (an upload may be in flight on another replica
sharing the disk).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from service.blobs import BlobStore, is_sha256

__all__ = ["Housekeeper", "sweep_orphan_blobs"]

logger = logging.getLogger(__name__)


def sweep_orphan_blobs(blobs: BlobStore, kept: Callable[[], set[str]], grace_seconds: float) -> int:
    """Delete blob files and upload leftovers that no model record needs; returns how many."""
    if not blobs.root.is_dir():
        return 0
    cutoff = time.time() - grace_seconds
    keep = kept()
    removed = 0
    for path in blobs.root.rglob("*"):
        try:
            if not path.is_file() or path.stat().st_mtime > cutoff:
                continue
        except FileNotFoundError:
            continue
        leftover = path.name.startswith(".")  # partial uploads (.upload-*) and other temporaries
        orphan = is_sha256(path.name) and path.name not in keep
        if leftover or orphan:
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        logger.warning("removed %d orphan blob file(s) under %s", removed, blobs.root)
    return removed


class Housekeeper:
    """Runs the orphan sweep at start and then every ``period`` seconds, on one daemon thread."""

    def __init__(
        self, blobs: BlobStore, kept: Callable[[], set[str]], period: float, grace_seconds: float
    ) -> None:
        self._blobs, self._kept = blobs, kept
        self._period, self._grace = period, grace_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xaudit-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            try:
                sweep_orphan_blobs(self._blobs, self._kept, self._grace)
            except Exception:  # a failing store or disk: try again next period
                logger.exception("orphan blob sweep failed")
            if self._stop.wait(self._period):
                return
