"""Game-derived methods on sub-inputs (v_T(U) = v(U ∩ T)) equal running the method on the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models import relu_cnn, relu_mlp, to_onnx
from tests.unit.core.conftest import prepared
from workers.audit import run_audit
from workers.audit.subinputs import attribute_sub_inputs, sub_inputs_from_game
from workers.game import play
from workers.interactions import subsets_up_to
from workers.methods import get_method
from workers.subgames import SubInputGame, restricted_shapley, subset_positions

GAME_METHODS = ("shapley_value", "occlusion_1", "occlusion_patch", "prediction_difference")


def _cases() -> list[tuple[str, bytes, np.ndarray, str]]:
    gen = torch.Generator().manual_seed(3)
    x_mlp = torch.randn(2, 6, generator=gen)
    x_cnn = torch.randn(2, 1, 8, 8, generator=gen)
    return [
        ("mlp", to_onnx(relu_mlp(0), x_mlp), x_mlp.numpy(), "features"),
        ("cnn", to_onnx(relu_cnn(0), x_cnn), x_cnn.numpy(), "grid:2x4"),
    ]


@pytest.mark.parametrize("order", [None, 2])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("name", GAME_METHODS)
def test_derived_equals_reevaluation(
    case: tuple[str, bytes, np.ndarray, str], name: str, order: int | None
) -> None:
    _, model, x, players = case
    prep = prepared(model, x, players=players, methods=(name,))
    refs = prep.baselines + 0.25  # a non-zero reference: the identity must not rely on zeros
    game = play(prep.model, prep.inputs, refs, prep.players, prep.target, prep.classes, order=order)
    method = get_method(name)
    derived = sub_inputs_from_game(
        method, {}, prep.players, SubInputGame(prep.players.n, game.subsets, game.values, game.interactions)
    )
    assert derived is not None
    again = attribute_sub_inputs(
        method, prep.model, prep.players, prep.target, {}, 0, prep.inputs, refs, prep.classes, game.subsets
    )
    scale = np.abs(again.per_player).max()
    np.testing.assert_allclose(derived.per_player, again.per_player, atol=2e-6 * scale, rtol=0)
    np.testing.assert_allclose(derived.absent_mass, again.absent_mass, atol=1e-5 * scale)


def test_restricted_shapley_brute_force() -> None:
    """phi_i(v_T) from the restriction's definition, by permutations, on a random game."""
    from itertools import permutations

    n = 4
    rng = np.random.default_rng(0)
    v = rng.normal(size=2**n)
    v[0] = 0.0
    subsets = subsets_up_to(n, n)
    from workers.interactions import moebius

    phi = restricted_shapley(SubInputGame(n, subsets, v[None], moebius(v[None], n)))[0]
    for t in range(2**n):
        expected = np.zeros(n)
        for perm in permutations(range(n)):
            have = 0
            for i in perm:
                expected[i] += v[(have | 1 << i) & t] - v[have & t]
                have |= 1 << i
        np.testing.assert_allclose(phi[t], expected / 24, atol=1e-12)


def test_sets_not_downward_closed_fall_back() -> None:
    subsets = np.array([0, 3], dtype=np.uint64)  # {0,1} without {0} and {1}
    assert subset_positions(subsets, np.array([1], dtype=np.uint64)) is None
    game = SubInputGame(2, subsets, np.zeros((1, 2)), np.zeros((1, 2)))
    assert restricted_shapley(game) is None
    assert get_method("occlusion_1").from_game({}, _players(2), game) is None


def _players(n: int):
    from workers.players import parse_players

    return parse_players("features", (n,))


def test_audit_reports_reuse_and_spot_check() -> None:
    _, model, x, players = _cases()[1]
    report = run_audit(
        prepared(model, x, players=players, methods=("shapley_value", "occlusion_1", "gradient_x_input"))
    ).report
    by_name = {m["name"]: m for m in report["methods"]}
    for name in ("shapley_value", "occlusion_1"):
        ev = by_name[name]["evaluations"]
        assert ev["source"] == "game" and ev["game_values_reused"] == 2 * 2**8
        assert ev["spot_check"]["max_abs_difference"] < 1e-5
    assert by_name["gradient_x_input"]["evaluations"]["source"] == "model"
    threads = report["environment"]["threads"]  # the thread policy the audit ran under
    assert 1 <= threads["threads"] <= threads["cpus"]
    # what held when the report was written (exactly tested in a fresh process: test_denormals.py)
    assert report["environment"]["denormals"].startswith(("flushed", "kept"))


def test_maps_read_off_the_game_equal_the_methods() -> None:
    from workers.explain import explain

    _, model, x, players = _cases()[1]
    prep = prepared(model, x, players=players, methods=GAME_METHODS[:3])
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    played = SubInputGame(prep.players.n, game.subsets, game.values, game.interactions)
    derived = explain(prep, GAME_METHODS[:3], game=played).attributions
    direct = explain(prep, GAME_METHODS[:3]).attributions
    for name in GAME_METHODS[:3]:
        np.testing.assert_allclose(derived[name], direct[name], atol=1e-6 * np.abs(direct[name]).max())
