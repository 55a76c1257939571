"""The audit's device path (workers/audit/device_subinputs.py) gives the host path's attributions of
every sub-input. No GPU here: the path is forced onto the CPU, where it runs the same torch code
that runs on a GPU (the sub-inputs selected on the device, the methods' tensor implementations, the
per-player sums as one float64 product)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import workers.audit.subinputs as subinputs
from tests.models import relu_cnn, to_onnx
from tests.unit.core.conftest import prepared
from workers.audit.device_subinputs import on_device
from workers.interactions import subsets_up_to
from workers.methods import get_method
from xaudit.contract.spec import ALL_METHODS


@pytest.fixture(scope="module")
def cnn() -> tuple[bytes, np.ndarray]:
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    return to_onnx(relu_cnn(0), x), x.numpy()


@pytest.mark.parametrize("chunked", [False, True], ids=["samples-per-call", "chunks-of-one-sample"])
@pytest.mark.parametrize("name", ALL_METHODS)
def test_the_device_path_gives_the_host_paths_attributions(
    cnn: tuple[bytes, np.ndarray], name: str, chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = cnn
    prep = prepared(model, x, players="grid:2x4", methods=(name,))
    # Each sample its own reference and class, so rows in the wrong order would show.
    refs = prep.baselines + np.array([0.25, -0.5], dtype=np.float32)[:, None, None, None]
    classes = np.array([2, 0])
    method = get_method(name)
    params = method.bind(method.params_from({}), prep.inputs, (refs,))
    subsets = subsets_up_to(prep.players.n, prep.players.n)
    if chunked:  # 256 sub-inputs per sample, 100 per call
        monkeypatch.setattr(subinputs, "_MAX_SUB_INPUTS_PER_CALL", 100)

    def run() -> subinputs.SubInputAttributions:
        return subinputs.attribute_sub_inputs(
            method, prep.model, prep.players, prep.target, params, 0, prep.inputs, refs, classes, subsets
        )

    host = run()
    monkeypatch.setattr(subinputs, "on_device", lambda model: True)
    device = run()
    scale = np.abs(host.per_player).max()
    assert scale > 0
    np.testing.assert_allclose(device.per_player, host.per_player, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(device.absent_mass, host.absent_mass, rtol=1e-9)


def test_the_device_path_is_taken_on_a_gpu_without_token_inputs() -> None:
    assert not on_device(SimpleNamespace(device=torch.device("cpu")))  # type: ignore[arg-type]
    assert on_device(SimpleNamespace(device=torch.device("cuda")))  # type: ignore[arg-type]
    assert not on_device(SimpleNamespace(device=torch.device("cuda"), embedding=object()))  # type: ignore[arg-type]
