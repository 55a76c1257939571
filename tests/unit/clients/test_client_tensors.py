"""numpy <-> Tensor as the client sends and reads it: dtypes, byte order, exact byte lengths."""

from __future__ import annotations

import numpy as np
import pytest

from clients._requests import spec_with_options, submit_request
from clients._types import AttributionResult
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec
from xaudit.contract.tensors import decode_tensor, encode_tensor
from xaudit.v1 import audit_pb2

DTYPES = ["?", "u1", "<u2", "<u4", "<u8", "i1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8"]


@pytest.mark.parametrize("dtype", [*DTYPES, ">u2", ">i4", ">f4", ">f8"])
def test_round_trip_keeps_values_dtype_and_shape(dtype: str) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2 if dtype == "?" else 100, size=(2, 3, 4))
    array = values.astype(dtype)
    back = decode_tensor(encode_tensor("inputs", array))
    assert back.shape == (2, 3, 4)
    assert back.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(back, array)


def test_wire_bytes_are_little_endian_c_order_whatever_the_source_layout() -> None:
    big_fortran = np.asfortranarray(np.arange(6, dtype=">f4").reshape(2, 3))
    msg = encode_tensor("x", big_fortran)
    assert msg.datatype == "FP32" and list(msg.shape) == [2, 3]
    assert msg.raw_contents == np.arange(6, dtype="<f4").tobytes()
    assert msg.raw_contents[:8] == b"\x00\x00\x00\x00\x00\x00\x80\x3f"  # 0.0, 1.0 little-endian


def test_byte_length_that_does_not_match_the_shape_is_invalid() -> None:
    msg = audit_pb2.Tensor(name="inputs", datatype="FP32", shape=[2, 2], raw_contents=b"\x00" * 12)
    with pytest.raises(InvalidInput, match=r"12 bytes.*needs 16"):
        decode_tensor(msg)


def test_unsupported_dtypes_are_refused_before_sending() -> None:
    with pytest.raises(InvalidInput, match="complex"):
        encode_tensor("inputs", np.zeros(3, dtype=np.complex64))


def test_results_with_nan_are_read_as_sent() -> None:
    # A NaN in an attribution map is a finding to show, not a transport error.
    nan_map = np.array([[np.nan, 1.0]], dtype=np.float32)
    msg = audit_pb2.Attributions(
        attributions=[encode_tensor("saliency", nan_map)], not_applicable={"grad_cam": "no conv"}
    )
    msg.target_classes.CopyFrom(encode_tensor("target_classes", np.array([3], dtype=np.int64)))
    result = AttributionResult.from_proto(msg)
    assert np.isnan(result.attributions["saliency"][0, 0])
    assert result.not_applicable == {"grad_cam": "no conv"}
    assert result.target_values is None and result.target_classes is not None
    assert result.target_classes.tolist() == [3]


def test_submit_request_carries_spec_and_attachments() -> None:
    spec = JobSpec(
        kind="audit",
        players="grid:2x4",
        methods=("integrated_gradients", "occlusion_1"),
        method_params={"integrated_gradients": {"steps": 32, "quadrature": "riemann_left"}},
        audit_order=2,
        seed=7,
        device="cpu",
    )
    x = np.ones((1, 1, 8, 8), dtype=np.float32)
    bg = np.zeros((4, 1, 8, 8), dtype=np.float64)
    req = submit_request("ab" * 32, spec, {"inputs": x, "background": bg}, "key-1")
    assert req.model_sha256 == "ab" * 32 and req.idempotency_key == "key-1"
    assert [t.name for t in req.inputs] == ["inputs"]
    assert [(t.name, t.datatype) for t in req.attachments] == [("background", "FP64")]
    assert [m.name for m in req.methods] == ["integrated_gradients", "occlusion_1"]
    assert dict(req.methods[0].params) == {"steps": "32", "quadrature": '"riemann_left"'}
    assert (req.players, req.audit_order, req.seed, req.device) == ("grid:2x4", 2, 7, "cpu")
    assert dict(req.tolerances) == dict(spec.tolerances)


def test_submit_request_refuses_unknown_tensors_and_missing_inputs() -> None:
    x = np.ones((1, 3), dtype=np.float32)
    with pytest.raises(InvalidInput, match="unknown tensor names"):
        submit_request("0" * 64, JobSpec(), {"inputs": x, "weights": x})
    with pytest.raises(InvalidInput, match="'inputs' tensor"):
        submit_request("0" * 64, JobSpec(), {"background": x})


def test_keyword_options_split_into_spec_fields_and_tensors() -> None:
    x = np.ones((1, 3), dtype=np.float32)
    spec, tensors = spec_with_options(
        None, None, "attribution", {"inputs": x, "methods": "saliency, occlusion_1", "seed": 3}
    )
    assert spec.kind == "attribution" and spec.methods == ("saliency", "occlusion_1") and spec.seed == 3
    assert spec.device == "auto"
    assert set(tensors) == {"inputs"}
    with pytest.raises(TypeError, match="colour"):
        spec_with_options(None, None, "audit", {"colour": "red"})
