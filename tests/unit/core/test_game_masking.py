"""The game's two ways of building sub-inputs (a masked copy; a gather through a cached index for
small exact games) give the model exactly the same rows: exact copies of input or reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workers.game as game
from tests.models import relu_mlp, to_onnx
from workers.game import gathered_samples, masked_samples, play
from workers.interactions import all_subset_bits
from workers.models import load_model
from workers.players import parse_players
from workers.targets import parse_target


@pytest.mark.parametrize("spec", ["grid:2x4", "grid:3x2", "windows:5"])
def test_gathered_sub_inputs_are_the_masked_copies_bit_for_bit(spec: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 1, 4, 8))  # float64 in, float32 out on both paths
    base = rng.normal(size=x.shape)
    base[0, 0, 0, 0] = -0.0
    players = parse_players(spec, x.shape[1:])
    index = game._gather_index(players.n, players)
    assert index is not None
    masked = masked_samples(all_subset_bits(players.n), x, base, players)
    gathered = gathered_samples(index, x, base)
    assert gathered.dtype == masked.dtype == np.float32
    assert gathered.tobytes() == masked.tobytes()


@pytest.mark.parametrize(
    ("spec", "shape"),
    [("features", (24,)), ("grid:2x2", (3, 64, 64))],  # 2^24 x 24 entries; players of 3,072 elements
)
def test_large_tables_and_large_players_are_not_gathered(spec: str, shape: tuple[int, ...]) -> None:
    players = parse_players(spec, shape)
    assert game._gather_index(players.n, players) is None


@pytest.mark.parametrize("gather_elements", [0, 1 << 20])  # the masked copy; the gather
def test_the_model_sees_the_same_rows_on_both_paths(
    gather_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    model = load_model(to_onnx(relu_mlp(0, features=6), torch.from_numpy(x)), "onnx", "cpu")
    players, target = parse_players("features", x.shape[1:]), parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.full_like(x, 0.25)
    monkeypatch.setattr(game, "_GATHER_ELEMENTS", gather_elements)
    seen: list[np.ndarray] = []
    predict = model.predict
    monkeypatch.setattr(model, "predict", lambda batch: seen.append(batch.copy()) or predict(batch))
    result = play(model, x, base, players, target, classes)
    rows = np.concatenate(seen)
    assert rows.tobytes() == masked_samples(all_subset_bits(6), x, base, players).tobytes()
    np.testing.assert_array_equal(
        result.values, target.values(predict(rows), np.repeat(classes, 64)).reshape(4, 64)
    )
