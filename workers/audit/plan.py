"""What an audit will cost before it runs, and how many sets a budget affords.

The cost is counted in model rows: forward passes (the game, perturbation methods) and
forward+backward passes (gradient and rule methods), per sub-input x_T and per sample. Both grow
linearly with the number of sub-inputs u, so a budget (model evaluations or seconds) fixes the
largest u, and from it the number of sets per order (workers.audit.sets). Methods that are functions
of the game (Shapley values, occlusions, Prediction Difference) read their sub-input attributions off
the game and cost no model pass in the audit (workers.subgames).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.audit.sets import ALL_ORDER_MAX_PLAYERS, AuditedSets, choose_sets
from workers.shapley_estimate import MAX_EXACT_PRESENT
from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.contract.params import expected_gradients_steps, parameter_defaults

__all__ = [
    "ALL_ORDER_MAX_PLAYERS",
    "Budget",
    "MethodCost",
    "Plan",
    "Throughput",
    "measure_throughput",
    "plan_audit",
    "sets_for_budget",
]

# Audit constants that enter the cost; the runner uses these same ones (workers.audit.runner).
# Runs under different seeds for stochastic methods (the first is the audited one).
STOCHASTIC_REPEATS = 2
# Sub-inputs per sample re-attributed at half resolution to estimate discretisation noise.
RESOLUTION_PROBES = 64
_GAME_DERIVED = frozenset({"shapley_value", "occlusion_1", "occlusion_patch", "prediction_difference"})
# What the cost depends on, without importing the methods (the planner runs without the engine; a
# test keeps this equal to the methods' capabilities). Parameter defaults: xaudit.contract.params.
DISTRIBUTION_METHODS = frozenset({"expected_gradients", "deepshap", "prediction_difference"})
# workers.methods.references.MAX_EXACT_REFERENCES: background samples a distribution method uses.
MAX_REFERENCES = 64


@dataclass(frozen=True)
class Budget:
    """A cap on the audit's work: model rows (forward or forward+backward), or seconds on this device."""

    evaluations: int = 0
    seconds: float = 0.0

    @property
    def given(self) -> bool:
        return self.evaluations > 0 or self.seconds > 0

    def section(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations or None, "seconds": self.seconds or None}


@dataclass(frozen=True)
class Throughput:
    """Rows per second of the model on this device: plain forward, and forward+backward."""

    forward: float
    backward: float

    def seconds(self, forward_rows: float, backward_rows: float) -> float:
        return forward_rows / self.forward + backward_rows / self.backward


@dataclass(frozen=True)
class MethodCost:
    """Model rows of one method per audited sub-input of one sample (all its references), and on the
    inputs themselves (the map)."""

    name: str
    forward_per_sub_input: float
    backward_per_sub_input: float
    forward_map: float
    backward_map: float
    from_game: bool


@dataclass(frozen=True)
class Plan:
    n: int
    samples: int
    references: int
    sets: AuditedSets | None  # None: every one of the 2^n sub-inputs (exact game)
    sub_inputs: int  # per sample
    methods: tuple[MethodCost, ...]
    budget: Budget
    throughput: Throughput | None

    def _games(self) -> int:
        distribution = any(m.name in DISTRIBUTION_METHODS for m in self.methods)
        return 1 + (self.references if distribution else 0)

    @property
    def game_forward(self) -> float:
        return float(self.samples * self._games() * (self.sub_inputs + 1))

    def method_rows(self, cost: MethodCost) -> tuple[float, float]:
        forward = self.samples * (cost.forward_per_sub_input * self.sub_inputs + cost.forward_map)
        backward = self.samples * (cost.backward_per_sub_input * self.sub_inputs + cost.backward_map)
        return forward, backward

    @property
    def evaluations(self) -> float:
        rows = [self.method_rows(c) for c in self.methods]
        return self.game_forward + sum(f + b for f, b in rows)

    @property
    def seconds(self) -> float | None:
        if self.throughput is None:
            return None
        rows = [self.method_rows(c) for c in self.methods]
        return self.throughput.seconds(self.game_forward + sum(f for f, _ in rows), sum(b for _, b in rows))

    def section(self) -> dict[str, Any]:
        methods = []
        for cost in self.methods:
            forward, backward = self.method_rows(cost)
            entry: dict[str, Any] = {
                "name": cost.name,
                "forward_passes": forward,
                "backward_passes": backward,
                "from_game": cost.from_game,
            }
            if self.throughput is not None:
                entry["estimated_seconds"] = self.throughput.seconds(forward, backward)
            methods.append(entry)
        return {
            "players": self.n,
            "samples": self.samples,
            "sub_inputs_per_sample": self.sub_inputs,
            "sub_inputs": self.sub_inputs * self.samples,
            "sets": None if self.sets is None else self.sets.section(),
            "game_forward_passes": self.game_forward,
            "methods": methods,
            "evaluations": self.evaluations,
            "estimated_seconds": self.seconds,
            "throughput_rows_per_second": None
            if self.throughput is None
            else {"forward": self.throughput.forward, "forward_backward": self.throughput.backward},
            "budget": self.budget.section(),
        }


