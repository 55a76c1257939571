"""Fuzzing request decoding and validation (hypothesis): malformed requests never crash the service
and never answer INTERNAL / UNKNOWN.

1. Two thousand SubmitRequests, mostly malformed, straight through the boundary validation
   (service.validation.submission_from_request): only the project's errors may come out.
2. A smaller set of the same requests over a real channel to a real server (recording sender, no
   broker): every status is a deliberate one.
3. Random bytes as the request message of every AuditService method, over the channel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import ServerConfig
from service.server import Server, create_server
from service.validation import submission_from_request
from tests.integration.service._helpers import mlp_onnx, stub, upload
from xaudit.contract.errors import XauditError
from xaudit.contract.spec import ATTACHMENTS, CRITERIA
from xaudit.contract.tensors import DATATYPES
from xaudit.v1 import audit_pb2

pytestmark = pytest.mark.integration

ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
MAX_ELEMENTS = 1 << 16

_text = st.text(max_size=40)
_datatypes = st.one_of(
    st.sampled_from(sorted(DATATYPES)), st.sampled_from(["fp32", "FP8", "", "STRING"]), _text
)
_dims = st.one_of(st.integers(0, 6), st.integers(-3, 1 << 40), st.just(2**62))
_shapes = st.lists(_dims, max_size=10)


@st.composite
def tensors(draw: st.DrawFn, name: str | None = None) -> audit_pb2.Tensor:
    datatype = draw(_datatypes)
    shape = draw(_shapes)
    dtype = DATATYPES.get(datatype.upper())
    count = math.prod(shape) if shape and all(d >= 0 for d in shape) else 0
    if dtype is not None and 0 < count <= 64 and draw(st.booleans()):
        raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        if dtype.kind == "f" and draw(st.booleans()):
            raw = np.random.default_rng(0).normal(size=count).astype(dtype).tobytes()
    else:
        raw = draw(st.binary(max_size=64))
    return audit_pb2.Tensor(
        name=name if name is not None else draw(_text), datatype=datatype, shape=shape, raw_contents=raw
    )


_players = st.one_of(
    st.sampled_from(["", "auto", "features", "grid:2x2", "grid:0x9", "groups", "mask", "grid:"]), _text
)
_baselines = st.one_of(
    st.sampled_from(
        ["", "zeros", "mean", "blur", "blur:-1", "constant:nan", "constant:1e400", "tensor", "tensor:x"]
    ),
    _text,
)
_targets = st.one_of(
    st.sampled_from(
        ["", "predicted", "class:3", "class:-1", "class:99999999999999999999", "prob", "logodds:x"]
    ),
    _text,
)
_methods = st.lists(
    st.builds(
        audit_pb2.MethodSpec,
        name=st.one_of(
            st.sampled_from(
                ["shapley_value", "integrated_gradients", "all", "all+extras", "lrp", " ", "nope"]
            ),
            _text,
        ),
        params=st.dictionaries(
            st.sampled_from(["steps", "samples", "epsilon", "x"]),
            st.one_of(st.sampled_from(["32", "-1", "1e99", "null", "[]", "{}", "nan"]), _text),
            max_size=3,
        ),
    ),
    max_size=4,
)


@st.composite
def valid_inputs(draw: st.DrawFn) -> list[audit_pb2.Tensor]:
    # One well-formed input, so the fuzzing reaches the checks behind the tensor checks.
    batch, features = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    x = np.random.default_rng(draw(st.integers(0, 9))).normal(size=(batch, features)).astype(np.float32)
    return [
        audit_pb2.Tensor(name="inputs", datatype="FP32", shape=[batch, features], raw_contents=x.tobytes())
    ]


@st.composite
def submit_requests(draw: st.DrawFn, model_shas: tuple[str, ...] = ()) -> audit_pb2.SubmitRequest:
    shas = st.one_of(st.sampled_from(model_shas or ("0" * 64,)), _text)
    attachments = st.lists(
        st.one_of(st.sampled_from(ATTACHMENTS), _text).flatmap(lambda n: tensors(name=n)), max_size=3
    )
    return audit_pb2.SubmitRequest(
        model_sha256=draw(shas),
        inputs=draw(st.one_of(valid_inputs(), st.lists(tensors(), max_size=2))),
        players=draw(_players),
        baseline=draw(_baselines),
        target=draw(_targets),
        methods=draw(_methods),
        audit_order=draw(st.integers(-(2**31), 2**31 - 1)),
        tolerances=draw(
            st.dictionaries(
                st.one_of(st.sampled_from(CRITERIA), _text), st.floats(allow_nan=True), max_size=4
            )
        ),
        seed=draw(st.integers(-(2**63), 2**63 - 1)),
        device=draw(st.one_of(st.sampled_from(["", "cpu", "cuda", "cuda:7", "tpu", "AUTO"]), _text)),
        attachments=draw(attachments),
        group_names=draw(st.lists(_text, max_size=3)),
        idempotency_key=draw(st.one_of(_text, st.text(min_size=120, max_size=200))),
    )


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=submit_requests(), kind=st.sampled_from(["audit", "attribution"]))
def test_validation_raises_only_project_errors(request: audit_pb2.SubmitRequest, kind: str) -> None:
    try:
        submission = submission_from_request(request, kind, max_elements=MAX_ELEMENTS, max_dims=8)
    except XauditError as exc:
        assert exc.code != "INTERNAL"
        assert "\n" not in str(exc)
        return
    # Accepted: the result is a usable submission within the caps.
    inputs = submission.tensors["inputs"]
    assert inputs.size > 0 and inputs.size <= MAX_ELEMENTS
    assert all(np.isfinite(a).all() for a in submission.tensors.values() if a.dtype.kind == "f")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    home: Path = tmp_path_factory.mktemp("fuzz")
    config = ServerConfig(listen="127.0.0.1:0", home=home, max_tensor_elements=MAX_ELEMENTS, sweep_seconds=60)
    srv, _ = create_server(config, sender=lambda job, queue: None)
    srv.start()
    sha = upload(stub(srv.address), mlp_onnx())
    try:
        yield srv, sha
    finally:
        srv.stop(0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_submissions_over_the_channel(fuzz_server: tuple[Server, str], data: st.DataObject) -> None:
    srv, sha = fuzz_server
    api = stub(srv.address)
    request = data.draw(submit_requests((sha,)))
    call = data.draw(st.sampled_from([api.SubmitAudit, api.SubmitAttribution]))
    try:
        job = call(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, (exc.code(), exc.details())
        return
    assert job.id and job.state == audit_pb2.JOB_STATE_QUEUED


_METHODS = [m.name for m in audit_pb2.DESCRIPTOR.services_by_name["AuditService"].methods]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(_METHODS), payload=st.binary(max_size=200))
def test_random_bytes_as_requests(fuzz_server: tuple[Server, str], method: str, payload: bytes) -> None:
    srv, _ = fuzz_server
    with grpc.insecure_channel(srv.address) as channel:
        path = f"/xaudit.v1.AuditService/{method}"
        spec = audit_pb2.DESCRIPTOR.services_by_name["AuditService"].methods_by_name[method]
        try:
            if spec.client_streaming:
                reply = channel.stream_unary(path)(iter([payload, payload]), timeout=30)
            elif spec.server_streaming:
                reply = list(channel.unary_stream(path)(payload, timeout=5))
            else:
                reply = channel.unary_unary(path)(payload, timeout=30)
        except grpc.RpcError as exc:
            # WatchJob on a job that happens to parse may run to its deadline: a deliberate answer too.
            assert exc.code() in ALLOWED | {grpc.StatusCode.DEADLINE_EXCEEDED}, (
                method,
                exc.code(),
                exc.details(),
            )
            return
    assert reply is not None
