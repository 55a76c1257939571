"""The cost of an audit as text (``xaudit audit --plan``), from the plan section of workers.audit.plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["plan_text"]


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def plan_text(plan: Mapping[str, Any]) -> str:
    lines = [
        f"players: {plan['players']}   samples: {plan['samples']}   "
        f"sub-inputs: {_count(plan['sub_inputs_per_sample'])} per sample, {_count(plan['sub_inputs'])} in all",
    ]
    sets = plan.get("sets")
    if sets is None:
        lines.append("sets: every set of every order (exact game over all 2^n sub-inputs)")
    else:
        parts = [
            f"order {row['order']}: {'all ' if row['exhaustive'] else ''}{_count(row['audited'])}"
            + ("" if row["exhaustive"] else f" of {_count(row['sets'])} (sampled, seed {sets['seed']})")
            for row in sets["by_order"]
        ]
        lines.append("sets: " + "; ".join(parts))
    lines.append("")
    lines.append(f"{'part':<24} {'forward':>14} {'fwd+backward':>14} {'est. time':>10}")
    lines.append(f"{'masking game':<24} {_count(plan['game_forward_passes']):>14} {'0':>14} {'':>10}")
    for method in plan["methods"]:
        note = " (from game)" if method["from_game"] else ""
        lines.append(
            f"{(method['name'] + note):<24} {_count(method['forward_passes']):>14} "
            f"{_count(method['backward_passes']):>14} {_time(method.get('estimated_seconds')):>10}"
        )
    lines.append("")
    lines.append(
        f"model evaluations: {_count(plan['evaluations'])}   estimated time: {_time(plan['estimated_seconds'])}"
    )
    rates = plan.get("throughput_rows_per_second")
    if rates:
        lines.append(
            f"measured on this device: {_count(rates['forward'])} forward rows/s, "
            f"{_count(rates['forward_backward'])} forward+backward rows/s"
        )
    budget = plan.get("budget") or {}
    if budget.get("evaluations") or budget.get("seconds"):
        cap = (
            f"{_count(budget['evaluations'])} evaluations"
            if budget.get("evaluations")
            else _time(budget["seconds"])
        )
        lines.append(f"budget: {cap}")
    return "\n".join(lines)
