"""The committed generated code must match what `python proto/gen_proto.py` produces now."""

from __future__ import annotations

from pathlib import Path

import pytest

import gen_proto  # proto/ is on pytest's pythonpath


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in gen_proto.generate(tmp_path)}
    committed = {p.relative_to(gen_proto.PROTO_ROOT): p.read_bytes() for p in gen_proto.committed()}
    assert fresh, "protoc generated nothing"
    assert sorted(fresh) == sorted(committed), "generated file set differs: run python proto/gen_proto.py"
    stale = [str(name) for name, data in fresh.items() if committed[name] != data]
    assert not stale, f"stale generated code {stale}: run python proto/gen_proto.py"


def test_generated_package_imports_as_xaudit() -> None:
    from xaudit.v1 import audit_pb2, worker_pb2_grpc

    assert audit_pb2.DESCRIPTOR.package == "xaudit.v1"
    assert hasattr(worker_pb2_grpc, "WorkerServiceStub")
    assert Path(audit_pb2.__file__).parent == gen_proto.PROTO_ROOT / "xaudit" / "v1"
