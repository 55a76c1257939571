"""Players, references and targets from their specs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.players import auto_players, parse_players
from workers.references import check_background, make_baselines
from workers.targets import parse_target
from xaudit.contract.errors import InvalidInput


def test_grid_players_partition_the_last_two_axes() -> None:
    players = parse_players("grid:2x4", (3, 8, 8))
    assert players.n == 8 and players.layout == (2, 4)
    assert (players.sizes == 3 * 4 * 2).all()
    assert players.labels[0, 0, 0] == 0 and players.labels[2, 7, 7] == 7
    assert (players.labels[0] == players.labels[1]).all()  # channels share a cell
    uneven = parse_players("grid:3x3", (1, 8, 8))
    assert uneven.sizes.sum() == 64 and uneven.sizes.min() >= 4


def test_features_groups_and_masks() -> None:
    assert parse_players("features", (5,)).n == 5
    groups = parse_players(
        "groups:g.json", (6,), player_groups=np.array([0, 0, 1, 1, 2, 2]), group_names=["a", "b", "c"]
    )
    assert groups.names == ("a", "b", "c") and list(groups.sizes) == [2, 2, 2]
    mask = parse_players("mask:m.npy", (2, 2), player_mask=np.array([[7, 7], [3, 9]]))
    assert mask.n == 3 and mask.names == ("label 3", "label 7", "label 9")
    with pytest.raises(InvalidInput, match="does not partition"):
        parse_players("groups:g.json", (6,), player_groups=np.array([0, 0, 1]))
    with pytest.raises(InvalidInput, match="does not partition"):
        parse_players("mask:m.npy", (2, 2), player_mask=np.zeros((3, 3), dtype=int))
    with pytest.raises(InvalidInput, match="unknown player spec"):
        parse_players("voronoi", (6,))


@pytest.mark.parametrize(
    ("shape", "default"),
    [((3, 32, 32), "grid:3x3"), ((4, 4), "grid:3x3"), ((16,), "features"), ((2, 2), "features"),
     ((1, 128), None), ((64,), None)],
)  # fmt: skip
def test_auto_players_is_what_auto_builds(shape: tuple[int, ...], default: str | None) -> None:
    assert auto_players(shape) == default
    if default is None:
        with pytest.raises(InvalidInput, match="no default players"):
            parse_players("auto", shape)
    else:
        assert parse_players("auto", shape).n == parse_players(default, shape).n


def test_spread_and_sum_are_inverse() -> None:
    players = parse_players("grid:2x2", (1, 4, 6))
    per_player = np.array([[1.0, -2.0, 3.0, 0.5]])
    np.testing.assert_allclose(players.sum_per_player(players.spread(per_player)), per_player, rtol=1e-6)


@pytest.mark.parametrize(
    ("spec", "shape"),
    [("grid:2x4", (3, 32, 32)), ("grid:3x2", (1, 7, 5)), ("grid:9x9", (2, 9, 9)), ("grid:2x3", (5, 5))],
)
def test_grid_sums_per_player_match_the_label_table(spec: str, shape: tuple[int, ...]) -> None:
    # Grid players sum by their row and column starts; the reference sums by each element's label,
    # with uneven cells (7 rows in 3) and no channel axis included.
    players = parse_players(spec, shape)
    assert players.grid_starts is not None
    values = np.random.default_rng(0).standard_normal((4, *shape)).astype(np.float32)
    labels = players.labels.ravel()
    expected = np.stack(
        [np.bincount(labels, row.astype(np.float64), players.n) for row in values.reshape(4, -1)]
    )
    np.testing.assert_allclose(players.sum_per_player(values), expected, rtol=1e-12, atol=1e-12)


def test_references() -> None:
    x = np.arange(2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    assert (make_baselines("zeros", x) == 0).all()
    assert (make_baselines("constant:0.5", x) == 0.5).all()
    mean = make_baselines("mean", x)
    np.testing.assert_allclose(mean[1, 0], x[1, 0].mean())  # per sample and channel
    blur = make_baselines("blur:1", x)
    assert blur.shape == x.shape and blur[0, 0].std() < x[0, 0].std()
    np.testing.assert_allclose(make_baselines("tensor", x, np.ones((2, 3, 3))), 1.0)
    with pytest.raises(InvalidInput):
        make_baselines("tensor", x, np.ones((5, 5)))
    with pytest.raises(InvalidInput):
        make_baselines("constant:nan", x)
    with pytest.raises(InvalidInput, match="NaN"):
        check_background(np.full((2, 2, 3, 3), np.inf), (2, 3, 3))


def test_targets() -> None:
    outputs = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 1.0]])
    predicted = parse_target("predicted")
    classes = predicted.resolve_classes(outputs)
    assert list(classes) == [0, 1]
    np.testing.assert_allclose(predicted.values(outputs, classes), [2.0, 3.0])
    fixed = parse_target("class:2")
    assert list(fixed.resolve_classes(outputs)) == [2, 2]
    prob = parse_target("prob")
    p = torch.softmax(torch.from_numpy(outputs), 1).numpy()
    np.testing.assert_allclose(prob.values(outputs, classes), p[[0, 1], classes], rtol=1e-9)
    logodds = parse_target("logodds:1")
    q = p[:, 1]
    np.testing.assert_allclose(logodds.values(outputs, np.array([1, 1])), np.log(q / (1 - q)), rtol=1e-9)
    with pytest.raises(InvalidInput, match="out of range"):
        parse_target("class:7").resolve_classes(outputs)
    with pytest.raises(InvalidInput):
        parse_target("entropy")
