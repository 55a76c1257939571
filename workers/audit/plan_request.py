"""PlanAudit's answer: what an audit would cost, computed from the request alone (no model).

The players come from the inputs' shape and the player spec, the sets and passes from
workers.audit.plan; nothing is recorded and no job starts. The service does not import this: the
CLI hands it to the server as its planner (docs/architecture.md), so the arrows stay one-way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from workers.audit.plan import MAX_REFERENCES, Budget, plan_audit
from workers.players import parse_players
from xaudit.contract.spec import JobSpec
from xaudit.v1 import audit_pb2

__all__ = ["plan_request"]


def plan_request(spec: JobSpec, tensors: Mapping[str, np.ndarray]) -> audit_pb2.AuditPlan:
    inputs = tensors["inputs"]
    players = parse_players(
        spec.players,
        tuple(inputs.shape[1:]),
        player_mask=tensors.get("player_mask"),
        player_groups=tensors.get("player_groups"),
        group_names=spec.group_names,
    )
    background = tensors.get("background")
    references = 0 if background is None else min(len(background), MAX_REFERENCES)
    # Seconds need the worker's throughput: the worker sizes those; here the default sets.
    budget = Budget(evaluations=int(spec.budget_evaluations))
    plan = plan_audit(
        players.n,
        len(inputs),
        spec.methods,
        spec.method_params,
        spec.audit_order,
        spec.seed,
        references,
        budget,
        present=_present(inputs, players.labels, players.n),
    )
    strata = [] if plan.sets is None else plan.sets.strata
    return audit_pb2.AuditPlan(
        players=players.n,
        samples=len(inputs),
        sub_inputs_per_sample=plan.sub_inputs,
        sub_inputs=plan.sub_inputs * len(inputs),
        strata=[
            audit_pb2.PlanStratum(
                order=s.order, sets=s.population, audited=s.sampled, exhaustive=s.exhaustive
            )
            for s in strata
        ],
        seed=spec.seed,
        game_forward_passes=plan.game_forward,
        methods=[
            audit_pb2.PlanMethod(
                name=cost.name,
                forward_passes=plan.method_rows(cost)[0],
                backward_passes=plan.method_rows(cost)[1],
                from_game=cost.from_game,
            )
            for cost in plan.methods
        ],
        evaluations=plan.evaluations,
        sized_by_worker=spec.budget_seconds > 0,
    )


def _present(inputs: np.ndarray, labels: np.ndarray, n: int) -> int:
    """Most players of one sample that differ from a zero reference (an upper bound for Shapley's cost)."""
    flat = (inputs.reshape(len(inputs), -1) != 0).astype(np.float64)
    return max(int((np.bincount(labels.reshape(-1), weights=row, minlength=n) > 0).sum()) for row in flat)
