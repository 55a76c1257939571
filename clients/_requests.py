"""JobSpec + named tensors -> SubmitRequest, and model files -> UploadModel chunk streams."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from xaudit.contract.errors import InvalidInput
from xaudit.contract.inputs import held_inputs, input_key
from xaudit.contract.spec import ATTACHMENTS, JobSpec
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2

__all__ = ["CHUNK_SIZE", "guess_format", "model_chunks", "read_head", "spec_with_options", "submit_request"]

CHUNK_SIZE = 1 << 20  # 1 MiB: the top of the service's accepted chunk range, fewest messages

_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(JobSpec))
_FORMATS = {"onnx": audit_pb2.MODEL_FORMAT_ONNX, "torchscript": audit_pb2.MODEL_FORMAT_TORCHSCRIPT}


def spec_with_options(
    spec: JobSpec | None, tensors: Mapping[str, np.ndarray] | None, kind: str, options: Mapping[str, Any]
) -> tuple[JobSpec, dict[str, np.ndarray]]:
    """Merge keyword options into a spec (JobSpec fields) and the tensors (attachment names)."""
    out_tensors = {name: np.asarray(arr) for name, arr in (tensors or {}).items()}
    fields: dict[str, Any] = {"kind": kind}
    for key, value in options.items():
        if key in ATTACHMENTS:
            out_tensors[key] = np.asarray(value)
        elif key in _SPEC_FIELDS and key != "kind":
            fields[key] = value
        else:
            raise TypeError(f"unknown job option '{key}'")
    if isinstance(fields.get("methods"), str):
        fields["methods"] = tuple(m.strip() for m in fields["methods"].split(",") if m.strip())
    elif "methods" in fields:
        fields["methods"] = tuple(fields["methods"])
    base = spec if spec is not None else JobSpec(device="auto")
    return dataclasses.replace(base, **fields), out_tensors


def submit_request(
    model_sha256: str, spec: JobSpec, tensors: Mapping[str, np.ndarray], idempotency_key: str = ""
) -> audit_pb2.SubmitRequest:
    held = held_inputs(tensors)  # input:NAME, the other inputs of a several-input model
    unknown = sorted(set(tensors) - set(ATTACHMENTS) - {input_key(n) for n in held})
    if unknown:
        raise InvalidInput(
            f"unknown tensor names {unknown}; expected some of {', '.join(ATTACHMENTS)}, or input:NAME"
        )
    if "inputs" not in tensors:
        raise InvalidInput("a job needs an 'inputs' tensor (batch axis first)")
    if held and not spec.explain:
        raise InvalidInput("several named inputs: set explain to the one whose units are the players")
    methods = [
        audit_pb2.MethodSpec(
            name=name,
            params={key: json.dumps(value) for key, value in spec.method_params.get(name, {}).items()},
        )
        for name in spec.methods
    ]
    stray = sorted(set(spec.method_params) - set(spec.methods))
    if stray:
        raise InvalidInput(f"parameters given for methods that are not requested: {', '.join(stray)}")
    return audit_pb2.SubmitRequest(
        model_sha256=model_sha256,
        inputs=[
            encode_tensor(spec.explain or "inputs", tensors["inputs"]),
            *(encode_tensor(name, array) for name, array in held.items()),
        ],
        players=spec.players,
        baseline=spec.baseline,
        target=spec.target,
        methods=methods,
        audit_order=spec.audit_order,
        budget_evaluations=spec.budget_evaluations,
        budget_seconds=spec.budget_seconds,
        confidence=spec.confidence,
        tolerances={k: float(v) for k, v in spec.tolerances.items()},
        seed=spec.seed,
        device=spec.device,
        attachments=[
            encode_tensor(name, tensors[name]) for name in ATTACHMENTS if name != "inputs" and name in tensors
        ],
        group_names=list(spec.group_names),
        idempotency_key=idempotency_key,
        explain=spec.explain,
        embedding_tensor=spec.embedding_tensor,
    )


def guess_format(head: bytes, name: str = "") -> str:
    """onnx or torchscript, from the file name, else from the first bytes (TorchScript files are zips)."""
    lowered = name.lower()
    if lowered.endswith(".onnx"):
        return "onnx"
    if lowered.endswith((".pt", ".pth", ".ts", ".torchscript")):
        return "torchscript"
    return "torchscript" if head.startswith(b"PK\x03\x04") else "onnx"


def model_chunks(source: BinaryIO | bytes, size: int, fmt: str, name: str) -> Iterator[audit_pb2.ModelChunk]:
    """The UploadModel stream: metadata first, then data in CHUNK_SIZE pieces, read lazily."""
    if fmt not in _FORMATS:
        raise InvalidInput(f"unknown model format '{fmt}'; use onnx or torchscript")
    yield audit_pb2.ModelChunk(
        metadata=audit_pb2.ModelMetadata(format=_FORMATS[fmt], declared_size=size, name=name)
    )
    if isinstance(source, bytes):
        view = memoryview(source)
        for start in range(0, len(view), CHUNK_SIZE):
            yield audit_pb2.ModelChunk(data=bytes(view[start : start + CHUNK_SIZE]))
        return
    while chunk := source.read(CHUNK_SIZE):
        yield audit_pb2.ModelChunk(data=chunk)


def read_head(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(4)
