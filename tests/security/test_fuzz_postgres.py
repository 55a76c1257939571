"""Fuzzing a real server on a PostgreSQL store (hypothesis): 3,000+ requests of every AuditService and
WorkerService method, mostly malformed (NUL and control characters, absurd lengths, deep or huge
JSON numbers, odd ids and page tokens, broken uploads), and not one INTERNAL or UNKNOWN answer.

PostgreSQL is the store that refuses what SQLite lets through (NUL in text), so it is the one fuzzed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import ServerConfig
from service.server import Server, create_server
from tests.fuzz.test_request_fuzz import submit_requests
from tests.integration.service._helpers import inputs, mlp_onnx, upload
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2, audit_pb2_grpc, worker_pb2, worker_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS_PER_EXAMPLE = 3
EXAMPLES = 1000  # 3,000 requests
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

_any_text = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=st.sampled_from("ab\x00\x01\n\t\x7f\u00e9\U0001f600"), max_size=30),
    # Long text built, not drawn character by character (that would dominate the run's time).
    st.builds(lambda n, c: c * n, st.integers(4000, 4200), st.sampled_from("a\x00\u00e9")),
    st.just("a" * 5000),
)
_ids = st.one_of(_any_text, st.sampled_from(["", "0" * 32, "f" * 64]))


@pytest.fixture(scope="module")
def pg_server(
    tmp_path_factory: pytest.TempPathFactory, postgres_module_url: str
) -> Iterator[tuple[Server, str]]:
    home: Path = tmp_path_factory.mktemp("fuzz-pg")
    config = ServerConfig(
        listen="127.0.0.1:0",
        home=home,
        store_url=postgres_module_url,
        max_tensor_elements=1 << 16,
        sweep_seconds=60,
    )
    srv, _ = create_server(config, sender=lambda job, queue: None)
    srv.start()
    channel = grpc.insecure_channel(srv.address, options=[("grpc.max_send_message_length", 64 << 20)])
    sha = upload(audit_pb2_grpc.AuditServiceStub(channel), mlp_onnx())
    try:
        yield srv, sha, channel
    finally:
        channel.close()
        srv.stop(0)


@pytest.fixture(scope="module")
def postgres_module_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    from tests.integration.conftest import fresh_postgres, service_missing

    database = fresh_postgres("xaudit_fuzz")
    try:
        url = database.__enter__()
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL not reachable: {exc}")
    try:
        yield url
    finally:
        database.__exit__(None, None, None)


def _named_upload(name: str, fmt: int, declared: int, data: bytes) -> Iterator[audit_pb2.ModelChunk]:
    yield audit_pb2.ModelChunk(
        metadata=audit_pb2.ModelMetadata(format=fmt, declared_size=declared, name=name)
    )
    yield audit_pb2.ModelChunk(data=data)


_INPUTS = [encode_tensor("inputs", inputs(seed=0))]
_spec_text = st.one_of(
    st.sampled_from(["", "auto", "features", "grid:2x2", "zeros", "blur:2", "blur:1e308", "class:1", "cpu"]),
    _any_text,
)
_param = st.one_of(
    st.sampled_from(
        ["8", "-1", "1e308", "1e999", "NaN", "[1, 2]", "[[[1]]]", "9" * 19, "9" * 5000, '"x\u0000"']
    ),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(1, 3000)),
    _any_text,
)


_TEXT_FIELDS = ("players", "baseline", "target", "device", "idempotency_key", "explain", "embedding_tensor")


@st.composite
def light_submits(draw: st.DrawFn, sha: str) -> audit_pb2.SubmitRequest:
    """A valid request with one to three of its store-bound fields fuzzed (few draws: fast)."""
    req = audit_pb2.SubmitRequest(model_sha256=sha, inputs=_INPUTS, players="features", device="cpu")
    for field in draw(
        st.lists(st.sampled_from((*_TEXT_FIELDS, "params", "names", "numbers")), min_size=1, max_size=3)
    ):
        if field in _TEXT_FIELDS:
            setattr(req, field, draw(_spec_text))
        elif field == "params":
            name = draw(st.sampled_from(["integrated_gradients", "shapley_value", "lime", "x\x00"]))
            req.methods.append(
                audit_pb2.MethodSpec(
                    name=name, params={draw(st.sampled_from(["steps", "k\x00"])): draw(_param)}
                )
            )
        elif field == "names":
            req.group_names.extend(draw(st.lists(_any_text, max_size=2)))
        else:
            req.audit_order = draw(st.integers(-(2**31), 2**31 - 1))
            req.seed = draw(st.integers(-(2**63), 2**63 - 1))
            req.tolerances[draw(st.sampled_from(["coverage", "x\x00"]))] = draw(st.floats())
    return req


@st.composite
def calls(
    draw: st.DrawFn, sha: str
) -> tuple[str, Callable[[audit_pb2_grpc.AuditServiceStub, worker_pb2_grpc.WorkerServiceStub], object]]:
    kind = draw(st.sampled_from(["submit", "submit", "lookup", "list", "upload", "worker"]))
    if kind == "submit":
        # Mostly the fields that reach the store as text or numbers (cheap to draw); sometimes the full
        # malformed request of tests/fuzz (tensors too, which tests/fuzz covers at length).
        req = draw(
            st.one_of(light_submits(sha), light_submits(sha), light_submits(sha), submit_requests((sha,)))
        )
        if draw(st.booleans()):  # text with control characters or absurd length in a spec field
            setattr(
                req,
                draw(st.sampled_from(["players", "baseline", "target", "idempotency_key", "explain"])),
                draw(_any_text),
            )
        method = draw(st.sampled_from(["SubmitAudit", "SubmitAttribution"]))
        return method, lambda api, w: getattr(api, method)(req, timeout=30)
    if kind == "lookup":
        job_id = draw(_ids)
        method = draw(st.sampled_from(["GetJob", "CancelJob", "GetReport", "GetAttributions", "WatchJob"]))
        if method == "WatchJob":
            return method, lambda api, w: list(
                api.WatchJob(audit_pb2.WatchJobRequest(job_id=job_id), timeout=5)
            )
        request_type = {"GetJob": audit_pb2.GetJobRequest, "CancelJob": audit_pb2.CancelJobRequest,
                        "GetReport": audit_pb2.GetReportRequest, "GetAttributions": audit_pb2.GetAttributionsRequest}[method]  # fmt: skip
        return method, lambda api, w: getattr(api, method)(request_type(job_id=job_id), timeout=30)
    if kind == "list":
        req = audit_pb2.ListJobsRequest(
            page_size=draw(st.integers(-(2**31), 2**31 - 1)), page_token=draw(_any_text)
        )
        return "ListJobs", lambda api, w: api.ListJobs(req, timeout=30)
    if kind == "upload":
        name = draw(_any_text)
        fmt = draw(st.integers(-1, 3))
        data = draw(st.one_of(st.binary(max_size=64), st.just(_model())))
        declared = draw(st.one_of(st.just(len(data)), st.integers(-5, 1 << 40)))
        return "UploadModel", lambda api, w: api.UploadModel(
            _named_upload(name, fmt, declared, data), timeout=30
        )
    job_id, worker_id, secret, text = draw(_ids), draw(_any_text), draw(_any_text), draw(_any_text)
    method = draw(st.sampled_from(["FetchJob", "Heartbeat", "CompleteJob", "FailJob", "FetchBlob"]))
    requests = {
        "FetchJob": lambda: w_call("FetchJob", worker_pb2.FetchJobRequest(job_id=job_id, worker_id=worker_id)),
        "Heartbeat": lambda: w_call("Heartbeat", worker_pb2.HeartbeatRequest(
            job_id=job_id, worker_id=worker_id, progress=draw(st.floats()), message=text, lease_secret=secret)),
        "CompleteJob": lambda: w_call("CompleteJob", worker_pb2.CompleteJobRequest(
            job_id=job_id, worker_id=worker_id, report=text.encode(), lease_secret=secret,
            not_applicable={text[:10]: text})),
        "FailJob": lambda: w_call("FailJob", worker_pb2.FailJobRequest(
            job_id=job_id, worker_id=worker_id, code=text[:40], message=text, lease_secret=secret)),
        "FetchBlob": lambda: w_call("FetchBlob", worker_pb2.FetchBlobRequest(sha256=job_id)),
    }  # fmt: skip

    def w_call(
        name: str, req: object
    ) -> Callable[[audit_pb2_grpc.AuditServiceStub, worker_pb2_grpc.WorkerServiceStub], object]:
        if name == "FetchBlob":
            return lambda api, w: list(w.FetchBlob(req, timeout=30))
        return lambda api, w: getattr(w, name)(req, timeout=30)

    return method, requests[method]()


answered: list[grpc.StatusCode] = []


@functools.cache
def _model() -> bytes:
    return mlp_onnx()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_fuzzed_requests_on_postgresql_never_answer_internal(
    pg_server: tuple[Server, str], data: st.DataObject
) -> None:
    _, sha, channel = pg_server
    api, workers = audit_pb2_grpc.AuditServiceStub(channel), worker_pb2_grpc.WorkerServiceStub(channel)
    for _ in range(REQUESTS_PER_EXAMPLE):
        method, call = data.draw(calls(sha))
        try:
            call(api, workers)
            answered.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            answered.append(exc.code())
            assert exc.code() not in BAD, (method, exc.code(), exc.details())


def test_the_fuzz_run_was_at_least_3000_requests() -> None:
    if not answered:
        pytest.skip("the fuzz run did not run (no PostgreSQL)")
    assert len(answered) >= 3000
    assert grpc.StatusCode.INVALID_ARGUMENT in answered and grpc.StatusCode.OK in answered
