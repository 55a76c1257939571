"""Precise estimators and checks that can fail (docs/science.md sections 5.5, 5.7 and 6)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from tests.models import relu_mlp, to_onnx
from tests.unit.core.analytic import Polynomial
from tests.unit.core.conftest import POLY_X
from workers.audit import run_audit
from workers.audit.checks import game_checks
from workers.game import play
from workers.methods.references import MAX_EXACT_REFERENCES, choose_references
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec


def _poly_prep(**spec: Any) -> Any:
    background = spec.pop("background", None)
    tensors = {"inputs": POLY_X} if background is None else {"inputs": POLY_X, "background": background}
    spec.setdefault("players", "features")
    spec.setdefault("device", "cpu")
    return prepare(JobSpec(**spec), to_onnx(Polynomial(), torch.from_numpy(POLY_X)), None, tensors)


def _poly_gradient(p: np.ndarray) -> np.ndarray:
    x1, x2, x3, x4 = p.T
    return np.stack([2 + 3 * x2, 3 * x1 - x3 * x4, -x2 * x4, -x2 * x3], axis=1)


def test_expected_gradients_is_the_mean_of_exact_path_integrals() -> None:
    """Closed form: the polynomial's gradient integrated by a 20-node rule (exact for its degree),
    averaged over the whole background; independent of the seed."""
    background = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
    nodes, weights = np.polynomial.legendre.leggauss(20)
    alphas, weights = (nodes + 1) / 2, weights / 2
    expected = np.zeros(POLY_X.shape)
    for b in background.astype(np.float64):
        x = POLY_X.astype(np.float64)
        grads = sum(w * _poly_gradient(b + a * (x - b)) for a, w in zip(alphas, weights, strict=True))
        expected += grads * (x - b) / len(background)
    from workers.explain import explain

    got = [
        explain(
            _poly_prep(methods=("expected_gradients",), background=background, seed=seed),
            ("expected_gradients",),
        ).attributions["expected_gradients"]
        for seed in (0, 1)
    ]
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], got[1])


def test_distribution_methods_are_audited_on_every_background_sample() -> None:
    background = np.random.default_rng(4).normal(size=(7, 4)).astype(np.float32)
    report = run_audit(_poly_prep(methods=("expected_gradients",), background=background)).report
    assert report["config"]["background_samples"] == 7
    assert report["config"]["background_given"] == 7
    many = np.zeros((MAX_EXACT_REFERENCES + 5, 4), dtype=np.float32)
    choice = choose_references(many, seed=0)
    assert choice.used == MAX_EXACT_REFERENCES and choice.given == MAX_EXACT_REFERENCES + 5 and choice.sampled


def test_resolution_probe_respects_the_smallest_step_count() -> None:
    """Riemann rules need two nodes: the probe doubles instead of halving to one."""
    params = {"integrated_gradients": {"steps": 2, "quadrature": "riemann_left"}}
    report = run_audit(_poly_prep(methods=("integrated_gradients",), method_params=params)).report
    entry = report["methods"][0]
    assert entry["verdict"] != "not_applicable"
    assert entry["noise_floor"]["discretisation_sigma"] > 0


def test_too_few_steps_is_a_clear_error() -> None:
    from workers.explain import explain
    from xaudit.contract.errors import InvalidInput

    params = {"integrated_gradients": {"steps": 1, "quadrature": "riemann_trapezoid"}}
    result = None
    with pytest.raises(InvalidInput, match="needs steps >= 2"):
        result = explain(
            _poly_prep(methods=("integrated_gradients",), method_params=params), ("integrated_gradients",)
        )
    assert result is None


def test_unaudited_mass_is_the_audits_not_the_methods() -> None:
    """Audit order 2 on v = 2 x1 + 3 x1 x2 - x2 x3 x4: the order-3 effect is unaudited mass, and
    Integrated Gradients (exact on it) drops nothing of what was audited."""
    report = run_audit(_poly_prep(methods=("integrated_gradients",), audit_order=2)).report
    e1, e2, e3 = (np.abs(2 * POLY_X[:, 0]), np.abs(3 * POLY_X[:, 0] * POLY_X[:, 1]),
                  np.abs(POLY_X[:, 1] * POLY_X[:, 2] * POLY_X[:, 3]))  # fmt: skip
    unaudited = report["game"]["unaudited"]
    np.testing.assert_allclose(unaudited["absolute_mass"], e3, rtol=1e-5)
    np.testing.assert_allclose(np.abs(unaudited["net_remainder"]), e3, rtol=1e-5)
    assert unaudited["share"] == pytest.approx(e3.sum() / (e1 + e2 + e3).sum(), rel=1e-5)
    ig = report["methods"][0]
    assert ig["criteria"]["coverage"]["score"] < 1e-4
    from clients._report import verdict_table

    table = verdict_table(report)  # the CLI shows it on its own line, with the intervals' level
    assert f"unaudited (the audit's, not the methods'): {unaudited['share']:.1%}" in table
    assert "intervals: 95% confidence over 2 samples" in table


def test_order_limited_games_report_the_net_remainder(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.audit.runner as runner

    monkeypatch.setattr(runner, "ALL_ORDER_MAX_PLAYERS", 3)  # 4 players: order-limited game
    report = run_audit(_poly_prep(methods=("integrated_gradients",), audit_order=2)).report
    e3 = -POLY_X[:, 1] * POLY_X[:, 2] * POLY_X[:, 3]
    unaudited = report["game"]["unaudited"]
    assert "absolute_mass" not in unaudited  # not enumerated: only the net remainder is known
    np.testing.assert_allclose(unaudited["net_remainder"], e3, rtol=1e-5)
    assert report["methods"][0]["criteria"]["coverage"]["score"] < 1e-4  # was |e3| / mass before


def test_game_checks_compare_with_plain_evaluations() -> None:
    prep = _poly_prep(methods=("integrated_gradients",))
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    full, empty, reference = game_checks(prep, game)
    assert full.passed and empty.passed and reference.passed and full.max_abs_error < 1e-5
    # A game whose v(N) is not the model's output at x fails the check.
    wrong = dataclasses.replace(game, full=game.full + 0.5)
    assert not game_checks(prep, wrong)[0].passed


def test_deep_taylor_bounds_are_the_jobs_not_the_batchs() -> None:
    from workers.explain import explain, job_params
    from workers.methods import AttributionContext, get_method

    gen = torch.Generator().manual_seed(8)
    x = torch.randn(4, 6, generator=gen)
    x[0] *= 5  # the first sample widens the range: a batch without it would get other bounds
    prep = prepare(JobSpec(players="features", device="cpu", methods=("deep_taylor",)),
                   to_onnx(relu_mlp(2), x), None, {"inputs": x.numpy()})  # fmt: skip
    batch = explain(prep, ("deep_taylor",)).attributions["deep_taylor"]
    ctx = AttributionContext(prep.model, prep.players, prep.target, job_params(prep, "deep_taylor"), 0)
    alone = get_method("deep_taylor").attribute(ctx, prep.inputs[2:3], prep.baselines[2:3], prep.classes[2:3])
    np.testing.assert_allclose(alone[0], batch[2], rtol=1e-5, atol=1e-6)


def test_deep_taylor_bounds_hold_across_the_batches_of_a_data_set() -> None:
    from workers.audit.dataset import audit

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(5, 6, generator=gen)
    x[4] *= 5  # only the last batch holds the widest sample
    spec = JobSpec(players="features", device="cpu", methods=("deep_taylor",))
    prep = prepare(spec, to_onnx(relu_mlp(2), x), None, {"inputs": x.numpy()})
    whole, streamed = audit(prep), audit(prep, batch=2)
    params = streamed.report["config"]["methods"][0]["params"]
    assert params["low"] == pytest.approx(float(x.min())) and params["high"] == pytest.approx(float(x.max()))
    assert whole.report["config"]["methods"][0]["params"] == params
    np.testing.assert_allclose(
        streamed.attributions["deep_taylor"], whole.attributions["deep_taylor"], rtol=1e-5, atol=1e-6
    )
