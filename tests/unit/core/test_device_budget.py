"""GPU budgets (workers/device_budget.py): the CPU's memory budgets times the device's memory in
units of 8 GiB, for passes, forward calls and the audit's calls, except where a cut decides a
stochastic method's seeds. No GPU here: the device's memory is mocked."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import workers.audit.subinputs as subinputs
import workers.device_budget as device_budget
import workers.methods._passes as passes
import workers.threads as threads
from tests.models import relu_cnn, to_onnx
from tests.unit.core.conftest import prepared
from workers.audit.device_subinputs import DeviceSubInputs
from workers.device_budget import budget_scale, equal_parts
from workers.interactions import subsets_up_to
from workers.methods import get_method
from workers.models.base import rows_per_call


@pytest.fixture
def fresh_scale() -> Iterator[None]:
    device_budget._cuda_scale.cache_clear()
    yield
    device_budget._cuda_scale.cache_clear()


def test_the_cpu_keeps_its_budgets() -> None:
    assert budget_scale(torch.device("cpu")) == 1


@pytest.mark.parametrize(("gib", "scale"), [(139.8, 17), (79.2, 9), (15.7, 1), (4.0, 1)])
def test_a_gpu_multiplies_them_by_its_memory_in_8_gib_units(
    gib: float, scale: int, fresh_scale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[torch.device] = []

    def properties(device: torch.device) -> SimpleNamespace:
        seen.append(device)
        return SimpleNamespace(total_memory=int(gib * 2**30))

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(threads, "current", lambda: SimpleNamespace(concurrency=1))
    assert budget_scale(torch.device("cuda", 1)) == scale
    assert budget_scale(torch.device("cuda", 1)) == scale  # asked once per device
    assert seen == [torch.device("cuda", 1)]


def test_jobs_sharing_a_gpu_share_its_budget(fresh_scale: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=139 * 2**30)
    )
    monkeypatch.setattr(threads, "current", lambda: SimpleNamespace(concurrency=2))
    assert budget_scale(torch.device("cuda")) == 8


def test_passes_and_forward_calls_grow_with_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    image = torch.zeros(1, 3, 224, 224)
    cpu_rows = passes.rows_per_pass(image)
    monkeypatch.setattr(passes, "budget_scale", lambda device: 17)
    assert cpu_rows == 2**22 // (3 * 224 * 224) == 27
    assert passes.rows_per_pass(image) == 17 * 2**22 // (3 * 224 * 224)
    assert rows_per_call(64) == 1024 and rows_per_call(64, scale=17) == 17 * 1024
    assert rows_per_call(3 * 224 * 224) == 27  # the forward budget: 2**22 elements
    assert rows_per_call(3 * 224 * 224, scale=17) == 256  # the batch size: the budget holds 473


@pytest.mark.parametrize(("name", "grows"), [("smoothgrad", False), ("lrp_epsilon", True)])
def test_audit_calls_grow_on_a_gpu_except_where_they_seed_a_stochastic_method(
    name: str, grows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    prep = prepared(to_onnx(relu_cnn(0), x), x.numpy(), players="grid:2x4", methods=(name,))
    method = get_method(name)
    params = method.bind(method.params_from({}), prep.inputs, (prep.baselines,))
    subsets = subsets_up_to(prep.players.n, prep.players.n)
    classes = np.array([2, 0])
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 64 * 100)  # 100 sub-inputs per call
    monkeypatch.setattr(subinputs, "on_device", lambda model: True)  # the device path, on the CPU
    calls: list[int] = []
    per_player = DeviceSubInputs.per_player

    def counted(self: DeviceSubInputs, method, ctx, bits, inputs, *rest):  # type: ignore[no-untyped-def]
        calls.append(len(bits) * len(inputs))
        return per_player(self, method, ctx, bits, inputs, *rest)

    monkeypatch.setattr(DeviceSubInputs, "per_player", counted)

    def run() -> np.ndarray:
        return subinputs.attribute_sub_inputs(
            method,
            prep.model,
            prep.players,
            prep.target,
            params,
            0,
            prep.inputs,
            prep.baselines,
            classes,
            subsets,
        ).per_player

    cpu = run()
    cpu_calls, calls[:] = list(calls), []
    monkeypatch.setattr(subinputs, "budget_scale", lambda device: 8)
    gpu = run()
    assert cpu_calls == [100, 100, 56, 100, 100, 56]
    assert calls == ([512] if grows else cpu_calls)
    if not grows:  # the same calls, the same seeds: the same noise
        np.testing.assert_array_equal(gpu, cpu)


@pytest.mark.parametrize(
    ("total", "most", "size"), [(512, 473, 256), (10, 4, 4), (9, 4, 3), (3, 4, 4), (0, 4, 4)]
)
def test_passes_split_rows_into_the_fewest_chunks_of_equal_size(total: int, most: int, size: int) -> None:
    assert equal_parts(total, most) == size
