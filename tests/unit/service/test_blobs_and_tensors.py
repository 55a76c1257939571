from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import numpy as np
import pytest

from service.blobs import BlobStore
from xaudit.contract.errors import InvalidInput, NotFound, ResourceExhausted
from xaudit.contract.tensors import decode_tensor, encode_tensor


def test_blob_is_stored_under_its_digest_atomically(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    with blobs.writer() as w:
        w.write(b"abc")
        w.write(b"def")
        sha = w.commit()
    assert sha == hashlib.sha256(b"abcdef").hexdigest()
    assert blobs.read(sha) == b"abcdef" and b"".join(blobs.chunks(sha, 4)) == b"abcdef"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [sha]  # no temp file left
    with blobs.writer() as w:
        w.write(b"never committed")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [sha]
    with pytest.raises(NotFound):
        blobs.read("0" * 64)
    with pytest.raises(InvalidInput):
        blobs.read("../../etc/passwd")


def test_disk_full_is_resource_exhausted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = BlobStore(tmp_path)
    w = blobs.writer()

    def full(_data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(w._file, "write", full)
    with pytest.raises(ResourceExhausted, match="out of disk space"):
        w.write(b"x")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<i8", "|u1", "|b1", "<f2", "<i4"])
def test_tensor_round_trip(dtype: str) -> None:
    array = (np.arange(12).reshape(3, 4) % 2).astype(dtype)
    back = decode_tensor(encode_tensor("x", array))
    assert back.dtype == array.dtype and back.shape == (3, 4)
    np.testing.assert_array_equal(back, array)


def test_tensor_caps_and_shape_checks() -> None:
    t = encode_tensor("x", np.zeros((4, 4), np.float32))
    with pytest.raises(ResourceExhausted, match="exceed the cap of 10"):
        decode_tensor(t, max_elements=10)
    with pytest.raises(InvalidInput, match="at most 1 are accepted"):
        decode_tensor(t, max_dims=1)
    t.shape[:] = [4, -4]
    with pytest.raises(InvalidInput, match="negative dimension"):
        decode_tensor(t)
