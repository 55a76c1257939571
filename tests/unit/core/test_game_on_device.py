"""The game's sub-inputs built on the model's device (workers/device_rows.py) and bound where they lie
(OnnxModel.predict_rows: ONNX Runtime's I/O binding; TorchScriptModel.predict_rows: the module where
it runs). No GPU here: the path is forced onto the CPU, whose binding takes CPU tensors as CUDA's
takes the device's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import workers.game as game
from tests.models import relu_cnn, to_onnx, to_torchscript
from workers.device_rows import GameRows
from workers.models import load_model
from workers.models.base import ModelAdapter
from workers.players import Players, parse_players
from workers.targets import parse_target


@pytest.fixture(scope="module", params=["onnx", "torchscript"])
def cnn(request: pytest.FixtureRequest) -> tuple[ModelAdapter, np.ndarray]:
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(7))
    export = to_onnx if request.param == "onnx" else to_torchscript
    return load_model(export(relu_cnn(0), x[:1]), request.param, "cpu"), x.numpy()


@pytest.mark.parametrize("rows", [64, 4096])
def test_bound_rows_give_the_outputs_of_predict(cnn: tuple[ModelAdapter, np.ndarray], rows: int) -> None:
    model, _ = cnn
    x = np.random.default_rng(0).normal(size=(300, 1, 8, 8)).astype(np.float32)
    model.rows_per_call = lambda elements: rows  # type: ignore[method-assign]
    try:
        np.testing.assert_array_equal(model.predict_rows(torch.from_numpy(x)), model.predict(x))
    finally:
        del model.rows_per_call  # type: ignore[method-assign]


def test_the_cpu_game_and_one_call_on_a_gpu_keep_the_half_tables(
    cnn: tuple[ModelAdapter, np.ndarray],
) -> None:
    model, x = cnn
    players, bits = parse_players("grid:2x4", x.shape[1:]), np.zeros((1, 8), bool)
    assert not model.takes_device_rows  # a CPU session
    assert game._rows_on_device(model, players, bits, calls=4) is None
    gpu = SimpleNamespace(device=torch.device("cuda"), takes_device_rows=True)
    assert game._rows_on_device(gpu, players, bits, calls=1) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [None, 2], ids=["every-subset", "order-2"])
@pytest.mark.parametrize("rows", [100, 4096], ids=["chunks", "one-call"])
def test_the_device_game_gives_the_host_games_values(
    cnn: tuple[ModelAdapter, np.ndarray], order: int | None, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = cnn
    players = parse_players("grid:2x4", x.shape[1:])
    target = parse_target("predicted")
    classes = np.array([1, 0, 2])
    # Each sample its own reference, so rows of the wrong sample would show.
    refs = np.zeros_like(x) + np.array([0.0, 0.5, -1.0], dtype=np.float32)[:, None, None, None]
    monkeypatch.setattr(model, "rows_per_call", lambda elements: rows)
    host = game.play(model, x, refs, players, target, classes, order)

    bound: list[int] = []
    predict_rows = model.predict_rows

    def counted(batch: torch.Tensor) -> np.ndarray:
        bound.append(len(batch))
        return predict_rows(batch)

    def on_device(model: ModelAdapter, players: Players, bits: np.ndarray, calls: int) -> GameRows:
        return GameRows(players, bits, model.device)

    monkeypatch.setattr(game, "_rows_on_device", on_device)
    monkeypatch.setattr(model, "predict_rows", counted)
    monkeypatch.setattr(model, "predict", lambda batch: pytest.fail("rows went through the host"))
    device = game.play(model, x, refs, players, target, classes, order)
    assert sum(bound) == host.values.size + (0 if order is None else len(x))  # v(N) too when limited
    np.testing.assert_array_equal(device.values, host.values)
    np.testing.assert_array_equal(device.full, host.full)
    np.testing.assert_array_equal(device.interactions, host.interactions)
