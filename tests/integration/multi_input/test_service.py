"""Named inputs through the service: the boundary answers INVALID_ARGUMENT for names that do not fit
the model; `xaudit submit` audits an image + tabular model, a recurrent model with a held state and
a token classifier end to end on a real embedded server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from clients._report import report_document
from service.config import ServerConfig
from service.server import Server
from tests.integration.conftest import Service, start_serve, stop_process
from tests.integration.service._helpers import serving, stub, upload
from tests.unit.multi_input.models import NEGATION_VOCAB, image_tabular, negation_classifier, recurrent
from xaudit.contract.spec import FOURTEEN_METHODS
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
XAUDIT = Path(sys.executable).with_name("xaudit")


@pytest.fixture
def boundary(tmp_path: Path) -> Iterator[tuple[Server, list[tuple[str, str]]]]:
    sent: list[tuple[str, str]] = []
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path, sweep_seconds=0.2)
    with serving(config, sender=lambda job, queue: sent.append((job, queue))) as srv:
        yield srv, sent


def _request(sha: str, tensors: dict[str, np.ndarray], explain: str) -> audit_pb2.SubmitRequest:
    return audit_pb2.SubmitRequest(
        model_sha256=sha,
        inputs=[encode_tensor(name, array) for name, array in tensors.items()],
        players="grid:2x2",
        device="cpu",
        explain=explain,
        methods=[audit_pb2.MethodSpec(name="occlusion_1")],
    )


def test_named_inputs_that_do_not_fit_the_model_are_invalid_argument(boundary) -> None:  # type: ignore[no-untyped-def]
    api = stub(boundary[0].address)
    sha = upload(api, image_tabular()[0])
    image = np.zeros((2, 1, 8, 8), np.float32)
    clinical = np.zeros((2, 4), np.float32)
    cases = [
        ({"image": image, "clinical": clinical}, "scan", "explain 'scan' names no input given"),
        ({"image": image, "age": clinical}, "image", "has no input named 'age'"),
        ({"image": image}, "image", "missing required input 'clinical'"),
        ({"image": image, "clinical": clinical}, "", "set explain to the one whose units are the players"),
    ]
    for tensors, explain, message in cases:
        with pytest.raises(grpc.RpcError) as info:
            api.SubmitAudit(_request(sha, tensors, explain), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, explain
        assert message in info.value.details() and "\n" not in info.value.details()
    assert not api.ListJobs(audit_pb2.ListJobsRequest(), timeout=10).jobs  # nothing was recorded
    job = api.SubmitAudit(_request(sha, {"image": image, "clinical": clinical}, "image"), timeout=10)
    assert job.state == audit_pb2.JOB_STATE_QUEUED
    deadline = time.monotonic() + 10  # dispatch runs beside the answer
    while not boundary[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [j for j, _ in boundary[1]] == [job.id]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_serve(tmp_path_factory.mktemp("multi-input-home"))
    try:
        yield svc
    finally:
        stop_process(svc.proc)


def _submit(service: Service, tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "report.json"
    env = dict(os.environ, XAUDIT_SERVER=service.address)
    run = subprocess.run(
        [str(XAUDIT), "submit", *args, "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    document: dict = report_document(out.read_bytes())  # type: ignore[type-arg]
    return document


def _verdicts(report: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    methods = {m["name"]: m for m in report["methods"]}
    assert set(methods) == set(FOURTEEN_METHODS)
    for name, entry in methods.items():
        assert entry["verdict"] != "not_applicable" or entry["reason"], name
    return methods


def test_image_and_tabular_model_through_submit(service: Service, tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(image_tabular()[0])
    rng = np.random.default_rng(4)
    np.save(tmp_path / "image.npy", rng.random((2, 1, 8, 8), dtype=np.float32))
    np.save(tmp_path / "clinical.npy", rng.random((2, 4), dtype=np.float32))
    np.save(tmp_path / "background.npy", rng.random((2, 1, 8, 8), dtype=np.float32))
    report = _submit(
        service, tmp_path, "--model", str(tmp_path / "m.onnx"),
        "--input", f"image={tmp_path / 'image.npy'}", "--input", f"clinical={tmp_path / 'clinical.npy'}",
        "--explain", "image", "--players", "grid:2x2", "--background", str(tmp_path / "background.npy"),
    )  # fmt: skip
    methods = _verdicts(report)
    assert report["model"]["input_name"] == "image"
    assert methods["integrated_gradients"]["verdict"] == "reliable"
    assert "complete_allocation" in methods["occlusion_1"]["failing_criteria"]


def test_recurrent_model_with_state_through_submit(service: Service, tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(recurrent()[0])
    rng = np.random.default_rng(5)
    np.save(tmp_path / "signal.npy", rng.normal(size=(2, 1, 16)).astype(np.float32))
    np.save(tmp_path / "state.npy", rng.normal(size=(2, 8)).astype(np.float32))
    np.save(tmp_path / "background.npy", rng.normal(size=(2, 1, 16)).astype(np.float32))
    report = _submit(
        service, tmp_path, "--model", str(tmp_path / "m.onnx"),
        "--input", f"signal={tmp_path / 'signal.npy'}", "--input", f"state={tmp_path / 'state.npy'}",
        "--explain", "signal", "--players", "windows:4", "--target", "output:speech[0]",
        "--background", str(tmp_path / "background.npy"),
    )  # fmt: skip
    methods = _verdicts(report)
    assert [p["name"] for p in report["game"]["players"]] == ["[0:4)", "[4:8)", "[8:12)", "[12:16)"]
    assert methods["integrated_gradients"]["verdict"] == "reliable"


def test_token_classifier_through_submit(service: Service, tmp_path: Path) -> None:
    data, _, accuracy = negation_classifier(epochs=40)
    assert accuracy == 1.0
    (tmp_path / "m.onnx").write_bytes(data)
    index = {w: i for i, w in enumerate(NEGATION_VOCAB)}
    ids = np.array([[index[w] for w in ("the", "movie", "was", "not", "good")] + [0]], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", (ids != 0).astype(np.int64))
    report = _submit(
        service, tmp_path, "--model", str(tmp_path / "m.onnx"),
        "--input", f"ids={tmp_path / 'ids.npy'}", "--input", f"mask={tmp_path / 'mask.npy'}",
        "--explain", "ids", "--players", "tokens", "--baseline", "token:0",
    )  # fmt: skip
    methods = _verdicts(report)
    pair = next(t for t in report["game"]["top_interactions"] if t["members"] == [3, 4])
    assert pair["mean_effect"] > 0
    assert "complete_allocation" in methods["occlusion_1"]["failing_criteria"]
    assert methods["integrated_gradients"]["verdict"] == "reliable"
    assert json.dumps(report)  # a plain JSON document


def test_one_unnamed_input_for_a_two_input_model_fails_in_one_line(service: Service, tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(image_tabular()[0])
    np.save(tmp_path / "image.npy", np.zeros((1, 1, 8, 8), np.float32))
    env = dict(os.environ, XAUDIT_SERVER=service.address)
    run = subprocess.run(
        [str(XAUDIT), "submit", "--model", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "image.npy"),
         "--players", "grid:2x2", "--device", "cpu", "--methods", "occlusion_1", "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert "the model has 2 inputs (image, clinical)" in last and "--explain NAME" in last, run.stderr
