"""The committed generated code must match what `python -m clients.gen_proto` produces now."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients import gen_proto


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in gen_proto.generate(tmp_path)}
    committed = {
        p.relative_to(gen_proto.OUT_ROOT): p.read_bytes()
        for p in gen_proto.OUT_ROOT.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(committed), "generated file set differs: run python -m clients.gen_proto"
    stale = [str(name) for name, data in fresh.items() if committed[name] != data]
    assert not stale, f"stale generated code {stale}: run python -m clients.gen_proto"


def test_generated_package_imports_as_xaudit() -> None:
    from xaudit.v1 import audit_pb2, worker_pb2_grpc

    assert audit_pb2.DESCRIPTOR.package == "xaudit.v1"
    assert hasattr(worker_pb2_grpc, "WorkerServiceStub")
