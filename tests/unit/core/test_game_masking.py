"""The game's two ways of building sub-inputs (the masked copy; the sum of two half tables for
exact games) give the model exactly the same rows: exact copies of input or reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workers.sub_inputs as sub_inputs
from tests.models import relu_mlp, to_onnx
from workers.game import play
from workers.interactions import all_subset_bits
from workers.models import load_model
from workers.players import parse_players
from workers.sub_inputs import ExactSubInputs, masked_samples
from workers.targets import parse_target


@pytest.mark.parametrize(
    ("spec", "shape"),
    [("grid:2x4", (1, 4, 8)), ("grid:3x3", (2, 6, 6)), ("windows:5", (1, 4, 10)), ("features", (7,))],
)
@pytest.mark.parametrize(("start", "stop"), [(0, None), (3, 11), (5, 6), (13, None)])
def test_half_tables_give_the_masked_copies_bit_for_bit(
    spec: str, shape: tuple[int, ...], start: int, stop: int | None
) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, *shape))  # float64 in, float32 out on both paths
    base = rng.normal(size=x.shape)
    x[0].flat[0], base[1].flat[0], x[2].flat[-1], base[2].flat[-1] = -0.0, -0.0, 0.0, -0.0
    players = parse_players(spec, shape)
    exact = ExactSubInputs.build(players.n, players, x, base)
    assert exact is not None
    stop = 2**players.n if stop is None else stop
    rows = exact.rows(start, stop)
    masked = masked_samples(all_subset_bits(players.n)[start:stop], x, base, players)
    assert rows.dtype == masked.dtype == np.float32
    assert rows.shape == masked.shape
    assert rows.tobytes() == masked.tobytes()  # the sign of every zero too


def test_tables_beyond_the_budget_are_not_built() -> None:
    players = parse_players("grid:4x4", (3, 224, 224))  # 512 table rows x 150,528 elements
    x = np.zeros((1, 3, 224, 224), np.float32)
    assert ExactSubInputs.build(players.n, players, x, x) is None


@pytest.mark.parametrize("table_bytes", [0, 1 << 25])  # the masked copy; the half tables
@pytest.mark.parametrize("rows", [7, 64, 4096])  # chunks across table runs, whole samples, all
def test_the_model_sees_the_same_rows_on_both_paths(
    table_bytes: int, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    model = load_model(to_onnx(relu_mlp(0, features=6), torch.from_numpy(x)), "onnx", "cpu")
    players, target = parse_players("features", x.shape[1:]), parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.full_like(x, 0.25)
    monkeypatch.setattr(sub_inputs, "_TABLE_BYTES", table_bytes)
    monkeypatch.setattr(model, "rows_per_call", lambda elements: rows)
    seen: list[np.ndarray] = []
    predict = model.predict
    monkeypatch.setattr(model, "predict", lambda batch: seen.append(batch.copy()) or predict(batch))
    result = play(model, x, base, players, target, classes)
    fed = np.concatenate(seen)
    # samples in order, each sample's subsets in bitmask order, whatever the calls
    assert fed.tobytes() == masked_samples(all_subset_bits(6), x, base, players).tobytes()
    expected = np.concatenate([predict(batch) for batch in seen])
    np.testing.assert_array_equal(
        result.values, target.values(expected, np.repeat(classes, 64)).reshape(4, 64)
    )
