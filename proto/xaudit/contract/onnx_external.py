"""Inline an ONNX model's external data (``model.onnx`` + ``model.onnx.data``) from its own directory.

torch.onnx.export writes weights beside the graph by default. The CLI and the client library read
those side files here, on the user's machine, and send one self-contained model: the service and
workers never open a path named inside a model (xaudit.contract.onnx_checks refuses external references).
Side files must lie in the model's directory tree, be regular files reached without symlinks, and
stay under a size cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

import onnx

from xaudit.contract.errors import InvalidModel, ResourceExhausted
from xaudit.contract.onnx_checks import external_tensors

__all__ = ["MAX_INLINED_BYTES", "inline_external_data"]

# A serialised protobuf message cannot exceed 2 GiB; keep headroom for the graph itself.
MAX_INLINED_BYTES = 1900 * 1024 * 1024


def _side_file(root: Path, location: str, tensor: str) -> Path:
    """``location`` resolved inside ``root``; refused when absolute, escaping, or through a symlink."""
    rel = PurePosixPath(location.replace("\\", "/"))
    if not location or rel.is_absolute() or ".." in rel.parts or ":" in location:
        raise InvalidModel(
            f"ONNX tensor '{tensor}' names external data at '{location}': only files inside the model's "
            "own directory are read"
        )
    path = root
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise InvalidModel(f"ONNX external data '{location}' goes through a symlink ({path}); refused")
    return path


def _read_range(path: Path, offset: int, length: int | None, location: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise InvalidModel(
            f"the model's external data file '{location}' is missing: keep it next to the .onnx file"
        ) from None
    except OSError as exc:
        raise InvalidModel(
            f"the model's external data file '{location}' cannot be read ({exc.strerror})"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InvalidModel(f"the model's external data '{location}' is not a regular file")
        end = info.st_size if length is None else offset + length
        if offset < 0 or end > info.st_size:
            raise InvalidModel(
                f"the model's external data '{location}' is {info.st_size} bytes; the model reads bytes "
                f"{offset}..{end}: the .onnx and its data file do not belong together"
            )
        handle.seek(offset)
        return handle.read(end - offset)


def inline_external_data(path: Path, data: bytes, max_bytes: int = MAX_INLINED_BYTES) -> bytes:
    """``data`` (the bytes of ``path``) with every external tensor read in; unchanged without any."""
    try:
        model = onnx.load_model_from_string(data)
    except Exception:
        return data  # not ONNX, or unreadable: the loader says so
    tensors = external_tensors(model)
    if not tensors:
        return data
    root = path.absolute().parent
    total = 0
    for tensor in tensors:
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        side = _side_file(root, location, tensor.name)
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise InvalidModel(
                f"ONNX tensor '{tensor.name}' has a malformed external data offset or length"
            ) from None
        if length is not None:
            total += length
        if total > max_bytes:
            raise ResourceExhausted(
                f"the model's external data exceeds {max_bytes // 2**20} MiB, the most one model message can hold"
            )
        raw = _read_range(side, offset, length, location)
        total += 0 if length is not None else len(raw)
        if total > max_bytes:
            raise ResourceExhausted(
                f"the model's external data exceeds {max_bytes // 2**20} MiB, the most one model message can hold"
            )
        tensor.raw_data = raw
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return model.SerializeToString()
