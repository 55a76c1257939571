"""Protobuf -> domain at the boundary: defaults, JSON parameters, refused values, model checks."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch

from service.validation import check_model, submission_from_request
from xaudit.contract.errors import InvalidInput, InvalidModel
from xaudit.contract.spec import DEFAULT_TOLERANCES, FOURTEEN_METHODS
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2

CAPS = {"max_elements": 1 << 20, "max_dims": 8}


def _req(**fields: object) -> audit_pb2.SubmitRequest:
    x = encode_tensor("x", np.ones((2, 6), np.float32))
    return audit_pb2.SubmitRequest(model_sha256="a" * 64, inputs=[x], **fields)


def test_empty_fields_take_the_documented_defaults() -> None:
    sub = submission_from_request(_req(), "audit", **CAPS)
    spec = sub.spec
    assert spec.methods == FOURTEEN_METHODS and spec.audit_order == 3
    assert (spec.players, spec.baseline, spec.target, spec.device) == ("auto", "zeros", "predicted", "auto")
    assert dict(spec.tolerances) == dict(DEFAULT_TOLERANCES) and sub.idempotency_key == ""
    assert sub.tensors["inputs"].shape == (2, 6)
    assert spec.confidence == 0.95
    assert submission_from_request(_req(confidence=0.99), "audit", **CAPS).spec.confidence == 0.99


def test_method_params_are_json_values() -> None:
    methods = [
        audit_pb2.MethodSpec(
            name="integrated_gradients", params={"steps": "32", "quadrature": "riemann_left"}
        )
    ]
    spec = submission_from_request(_req(methods=methods), "attribution", **CAPS).spec
    assert spec.methods == ("integrated_gradients",)
    assert spec.method_params == {"integrated_gradients": {"steps": 32, "quadrature": "riemann_left"}}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tolerances": {"beauty": 0.1}}, "unknown tolerance 'beauty'"),
        ({"tolerances": {"coverage": -1.0}}, "must be a finite number between 0 and 1"),
        ({"audit_order": 40}, "audit order 40"),
        ({"confidence": 1.5}, "confidence 1.5: must be a level between 0.5 and 1"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"baseline": "tensor"}, "needs a 'baseline' attachment"),
        ({"target": "nonsense:3"}, "target"),
        ({"methods": [audit_pb2.MethodSpec(name="all", params={"steps": "3"})]}, "single named method"),
    ],
)
def test_refused_values_name_the_problem(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        submission_from_request(_req(**fields), "audit", **CAPS)


def test_torchscript_is_checked_as_an_archive_never_loaded() -> None:
    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(2)}, buffer)  # a zip, but not TorchScript (no code/)
    with pytest.raises(InvalidModel, match=r"plain torch\.save"):
        check_model(buffer.getvalue(), "torchscript")
    plain = io.BytesIO()
    with zipfile.ZipFile(plain, "w") as archive:
        archive.writestr("a.txt", "hello")
    with pytest.raises(InvalidModel, match="TorchScript archive"):
        check_model(plain.getvalue(), "torchscript")
    with pytest.raises(InvalidModel, match="empty"):
        check_model(b"", None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[" * 5000 + "]" * 5000, "characters"),  # a RecursionError in json without the checks
        ("[" * 100 + "]" * 100, "nested deeper"),
        ("[[[1]]]", "nested deeper"),
        ("9" * 5000, "characters"),  # Python refuses to parse 4300+ digits: ValueError without the check
        ("9" * 40, "more than 18 digits"),
        ("1e999", "not finite"),
        ("NaN", "not finite"),
    ],
)
def test_absurd_method_parameters_are_invalid_input(value: str, message: str) -> None:
    methods = [audit_pb2.MethodSpec(name="integrated_gradients", params={"steps": value})]
    with pytest.raises(InvalidInput, match=message):
        submission_from_request(_req(methods=methods), "attribution", **CAPS)


@pytest.mark.parametrize(
    "baseline", ["blur:1e308", "blur:inf", "blur:-1", "constant:1e400", "token:" + "9" * 30]
)
def test_absurd_baseline_numbers_are_invalid_input(baseline: str) -> None:
    with pytest.raises(InvalidInput, match="baseline"):
        submission_from_request(_req(baseline=baseline), "audit", **CAPS)


def test_request_text_guard_refuses_nul_and_absurd_lengths() -> None:
    from service.text import check_message_text

    check_message_text(_req(players="grid:2x2", methods=[audit_pb2.MethodSpec(name="saliency")]))
    for bad in (
        _req(players="grid\x002x2"),
        _req(group_names=["a", "b\x00"]),
        _req(methods=[audit_pb2.MethodSpec(name="saliency", params={"k\x00": "1"})]),
        _req(idempotency_key="k" * 10_000),
    ):
        with pytest.raises(InvalidInput):
            check_message_text(bad)
