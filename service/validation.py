"""Protobuf requests -> domain objects, validated at the boundary (INVALID_ARGUMENT with a clear
one-line message for anything malformed; RESOURCE_EXHAUSTED for caps)."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from xaudit.contract.errors import InvalidInput, InvalidModel
from xaudit.contract.params import parse_param_text
from xaudit.contract.spec import ATTACHMENTS, FOURTEEN_METHODS, JobSpec
from xaudit.contract.tensors import decode_tensor
from xaudit.v1 import audit_pb2

__all__ = [
    "FORMAT_NAMES",
    "Submission",
    "check_input_names",
    "check_model",
    "format_from_proto",
    "format_to_proto",
    "page_size",
    "submission_from_request",
]

FORMAT_NAMES = {audit_pb2.MODEL_FORMAT_ONNX: "onnx", audit_pb2.MODEL_FORMAT_TORCHSCRIPT: "torchscript"}
_FORMAT_ENUMS = {name: value for value, name in FORMAT_NAMES.items()}
MAX_TENSOR_NAME = 64  # job_tensors.name (service.schema)


def format_from_proto(value: int) -> str | None:
    """``onnx``, ``torchscript``, or None (unspecified: detect from the bytes)."""
    if value == audit_pb2.MODEL_FORMAT_UNSPECIFIED:
        return None
    if value not in FORMAT_NAMES:
        raise InvalidInput(f"unknown model format enum value {value}")
    return FORMAT_NAMES[value]


def format_to_proto(name: str) -> int:
    return int(_FORMAT_ENUMS.get(name, audit_pb2.MODEL_FORMAT_UNSPECIFIED))


def _check_torchscript(data: bytes) -> None:
    # TorchScript can run code when loaded: never load it here; check the archive's structure only.
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError):
        raise InvalidModel("not a TorchScript archive (not a zip file)") from None
    roots = {n.split("/", 1)[0] for n in names if "/" in n}
    if len(roots) != 1:
        raise InvalidModel("not a TorchScript archive (expected one top-level folder)")
    root = roots.pop()
    wanted = {f"{root}/data.pkl", f"{root}/version"}
    if not wanted <= set(names) and not {f"{root}/data.pkl", f"{root}/.data/version"} <= set(names):
        raise InvalidModel("not a TorchScript archive (data.pkl or version record missing)")
    if not any(n.startswith(f"{root}/code/") for n in names):
        raise InvalidModel("not a TorchScript archive (no code/ folder: is this a plain torch.save file?)")


def check_model(data: bytes, fmt: str | None) -> str:
    """Validate untrusted model bytes without running them; returns the format name."""
    from xaudit.contract.onnx_checks import detect_format

    if not data:
        raise InvalidModel("the model is empty")
    name = fmt or detect_format(data)
    if name == "onnx":
        from xaudit.contract.onnx_checks import parse_onnx

        parse_onnx(data)
    elif name == "torchscript":
        _check_torchscript(data)
    else:
        raise InvalidInput(f"unknown model format '{name}' (use onnx or torchscript)")
    return name


def page_size(requested: int, default: int, largest: int) -> int:
    """ListJobs' page size: 0 means the default; larger than ``largest`` is clipped; negative is an error."""
    if requested < 0:
        raise InvalidInput(f"page_size {requested}: must be >= 0 (0: the default, {default})")
    return min(requested or default, largest)


@dataclass(frozen=True)
class Submission:
    spec: JobSpec
    tensors: dict[str, np.ndarray]
    idempotency_key: str  # empty: derive from the content


def _methods(request: audit_pb2.SubmitRequest) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    from xaudit.contract.spec import resolve_method_names

    if not request.methods:
        return FOURTEEN_METHODS, {}
    names = resolve_method_names([m.name for m in request.methods])
    params: dict[str, dict[str, Any]] = {}
    for m in request.methods:
        if m.params:
            if m.name.strip() in ("all", "all+extras"):
                raise InvalidInput(f"method '{m.name}': parameters belong to a single named method")
            params.setdefault(m.name.strip(), {}).update(
                {k: parse_param_text(f"{m.name.strip()}.{k}", v) for k, v in m.params.items()}
            )
    return names, params


