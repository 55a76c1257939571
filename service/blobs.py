"""Content-addressed blobs (model files) on local disk: ``<root>/<sha[:2]>/<sha>``.

Writes go to a temporary file in the same directory and are renamed into place only after the
digest is known and checked, so a reader never sees a partial blob.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from service.text import shown
from xaudit.contract.errors import InvalidInput, NotFound, ResourceExhausted

__all__ = ["CHUNK_BYTES", "BlobStore", "BlobWriter", "is_sha256"]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(text: str) -> bool:
    return bool(_SHA256.match(text))


def _disk_error(exc: OSError, root: Path) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(f"the server's blob store ({root}) is out of disk space")
    return exc


class BlobWriter:
    """Streams bytes to a temporary file while hashing; :meth:`commit` moves it into place."""

    def __init__(self, store: BlobStore) -> None:
        self._store = store
        self._hash = hashlib.sha256()
        self.size = 0
        store.root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".upload-", dir=store.root)
        self._path = Path(name)
        self._file: BinaryIO = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            self.abort()
            raise _disk_error(exc, self._store.root) from None
        self._hash.update(data)
        self.size += len(data)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def read_back(self) -> bytes:
        self._file.flush()
        return self._path.read_bytes()

    def commit(self) -> str:
        """Durably store the blob under its digest; returns the digest."""
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            final = self._store.path(self.sha256)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._path, final)
        except OSError as exc:
            self.abort()
            raise _disk_error(exc, self._store.root) from None
        return self.sha256

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._path.unlink(missing_ok=True)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        # Not committed: remove the temporary file (commit already moved it otherwise).
        self.abort()


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha256: str) -> Path:
        if not is_sha256(sha256):
            raise InvalidInput(f"'{shown(sha256)}' is not a sha256 digest (64 lowercase hex characters)")
        return self.root / sha256[:2] / sha256

    def writer(self) -> BlobWriter:
        return BlobWriter(self)

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def size(self, sha256: str) -> int:
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"unknown blob {sha256}") from None

    def read(self, sha256: str) -> bytes:
        try:
            return self.path(sha256).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"unknown blob {sha256}") from None

    def chunks(self, sha256: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        try:
            handle = self.path(sha256).open("rb")
        except FileNotFoundError:
            raise NotFound(f"unknown blob {sha256}") from None
        with handle:
            while chunk := handle.read(chunk_bytes):
                yield chunk
