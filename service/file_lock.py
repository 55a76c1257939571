"""One read-modify-write of a file at a time, across processes: an exclusive ``flock`` on a lock file
beside it. The files the CLI edits under a running server (the tokens file, the signing key) are
replaced in one rename, so the server never reads half a file, but two editors at once would each
start from the old contents and one edit would be lost."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from xaudit.contract.errors import InvalidInput

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(lock_path: Path, refusal: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (made with its directory, never deleted: deleting it
    would let a waiter and a newcomer hold two different files). Where it cannot be made:
    InvalidInput ``"{refusal}: {reason}"``, e.g. "cannot write the tokens file F: Permission denied"."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise InvalidInput(f"{refusal}: {exc.strerror}") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
