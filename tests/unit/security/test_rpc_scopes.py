"""Every RPC declares its scope in the .proto; the server refuses a served method that declares none."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from service.auth import METHOD_SCOPES, declared_scopes
from service.tokens import SCOPES
from xaudit.v1 import audit_pb2, worker_pb2


def test_every_rpc_of_every_service_declares_a_known_scope() -> None:
    for file in (audit_pb2.DESCRIPTOR, worker_pb2.DESCRIPTOR):
        for service in file.services_by_name.values():
            for method in service.methods:
                scope = METHOD_SCOPES[f"/{service.full_name}/{method.name}"]
                assert scope in SCOPES, method.full_name
    assert METHOD_SCOPES["/xaudit.v1.WorkerService/CompleteJob"] == "worker"
    assert METHOD_SCOPES["/xaudit.v1.AuditService/WatchJob"] == "read"


def test_an_rpc_without_a_scope_is_an_error_not_admin() -> None:
    proto = descriptor_pb2.FileDescriptorProto(name="xaudit_test_noscope.proto", package="xaudit.test")
    proto.message_type.add(name="Empty")
    service = proto.service.add(name="Forgotten")
    service.method.add(name="DoIt", input_type=".xaudit.test.Empty", output_type=".xaudit.test.Empty")
    pool = descriptor_pool.DescriptorPool()
    file = pool.Add(proto) and pool.FindFileByName("xaudit_test_noscope.proto")
    with pytest.raises(ValueError, match="declares no valid scope"):
        declared_scopes(file)
