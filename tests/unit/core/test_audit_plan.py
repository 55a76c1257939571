"""The audit's plan: costs counted from the sets and the methods' parameters, budgets respected."""

from __future__ import annotations

import pytest

from clients.cli.options import parse_budget
from clients.cli.plan import plan_text
from workers.audit import plan as plan_module
from workers.audit.plan import Budget, Throughput, plan_audit
from xaudit.contract.errors import InvalidInput, ResourceExhausted

METHODS = ("integrated_gradients", "deeplift_rescale", "gradient_x_input", "occlusion_1", "shapley_value")


def test_costs_follow_the_sets_and_the_parameters() -> None:
    plan = plan_audit(64, 4, METHODS, {"integrated_gradients": {"steps": 32}}, 3, seed=0)
    assert plan.sub_inputs == 1 + 64 + 2016 + 2048  # orders 1, 2 enumerated, 2048 triples sampled
    section = plan.section()
    rows = {m["name"]: m for m in section["methods"]}
    ig = rows["integrated_gradients"]
    assert ig["backward_passes"] == 4 * (32 * plan.sub_inputs + 32 + 64 * 16)  # sub-inputs, map, probes
    assert rows["occlusion_1"]["from_game"] and rows["occlusion_1"]["backward_passes"] == 0
    assert section["game_forward_passes"] == 4 * (plan.sub_inputs + 1)
    assert plan.seconds is None and section["estimated_seconds"] is None
    exact = plan_audit(8, 4, METHODS, {}, 3, seed=0)
    assert exact.sets is None and exact.sub_inputs == 256


def test_budget_in_evaluations_is_respected() -> None:
    full = plan_audit(64, 4, METHODS, {}, 3, seed=0)
    budget = Budget(evaluations=int(full.evaluations / 3))
    capped = plan_audit(64, 4, METHODS, {}, 3, seed=0, budget=budget)
    assert capped.evaluations <= budget.evaluations
    assert capped.evaluations > 0.8 * budget.evaluations  # uses most of it
    assert capped.sets is not None and capped.sets.sampled
    assert capped.sets.section()["by_order"][1]["exhaustive"] is False
    with pytest.raises(ResourceExhausted, match="too small"):
        plan_audit(64, 4, METHODS, {}, 3, seed=0, budget=Budget(evaluations=1000))


def test_budget_in_seconds_uses_the_throughput() -> None:
    rates = Throughput(forward=1e5, backward=1e4)
    capped = plan_audit(64, 4, METHODS, {}, 3, seed=0, budget=Budget(seconds=60.0), throughput=rates)
    assert capped.seconds is not None and 50.0 < capped.seconds <= 60.0
    text = plan_text(capped.section())
    assert "order 3:" in text and "sampled, seed 0" in text and "estimated time" in text


def test_budget_option() -> None:
    assert parse_budget("") == (0, 0.0)
    assert parse_budget("2e6") == (2_000_000, 0.0)
    assert parse_budget("600s") == (0, 600.0)
    assert parse_budget("10m") == (0, 600.0)
    for bad in ("-5", "abc", "0", "nans"):
        with pytest.raises(InvalidInput, match="--budget"):
            parse_budget(bad)


def test_cost_table_matches_the_methods() -> None:
    from workers.methods import ALL_METHODS, get_method

    for name in ALL_METHODS:
        method = get_method(name)
        assert (name in plan_module.DISTRIBUTION_METHODS) == (method.capabilities.baseline == "distribution")
    from workers.methods.references import MAX_EXACT_REFERENCES

    assert plan_module.MAX_REFERENCES == MAX_EXACT_REFERENCES
