"""The same invalid option gives the same one-line error everywhere, before any model is loaded:
``xaudit audit`` exits 2 with ``xaudit: error: MESSAGE``, and a real server on loopback answers
INVALID_ARGUMENT with MESSAGE (the contract's JobSpec is the one place that checks options)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from clients.cli.main import main
from service.config import ServerConfig
from service.server import create_server
from tests.integration.service._helpers import request, stub
from xaudit.v1 import audit_pb2_grpc

pytestmark = pytest.mark.integration

IG = "integrated_gradients"

# (CLI options, SubmitRequest fields, method params for the request, the one-line message)
CASES: list[tuple[list[str], dict[str, object], dict[str, dict[str, str]], str]] = [
    (
        ["--players", "grid:4y2"],
        {"players": "grid:4y2"},
        {},
        "player spec 'grid:4y2': expected grid:RxC, e.g. grid:2x4, or grid:DxRxC for a volume, e.g. grid:2x2x2 "
        "(a series: windows:K)",
    ),
    (["--players", "hexagons:3"], {"players": "hexagons:3"}, {}, "unknown player spec 'hexagons:3'"),
    (["--players", "grid:5000x2"], {"players": "grid:5000x2"}, {}, "each side must be between 1 and 1024"),
    (
        ["--tolerance", "coverage=nan"],
        {"tolerances": {"coverage": float("nan")}},
        {},
        "tolerance coverage=nan: must be a finite number between 0 and 1",
    ),
    (
        ["--tolerance", "complete_allocation=-0.5"],
        {"tolerances": {"complete_allocation": -0.5}},
        {},
        "tolerance complete_allocation=-0.5: must be a finite number between 0 and 1",
    ),
    (
        ["--param", f"{IG}.steps=many"],
        {},
        {IG: {"steps": "many"}},
        f"{IG}.steps='many': expected an integer between 1 and 1024",
    ),
    (
        ["--param", f"{IG}.steps=6000"],
        {},
        {IG: {"steps": "6000"}},
        f"{IG}.steps=6000: expected an integer between 1 and 1024",
    ),
    (
        ["--param", f"{IG}.rule=gauss"],
        {},
        {IG: {"rule": "gauss"}},
        f"{IG} has no parameter rule (parameters: quadrature, steps)",
    ),
    (
        ["--param", f"{IG}.steps=[[[1]]]"],
        {},
        {IG: {"steps": "[[[1]]]"}},
        f"parameter {IG}.steps: nested deeper than 2 levels",
    ),
    (["--param", f"{IG}.steps=" + "9" * 200], {}, {IG: {"steps": "9" * 200}}, "has more than 18 digits"),
    (["--param", "smoothgrad.noise=1e400"], {}, {"smoothgrad": {"noise": "1e400"}}, "is not finite"),
    (
        ["--baseline", "blur:1e308"],
        {"baseline": "blur:1e308"},
        {},
        "baseline 'blur:1e308': sigma must be in (0, 10000]",
    ),
    (["--audit-order", "40"], {"audit_order": 40}, {}, "audit order 40: must be an integer between 1 and 16"),
    (["--device", "tpu"], {"device": "tpu"}, {}, "unknown device 'tpu' (use auto, cpu, cuda or cuda:N)"),
    (
        ["--target", "class:x"],
        {"target": "class:x"},
        {},
        "target 'class:x': class index must be an integer >= 0",
    ),
]
IDS = [c[3][:40] for c in CASES]


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("server")
    config = ServerConfig(listen="127.0.0.1:0", home=home, sweep_seconds=60)
    server, port = create_server(config, sender=lambda job, queue: None)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@pytest.mark.parametrize(("cli", "fields", "params", "message"), CASES, ids=IDS)
def test_cli_and_service_give_the_same_error(
    cli: list[str],
    fields: dict[str, object],
    params: dict[str, dict[str, str]],
    message: str,
    address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    x = np.zeros((2, 4), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    # Not a model at all: an option error must come first, without reading the model.
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    methods = [*params] or [IG]
    code = main(
        ["audit", "--model", str(tmp_path / "model.onnx"), "--input", str(tmp_path / "x.npy"),
         "--players", "features", "--methods", ",".join(methods), "--out", str(tmp_path / "r.json"),
         *cli]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("xaudit: error: ") and message in err, err
    assert not (tmp_path / "r.json").exists()

    api: audit_pb2_grpc.AuditServiceStub = stub(address)
    # An unknown model digest: the options are judged before the model is even looked up.
    req = request("0" * 64, x, {m: params.get(m, {}) for m in methods}, **fields)
    with pytest.raises(grpc.RpcError) as info:
        api.SubmitAudit(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert message in details
    # The same line, word for word, as the CLI printed.
    assert err.strip() == f"xaudit: error: {details}"