def _int(params: Mapping[str, Any], key: str) -> int:
    try:
        value = int(str(params[key]))
    except ValueError:
        raise InvalidInput(f"parameter {key}={params[key]!r} is not an integer") from None
    if value < 1:
        raise InvalidInput(f"parameter {key}={value} must be positive")
    return value


def method_cost(name: str, params: Mapping[str, Any], n: int, references: int, present: int) -> MethodCost:
    """Rows per sub-input and for the map, from the method's own parameters."""
    merged = {**parameter_defaults(name), **params}
    refs = references if name in DISTRIBUTION_METHODS else 1
    fwd, bwd = 0.0, 1.0  # one forward+backward: gradients, the LRP rules, DeepLIFT, Grad-CAM
    probes = 0.0  # the resolution probe: RESOLUTION_PROBES sub-inputs at half resolution, per sample
    if name == "expected_gradients" and merged.get("steps") is None:
        merged["steps"] = expected_gradients_steps(refs)
    if name in ("integrated_gradients", "expected_gradients"):
        bwd = float(_int(merged, "steps"))
        probes = RESOLUTION_PROBES * bwd / 2
    elif name == "smoothgrad":
        bwd = float(_int(merged, "samples") * STOCHASTIC_REPEATS)
    elif name == "occlusion_1" or name in ("occlusion_patch", "prediction_difference"):
        fwd, bwd = n + 1.0, 0.0
    elif name == "shapley_value":
        fwd = (
            float(2**present)
            if present <= MAX_EXACT_PRESENT
            else float(_int(merged, "permutations") * (present + 1))
        )
        bwd = 0.0
    from_game = name in _GAME_DERIVED
    per_sub = (0.0, 0.0) if from_game else (fwd * refs, bwd * refs)
    return MethodCost(name, per_sub[0], per_sub[1], fwd * refs, (bwd + probes) * refs, from_game)


def plan_audit(
    n: int,
    samples: int,
    methods: Sequence[str],
    method_params: Mapping[str, Mapping[str, Any]],
    order: int,
    seed: int,
    references: int = 0,
    budget: Budget | None = None,
    throughput: Throughput | None = None,
    present: int | None = None,
) -> Plan:
    """The audit's plan: its sets (sized to ``budget`` when given) and the rows every part costs."""
    budget = budget or Budget()
    present = n if present is None else present
    costs = tuple(method_cost(m, method_params.get(m, {}), n, max(1, references), present) for m in methods)
    order = max(1, min(order, n))
    if n <= ALL_ORDER_MAX_PLAYERS:
        return Plan(n, samples, references, None, 2**n, costs, budget, throughput)
    probe = Plan(n, samples, references, None, 0, costs, budget, throughput)
    sets = sets_for_budget(probe, order, seed) if budget.given else choose_sets(n, order, seed)
    return Plan(n, samples, references, sets, len(sets.subsets), costs, budget, throughput)


