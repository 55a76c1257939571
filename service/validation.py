"""Protobuf requests -> domain objects, validated at the boundary (INVALID_ARGUMENT with a clear
one-line message for anything malformed; RESOURCE_EXHAUSTED for caps)."""

from __future__ import annotations

import io
import json
import math
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.text import shown
from xaudit.contract.errors import InvalidInput, InvalidModel
from xaudit.contract.spec import ATTACHMENTS, CRITERIA, DEFAULT_TOLERANCES, FOURTEEN_METHODS, JobSpec
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
MAX_AUDIT_ORDER = 16
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
    from workers.onnx_checks import detect_format

    if not data:
        raise InvalidModel("the model is empty")
    name = fmt or detect_format(data)
    if name == "onnx":
        from workers.onnx_checks import parse_onnx

        parse_onnx(data)
    elif name == "torchscript":
        _check_torchscript(data)
    else:
        raise InvalidInput(f"unknown model format '{name}' (use onnx or torchscript)")
    return name


MAX_BLUR_SIGMA = 1e4  # pixels: far past any image's size, far from float overflow


def _baseline(text: str) -> str:
    """Numbers inside a baseline spec, bounded before the job is recorded (the worker parses the
    rest): a finite constant, a positive bounded blur sigma, a token id that fits an int64."""
    kind, _, arg = text.partition(":")
    kind = kind.lower()
    try:
        if kind == "blur" and arg:
            sigma = float(arg)
            if not (math.isfinite(sigma) and 0 < sigma <= MAX_BLUR_SIGMA):
                raise InvalidInput(f"baseline '{shown(text)}': sigma must be in (0, {MAX_BLUR_SIGMA:g}]")
        elif kind == "constant":
            if not math.isfinite(float(arg)):
                raise InvalidInput(f"baseline '{shown(text)}': the constant must be a finite number")
        elif kind == "token":
            _bounded_int(arg)
    except InvalidInput as exc:
        raise InvalidInput(f"baseline '{shown(text)}': {exc}") from None
    except ValueError:
        raise InvalidInput(f"baseline '{shown(text)}': '{shown(arg, 24)}' is not a number") from None
    return text


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


MAX_BUDGET_EVALUATIONS = 10**15  # model rows; far above any audit a worker finishes
MAX_BUDGET_SECONDS = 7 * 24 * 3600.0
MAX_PARAM_TEXT = 256  # one method parameter's JSON text
MAX_PARAM_DEPTH = 2  # a list of numbers at most: parameters are scalars or short lists
MAX_INT_DIGITS = 18  # fits an int64 column and every loop bound


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidInput(f"integer {shown(text, 24)} has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidInput(f"number {shown(text, 24)} is not finite")
    return value


def _depth(text: str) -> int:
    """Bracket nesting of JSON text, counted before parsing (a deep document never reaches json)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _param_value(name: str, text: str) -> Any:
    if len(text) > MAX_PARAM_TEXT:
        raise InvalidInput(f"parameter {name}: {len(text)} characters; the limit is {MAX_PARAM_TEXT}")
    if _depth(text) > MAX_PARAM_DEPTH:
        raise InvalidInput(f"parameter {name}: nested deeper than {MAX_PARAM_DEPTH} levels")
    try:
        return json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=lambda c: _finite_float(c),
        )
    except json.JSONDecodeError:
        return text
    except InvalidInput as exc:
        raise InvalidInput(f"parameter {name}: {exc}") from None


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
                {k: _param_value(f"{m.name.strip()}.{k}", v) for k, v in m.params.items()}
            )
    return names, params


def _tolerances(request: audit_pb2.SubmitRequest) -> dict[str, float]:
    tolerances = dict(DEFAULT_TOLERANCES)
    for name, value in request.tolerances.items():
        if name not in CRITERIA:
            raise InvalidInput(f"unknown tolerance '{name}' (criteria: {', '.join(CRITERIA)})")
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(f"tolerance {name}={value}: must be a finite number >= 0")
        tolerances[name] = float(value)
    return tolerances


def _device(text: str) -> str:
    device = (text or "auto").strip().lower()
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise InvalidInput(f"unknown device '{text}' (use auto, cpu or cuda)")
    return device


def _inputs(request: audit_pb2.SubmitRequest, *, max_elements: int, max_dims: int) -> dict[str, np.ndarray]:
    """``inputs`` (the explained input) and ``input:NAME`` for every other named input (workers.inputs)."""
    from workers.inputs import input_key

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
    from workers.inputs import check_names, held_inputs, onnx_input_names

    names = onnx_input_names(model_bytes)
    if names is not None and submission.spec.explain:
        check_names(names, submission.spec.explain, tuple(held_inputs(submission.tensors)))


def submission_from_request(
    request: audit_pb2.SubmitRequest, kind: str, *, max_elements: int, max_dims: int
) -> Submission:
    from workers.targets import parse_target

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
    baseline = _baseline(request.baseline.strip() or "zeros")
    if baseline.split(":", 1)[0].lower() == "tensor" and "baseline" not in tensors:
        raise InvalidInput("baseline 'tensor' needs a 'baseline' attachment")
    target = request.target.strip() or "predicted"
    parse_target(target)
    methods, params = _methods(request)
    order = request.audit_order or 3
    if not 1 <= order <= MAX_AUDIT_ORDER:
        raise InvalidInput(f"audit_order {order}: must be between 1 and {MAX_AUDIT_ORDER}")
    if not 0 <= request.budget_evaluations <= MAX_BUDGET_EVALUATIONS:
        raise InvalidInput(f"budget_evaluations must be between 0 and {MAX_BUDGET_EVALUATIONS}")
    if not (math.isfinite(request.budget_seconds) and 0 <= request.budget_seconds <= MAX_BUDGET_SECONDS):
        raise InvalidInput(f"budget_seconds must be between 0 and {MAX_BUDGET_SECONDS:g}")
    spec = JobSpec(
        kind=kind,  # type: ignore[arg-type]
        players=request.players.strip() or "auto",
        baseline=baseline,
        target=target,
        methods=methods,
        method_params=params,
        audit_order=order,
        budget_evaluations=int(request.budget_evaluations),
        budget_seconds=float(request.budget_seconds),
        tolerances=_tolerances(request),
        seed=int(request.seed),
        device=_device(request.device),
        group_names=tuple(request.group_names),
        explain=request.explain.strip(),
        embedding_tensor=request.embedding_tensor.strip(),
    )
    key = request.idempotency_key.strip()
    if len(key) > 128:
        raise InvalidInput("idempotency_key is longer than 128 characters")
    return Submission(spec, tensors, key)
