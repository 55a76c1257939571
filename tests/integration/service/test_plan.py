"""PlanAudit over real gRPC on loopback: the cost of an audit before any job exists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from service.config import ServerConfig
from service.server import Server
from tests.integration.service._helpers import request, serving, stub, upload
from tests.models import relu_mlp, to_onnx
from workers.audit.plan_request import plan_request
from xaudit.v1 import audit_pb2


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path / "home", sweep_seconds=60)
    with serving(config, planner=plan_request) as srv:
        yield srv


def test_plan_before_submitting(server: Server) -> None:
    api = stub(server.address)
    model = upload(api, to_onnx(relu_mlp(0, features=64), torch.zeros(2, 64)))
    x = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    methods = {"integrated_gradients": {"steps": "16"}, "occlusion_1": {}}
    plan = api.PlanAudit(request(model, x, methods, seed=7), timeout=30)
    assert (plan.players, plan.samples, plan.seed) == (64, 3, 7)
    assert [(s.order, s.audited, s.exhaustive) for s in plan.strata] == [
        (1, 64, True),
        (2, 2016, True),
        (3, 2048, False),
    ]
    assert (
        plan.sub_inputs_per_sample == 1 + 64 + 2016 + 2048
        and plan.sub_inputs == 3 * plan.sub_inputs_per_sample
    )
    rows = {m.name: m for m in plan.methods}
    assert rows["integrated_gradients"].backward_passes >= 3 * 16 * plan.sub_inputs_per_sample
    assert rows["occlusion_1"].from_game and plan.game_forward_passes == 3 * (plan.sub_inputs_per_sample + 1)
    capped = api.PlanAudit(
        request(model, x, methods, budget_evaluations=int(plan.evaluations // 4)), timeout=30
    )
    assert capped.evaluations <= plan.evaluations // 4 and not capped.strata[1].exhaustive
    assert not api.ListJobs(audit_pb2.ListJobsRequest(), timeout=10).jobs  # nothing was recorded
    with pytest.raises(grpc.RpcError) as info:
        api.PlanAudit(request(model, x, methods, budget_evaluations=1000), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too small" in (
        info.value.details() or ""
    )
    with pytest.raises(grpc.RpcError) as info:
        api.PlanAudit(request(model, x, methods, budget_seconds=-1.0), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