def _cost_of(plan: Plan, sub_inputs: int) -> float:
    sized = Plan(
        plan.n, plan.samples, plan.references, None, sub_inputs, plan.methods, plan.budget, plan.throughput
    )
    if plan.budget.seconds > 0:
        seconds = sized.seconds
        if seconds is None:
            raise ResourceExhausted("a budget in seconds needs the model's throughput on this device")
        return seconds
    return sized.evaluations


def sets_for_budget(plan: Plan, order: int, seed: int) -> AuditedSets:
    """The most sets per order (up to enumerating them all) whose sub-inputs fit the budget."""
    limit = plan.budget.seconds if plan.budget.seconds > 0 else float(plan.budget.evaluations)
    n = plan.n
    largest = max(math.comb(n, k) for k in range(1, order + 1))

    def fits(per_order: int) -> tuple[bool, AuditedSets]:
        sets = choose_sets(n, order, seed, per_order)
        return _cost_of(plan, len(sets.subsets)) <= limit, sets

    ok, best = fits(1)
    if not ok:
        need = _cost_of(plan, len(best.subsets))
        unit = "s" if plan.budget.seconds > 0 else " model evaluations"
        raise ResourceExhausted(
            f"budget {limit:g}{unit} is too small: one set per order already needs {need:.3g}{unit}"
        )
    low, high = 1, min(largest, 1 << 20)
    ok, sets = fits(high)
    if ok:
        return sets
    while high - low > max(1, low // 50):  # within 2%: the budget is an estimate anyway
        mid = (low + high) // 2
        ok, sets = fits(mid)
        if ok:
            low, best = mid, sets
        else:
            high = mid
    return best


def measure_throughput(model: Any, inputs: np.ndarray, target: Any, classes: np.ndarray) -> Throughput:
    """Rows per second of a plain forward and of a forward+backward (Gradient x Input) on this device,
    on copies of the first input (median of three short runs)."""
    from workers.methods import AttributionContext, get_method
    from workers.methods._embedding import run_method

    # Large enough that per-call overhead does not dominate, as in the audit's own batches.
    rows = max(1, min(1024, int(getattr(model, "batch_size", 1024) or 1024)))
    batch = np.repeat(inputs[:1], rows, axis=0).astype(np.float32)
    refs = np.zeros_like(batch)
    cls = np.repeat(classes[:1], rows)

    def timed(fn: Any) -> float:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return rows / max(float(np.median(times)), 1e-9)

    forward = timed(lambda: model.predict(batch))
    method = get_method("gradient_x_input")
    ctx = AttributionContext(model, _one_player(inputs.shape[1:]), target, {}, 0)
    backward = timed(lambda: run_method(method, ctx, batch, refs, cls))
    return Throughput(forward, backward)


def _one_player(shape: tuple[int, ...]) -> Any:
    from workers.players import Players

    return Players(np.zeros(shape, dtype=np.int64), ("all",), "all", (1, 1))


def audit_plan(prep: Any, measure: bool = False) -> Plan:
    """The plan of the audit of ``prep`` (a workers.prepare.Prepared): its budget from the job spec;
    the model's throughput measured on this device when ``measure`` or when the budget is in seconds."""
    from workers.methods.references import references_used

    spec, players = prep.spec, prep.players
    budget = Budget(int(spec.budget_evaluations), float(spec.budget_seconds))
    throughput = (
        measure_throughput(prep.model, prep.inputs, prep.target, prep.classes)
        if measure or budget.seconds > 0
        else None
    )
    references = 0 if prep.background is None else references_used(len(prep.background))
    differs = (prep.inputs != prep.baselines).reshape(len(prep.inputs), -1)
    present = max(
        int(
            (
                np.bincount(players.labels.reshape(-1), weights=row.astype(float), minlength=players.n) > 0
            ).sum()
        )
        for row in differs
    )
    return plan_audit(
        players.n,
        len(prep.inputs),
        spec.methods,
        spec.method_params,
        spec.audit_order,
        spec.seed,
        references,
        budget,
        throughput,
        present,
    )
