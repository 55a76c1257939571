"""UploadModel: hash while receiving, enforce the cap, validate, record, then store content-addressed.

The model's record is written before its blob is moved into place: a request the store refuses
leaves no blob behind (nothing outside every quota), and a blob on disk always has a record. The
orphan sweep (service.housekeeping) removes what a crash may still leave.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from service.blobs import BlobStore
from service.quotas import Quotas
from service.store import JobStore, ModelRecord
from service.validation import check_model, format_from_proto
from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.v1 import audit_pb2

__all__ = ["receive_model"]

logger = logging.getLogger(__name__)


def _cap_error(size: int, cap: int) -> ResourceExhausted:
    return ResourceExhausted(f"model upload of {size} bytes exceeds the server's cap of {cap} bytes")


def receive_model(
    chunks: Iterable[audit_pb2.ModelChunk],
    blobs: BlobStore,
    store: JobStore,
    tenant: str,
    cap: int,
    quotas: Quotas | None = None,
) -> ModelRecord:
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("kind") != "metadata":
        raise InvalidInput("UploadModel: the first message must carry the metadata (format, declared size)")
    meta = first.metadata
    fmt = format_from_proto(meta.format)
    if meta.declared_size < 0:
        raise InvalidInput(f"declared_size {meta.declared_size} is negative")
    if meta.declared_size > cap:
        raise _cap_error(meta.declared_size, cap)
    if quotas is not None and fmt is not None:  # refuse early, before receiving the bytes
        quotas.check_model(tenant, fmt, meta.declared_size)
    with blobs.writer() as writer:
        for chunk in it:
            if chunk.WhichOneof("kind") != "data":
                raise InvalidInput("UploadModel: metadata may only come in the first message")
            if writer.size + len(chunk.data) > cap:
                raise _cap_error(writer.size + len(chunk.data), cap)
            writer.write(chunk.data)
        if meta.declared_size and writer.size != meta.declared_size:
            raise InvalidInput(
                f"upload ended after {writer.size} bytes but {meta.declared_size} were declared"
            )
        name = check_model(writer.read_back(), fmt)
        if quotas is not None:
            quotas.check_model(tenant, name, writer.size)
        sha256 = writer.sha256
        # Only the upload that created the record may take it back (a concurrent twin keeps its own).
        record, new = store.record_model(tenant, sha256, name, writer.size, meta.name[:256])
        try:
            writer.commit()
        except BaseException:
            if new:  # no record without its blob either
                store.forget_model(tenant, sha256)
            raise
    logger.info("stored model %s (%s, %d bytes) for tenant %s", sha256, name, writer.size, tenant)
    return record
