"""Running a Zennit composite on a hookable graph, with the relevance seeded by the target score.

The reference for :mod:`workers.methods._modified_backward` (its tests compare the two), and the path
for the rare graphs that module leaves to Zennit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workers.light_imports import zennit as _light_zennit
from workers.methods._base import AttributionContext, in_row_chunks
from workers.methods._fx_plan import Plan, plan_graph
from workers.methods._modified_backward import output_path
from workers.methods._passes import rows_per_pass

_light_zennit()  # before any zennit import: keeps torchvision out
from zennit.attribution import Gradient  # noqa: E402
from zennit.core import Composite, Hook  # noqa: E402
from zennit.rules import Norm, Pass  # noqa: E402

__all__ = ["AffineRule", "lrp_relevance"]

# The hook for the i-th Linear/Conv layer in execution order.
AffineRule = Callable[[int, torch.nn.Module], Hook]


def _composite(plan: Plan, rule: AffineRule) -> Composite:
    """Linear/Conv layers get ``rule``; average pooling LRP-0 (Zennit's Norm, as in its own
    composites); ReLU6 and quantize-dequantize pairs Zennit's Pass (as its composites give every
    activation); ReLU, reshapes and max-pooling the gradient, which passes relevance through."""
    affine = [s.module for s in output_path(plan) if s.kind == "affine"]  # indexed as the own pass does
    pools = [s.module for s in plan.steps if s.kind == "avgpool"]
    clips = [s.module for s in plan.steps if s.kind in ("clip", "quantize")]

    def mapping(ctx: dict[str, Any], name: str, module: torch.nn.Module) -> Hook | None:
        for i, layer in enumerate(affine):
            if module is layer:
                return rule(i, module)
        if any(module is pool for pool in pools):
            return Norm()
        return Pass() if any(module is clip for clip in clips) else None

    return Composite(module_map=mapping)


def lrp_relevance(
    ctx: AttributionContext,
    method: str,
    rule: AffineRule,
    inputs: torch.Tensor,
    classes: torch.Tensor,
) -> torch.Tensor:
    """Input relevance (k, *shape) for the target class of each row.

    The output relevance is the one-hot target score (one-hot times the target value), so relevance
    is in the target's units and a conservative rule makes it sum to the target value.
    """
    graph = ctx.model.torch_hookable(method)
    plan = plan_graph(
        graph, method, "LRP", clips=True, quantized=True
    )  # Zennit would silently use the gradient elsewhere
    model = ctx.target.wrap(graph)
    # The one-pass rules' bound (the hooks store as much), probed before the hooks are on.
    rows = rows_per_pass(inputs, graph)
    # Hooks registered once for all chunks (registration walks every module).
    with torch.enable_grad(), Gradient(model=model, composite=_composite(plan, rule)) as attributor:

        def relevance(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            def seed(output: torch.Tensor) -> torch.Tensor:
                onehot = torch.zeros_like(output).scatter_(1, c[:, None], 1.0)
                return onehot * output.detach()

            _, relevance = attributor(x.requires_grad_(True), seed)
            return relevance

        return in_row_chunks(rows, relevance, classes, inputs)