def _inputs(request: audit_pb2.SubmitRequest, *, max_elements: int, max_dims: int) -> dict[str, np.ndarray]:
    """``inputs`` (the explained input) and ``input:NAME`` for every other named input (workers.inputs)."""
    from xaudit.contract.inputs import input_key

    explain = request.explain.strip()
    if not explain and len(request.inputs) != 1:
        raise InvalidInput(
            f"expected one input tensor, got {len(request.inputs)}; "
            "with several named inputs, set explain to the one whose units are the players"
        )
    names = [t.name for t in request.inputs]
    if explain:
        if any(not n for n in names) or len(set(names)) != len(names):
            raise InvalidInput(f"input tensors need distinct, non-empty names (the model's); got {names}")
        if explain not in names:
            raise InvalidInput(f"explain '{explain}' names no input given (inputs: {', '.join(names)})")
        too_long = [n for n in names if len(input_key(n)) > MAX_TENSOR_NAME]
        if too_long:
            raise InvalidInput(
                f"input names longer than {MAX_TENSOR_NAME - len(input_key(''))} characters: {too_long}"
            )
    tensors: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        label = f"input tensor '{tensor.name}'" if explain else "input tensor"
        array = decode_tensor(tensor, what=label, max_elements=max_elements, max_dims=max_dims)
        if array.ndim < 1 or array.size == 0:
            raise InvalidInput(f"{label} is empty (shape {list(array.shape)})")
        tensors["inputs" if not explain or tensor.name == explain else input_key(tensor.name)] = array
    return tensors


def check_input_names(submission: Submission, model_bytes: bytes) -> None:
    """Named inputs against the model's own input names (ONNX), so that a mismatch is answered at
    submission rather than by a failed job."""
    from xaudit.contract.inputs import check_names, held_inputs, onnx_input_names

    names = onnx_input_names(model_bytes)
    if names is not None and submission.spec.explain:
        check_names(names, submission.spec.explain, tuple(held_inputs(submission.tensors)))


def submission_from_request(
    request: audit_pb2.SubmitRequest, kind: str, *, max_elements: int, max_dims: int
) -> Submission:
    tensors = _inputs(request, max_elements=max_elements, max_dims=max_dims)
    for attachment in request.attachments:
        name = attachment.name
        if name not in ATTACHMENTS or name == "inputs":
            allowed = ", ".join(a for a in ATTACHMENTS if a != "inputs")
            raise InvalidInput(f"unknown attachment '{name}' (use {allowed})")
        if name in tensors:
            raise InvalidInput(f"attachment '{name}' given twice")
        tensors[name] = decode_tensor(
            attachment, what=f"attachment '{name}'", max_elements=max_elements, max_dims=max_dims
        )
    methods, params = _methods(request)
    # Every option is checked by the contract's JobSpec, as the CLI and the worker check it.
    spec = JobSpec(
        kind=kind,  # type: ignore[arg-type]
        players=request.players.strip() or "auto",
        baseline=request.baseline.strip() or "zeros",
        target=request.target.strip() or "predicted",
        methods=methods,
        method_params=params,
        audit_order=request.audit_order or 3,
        budget_evaluations=int(request.budget_evaluations),
        budget_seconds=float(request.budget_seconds),
        tolerances=dict(request.tolerances),
        confidence=float(request.confidence) or 0.95,
        seed=int(request.seed),
        device=request.device or "auto",
        group_names=tuple(request.group_names),
        explain=request.explain.strip(),
        embedding_tensor=request.embedding_tensor.strip(),
    )
    if spec.baseline_spec.kind == "tensor" and "baseline" not in tensors:
        raise InvalidInput("baseline 'tensor' needs a 'baseline' attachment")
    key = request.idempotency_key.strip()
    if len(key) > 128:
        raise InvalidInput("idempotency_key is longer than 128 characters")
    return Submission(spec, tensors, key)
