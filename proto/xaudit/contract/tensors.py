"""numpy <-> the KServe v2 style ``Tensor`` message, with exact byte-length checks.

Used by the service (decoding requests, encoding results), the workers and the client library;
imports only numpy and the generated code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.v1 import audit_pb2

__all__ = ["DATATYPES", "decode_tensor", "encode_tensor"]

# KServe v2 datatype -> little-endian numpy dtype.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_NAMES: dict[tuple[str, int], str] = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()}


def encode_tensor(name: str, array: np.ndarray) -> audit_pb2.Tensor:
    arr = np.asarray(array)
    key = (arr.dtype.kind, arr.dtype.itemsize)
    if key not in _NAMES:
        raise InvalidInput(f"{name}: dtype {arr.dtype} has no tensor datatype")
    datatype = _NAMES[key]
    data = np.ascontiguousarray(arr, dtype=DATATYPES[datatype]).tobytes()
    return audit_pb2.Tensor(name=name, datatype=datatype, shape=list(arr.shape), raw_contents=data)


def decode_tensor(
    tensor: audit_pb2.Tensor,
    *,
    what: str | None = None,
    max_elements: int | None = None,
    max_dims: int | None = None,
    finite: bool = True,
) -> np.ndarray:
    """The array of ``tensor``; INVALID_ARGUMENT for unknown datatypes, bad shapes, a byte length that
    does not match the shape, or (``finite``) NaN/Inf; RESOURCE_EXHAUSTED above the caps."""
    label = what or f"tensor '{tensor.name}'"
    dtype = DATATYPES.get(tensor.datatype.upper())
    if dtype is None:
        raise InvalidInput(
            f"{label}: unknown datatype '{tensor.datatype}' (use one of {', '.join(DATATYPES)})"
        )
    shape: Sequence[int] = tuple(int(d) for d in tensor.shape)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"{label}: negative dimension in shape {list(shape)}")
    if max_dims is not None and len(shape) > max_dims:
        raise InvalidInput(f"{label}: {len(shape)} dimensions, at most {max_dims} are accepted")
    count = math.prod(shape)
    if max_elements is not None and count > max_elements:
        raise ResourceExhausted(f"{label}: {count} elements exceed the cap of {max_elements}")
    expected = count * dtype.itemsize
    got = len(tensor.raw_contents)
    if got != expected:
        raise InvalidInput(
            f"{label}: raw_contents has {got} bytes but shape {list(shape)} of {tensor.datatype.upper()} "
            f"needs {expected}"
        )
    try:
        array = np.frombuffer(tensor.raw_contents, dtype=dtype).reshape(shape)
    except ValueError:  # e.g. an empty shape with a dimension numpy cannot index (found by tests/fuzz)
        raise InvalidInput(f"{label}: shape {list(shape)} is not a valid array shape") from None
    if finite and dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidInput(f"{label} contains NaN or Inf")
    # Native byte order and writable: the compute core may modify in place.
    return array.astype(dtype.newbyteorder("="), copy=True)
