"""The game batches several samples' sub-inputs into one call: the same values as one sample at a
time, and fewer calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models import relu_mlp, to_onnx
from workers.game import play
from workers.models import load_model
from workers.players import parse_players
from workers.targets import parse_target


@pytest.mark.parametrize("rows", [4, 64, 4096])  # part of a sample, whole samples, all of them
def test_grouped_samples_give_the_values_of_one_sample_at_a_time(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    model = load_model(to_onnx(relu_mlp(0, features=6), torch.from_numpy(x)), "onnx", "cpu")
    players, target = parse_players("features", x.shape[1:]), parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.zeros_like(x)
    one_by_one = np.stack(
        [
            play(model, x[s : s + 1], base[s : s + 1], players, target, classes[s : s + 1]).values[0]
            for s in range(5)
        ]
    )
    calls: list[int] = []
    predict = model.predict
    monkeypatch.setattr(model, "rows_per_call", lambda elements: rows)
    monkeypatch.setattr(model, "predict", lambda batch: calls.append(len(batch)) or predict(batch))
    game = play(model, x, base, players, target, classes)
    np.testing.assert_allclose(game.values, one_by_one, rtol=1e-5, atol=1e-6)  # batch size: float32 rounding
    assert max(calls) <= rows and sum(calls) == 5 * 64
    assert len(calls) == {4: 5 * 16, 64: 5, 4096: 1}[rows]


def test_a_sample_too_large_for_one_call_is_cut_into_calls_of_equal_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """256 sub-inputs at most 100 per call: 86, 86 and 84 rows, not 100, 100 and 56 (on a GPU each new
    input shape costs onnxruntime's convolutions a new set-up: workers/device_budget.py)."""
    x = np.random.default_rng(1).normal(size=(1, 8)).astype(np.float32)
    model = load_model(to_onnx(relu_mlp(0, features=8), torch.from_numpy(x)), "onnx", "cpu")
    players, target = parse_players("features", x.shape[1:]), parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    calls: list[int] = []
    predict = model.predict
    monkeypatch.setattr(model, "rows_per_call", lambda elements: 100)
    monkeypatch.setattr(model, "predict", lambda batch: calls.append(len(batch)) or predict(batch))
    play(model, x, np.zeros_like(x), players, target, classes)
    assert calls == [86, 86, 84]
