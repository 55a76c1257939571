"""Every quantity the audit builds on, against closed forms on analytic models (docs/science.md, section 7)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.core.conftest import POLY_X, prepared
from workers.audit.scores import moebius_shares
from workers.audit.subinputs import attribute_sub_inputs
from workers.game import play
from workers.methods import get_method
from workers.players import subset_bits


def expected_poly_interactions(x: np.ndarray) -> dict[int, float]:
    """v = 2 x1 + 3 x1 x2 - x2 x3 x4 at a zero reference: each monomial is the effect of its variable set."""
    return {0b0001: 2 * x[0], 0b0011: 3 * x[0] * x[1], 0b1110: -x[1] * x[2] * x[3]}


def test_every_interaction_is_exact(poly_model: bytes) -> None:
    prep = prepared(poly_model, POLY_X)
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    assert game.exact and game.n == 4
    for s, x in enumerate(POLY_X):
        expected = np.zeros(16)
        for subset, value in expected_poly_interactions(x).items():
            expected[subset] = value
        expected[0] = 0.0  # v(empty) = f(0)
        np.testing.assert_allclose(game.interactions[s], expected, atol=1e-5)
    np.testing.assert_allclose(game.efficiency_error, 0.0, atol=1e-5)


def test_shapley_is_sum_of_interactions_over_set_size(poly_model: bytes) -> None:
    prep = prepared(poly_model, POLY_X, methods=("shapley_value",))
    phi = prep.players.sum_per_player(
        get_method("shapley_value").attribute(
            _ctx(prep, "shapley_value"), prep.inputs, prep.baselines, prep.classes
        )
    )
    for s, x in enumerate(POLY_X):
        e = expected_poly_interactions(x)
        expected = np.array(
            [e[0b0001] + e[0b0011] / 2, e[0b0011] / 2 + e[0b1110] / 3, e[0b1110] / 3, e[0b1110] / 3]
        )
        np.testing.assert_allclose(phi[s], expected, atol=1e-5)


def _ctx(prep, name):  # type: ignore[no-untyped-def]
    from workers.explain import method_context

    return method_context(prep, name)


def _shares(prep, name: str) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    sub = attribute_sub_inputs(
        get_method(name), prep.model, prep.players, prep.target, {}, 0,
        prep.inputs, prep.baselines, prep.classes, game.subsets,
    )  # fmt: skip
    return moebius_shares(game.subsets, sub.per_player, prep.players.n), game.interactions


def test_occlusion_1_gives_every_member_the_whole_effect(poly_model: bytes) -> None:
    prep = prepared(poly_model, POLY_X)
    shares, interactions = _shares(prep, "occlusion_1")
    members = subset_bits(np.arange(16, dtype=np.uint64), 4)
    for s in range(len(POLY_X)):
        for subset in range(1, 16):
            expected = np.where(members[subset], interactions[s, subset], 0.0)
            np.testing.assert_allclose(shares[s, subset], expected, atol=1e-5)
        np.testing.assert_allclose(shares[s, 0], 0.0, atol=1e-6)  # nothing at the reference


def test_integrated_gradients_splits_by_degree(cubic_onnx: bytes) -> None:
    x = np.array([[1.0, 2.0, 3.0], [-2.0, 0.5, 1.0]], dtype=np.float32)
    prep = prepared(cubic_onnx, x)
    shares, interactions = _shares(prep, "integrated_gradients")
    for s, (x1, x2, x3) in enumerate(x):
        term = x1**2 * x2  # effect of {x1, x2}
        assert interactions[s, 0b011] == pytest.approx(term, abs=1e-5)
        np.testing.assert_allclose(shares[s, 0b011], [2 * term / 3, term / 3, 0.0], atol=1e-4)
        np.testing.assert_allclose(shares[s, 0b100], [0.0, 0.0, x3], atol=1e-4)


def test_shapley_splits_equally(cubic_onnx: bytes) -> None:
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    prep = prepared(cubic_onnx, x)
    shares, _ = _shares(prep, "shapley_value")
    np.testing.assert_allclose(shares[0, 0b011], [1.0, 1.0, 0.0], atol=1e-5)  # x1^2 x2 = 2, halves


def test_onnx_and_torchscript_games_agree() -> None:
    import torch

    from tests.models import relu_cnn, to_onnx, to_torchscript

    model = relu_cnn(3)
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    games = []
    for data in (to_onnx(model, x), to_torchscript(model, x)):
        prep = prepared(data, x.numpy(), players="grid:2x4")
        games.append(play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes))
    np.testing.assert_allclose(games[0].values, games[1].values, atol=1e-5)
    np.testing.assert_allclose(games[0].interactions, games[1].interactions, atol=1e-5)
