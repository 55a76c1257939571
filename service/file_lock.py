"""One read-modify-write of a file at a time, across processes: an exclusive ``flock`` on a lock file
beside it. The files the CLI edits under a running server (the tokens file, the signing key) are
replaced in one rename, so the server never reads half a file, but two editors at once would each
start from the old contents and one edit would be lost."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created, never deleted: deleting it would let a
    waiter and a newcomer hold two different files). Raises OSError if it cannot be opened."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
