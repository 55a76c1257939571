"""DeepLIFT with the RevealCancel rule (Shrikumar et al. 2017, section 3.5.3), written here: no
maintained library implements it.

The rules live in :mod:`workers.methods._revealcancel_rules`, the graph walk in
:mod:`workers.methods._revealcancel_graph`. The reference pass runs in float64 once per distinct
reference row (the audit's sub-inputs of one sample share one), the difference and multiplier
passes in float32 (why that is enough: the rules' docstrings); the few rows where float32 cannot
tell a ReLU's difference from zero, whose sign routes the multipliers, are redone in float64. A
graph with sums or concatenations (residual connections) runs as a float64 plan throughout, which
takes every difference in float64 and multiplies the rest in float32 (docs/science.md 5.8).
Attributions are (x - x0) times the input multipliers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.device_budget import budget_scale, equal_parts
from workers.methods._base import AttributionContext, Capabilities, TorchMethod, distinct_references
from workers.targets import Target
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

    from workers.methods._revealcancel_graph import RevealCancelGraph

__all__ = ["DeepLiftRevealCancel", "release_derived", "target_seed"]

CHUNK = 1024  # most rows per pass: an audit call (up to 1,024 sub-inputs) in one pass
# Float32 elements held at once (about 1 GiB): a pass keeps ~8 copies of every node's values
# (the difference, its parts and spread, the ReLU's buffers, multipliers on the way back).
_BUDGET = 2**28
_COPIES = 8
_QUADRATURE = np.polynomial.legendre.leggauss(64)
# Prepared plans per graph and dtype (weights cast once), for as long as the model lives.
_PLANS: weakref.WeakKeyDictionary[Any, dict[torch.dtype, RevealCancelGraph]] = weakref.WeakKeyDictionary()


def target_seed(
    target: Target,
    out: torch.Tensor,
    out0: torch.Tensor,
    *,
    classes: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Multipliers of the raw outputs (k, C) for the target score of ``classes``; ``head``: the
    model's own output Softmax/Sigmoid, which the plan stops before (``out`` is its input).

    For a logit target this is the one-hot vector. Probabilities and log-odds are a softmax of all
    outputs, which no DeepLIFT rule covers, and so is a model's own head; their multipliers are the
    gradient averaged along the straight path from out0 to out (Gauss-Legendre, 64 nodes), which
    keeps summation-to-delta. All nodes go through the transform in one batch (it acts row by row).
    """
    import torch

    onehot = torch.zeros_like(out).scatter_(1, classes[:, None], 1.0)
    if target.kind == "logit" and head is None:
        return onehot

    def transform(z: torch.Tensor) -> torch.Tensor:
        return target.transform(z if head is None else head(z).reshape(z.shape[0], -1))

    nodes, weights = (torch.as_tensor(a, dtype=out.dtype, device=out.device) for a in _QUADRATURE)
    t = ((nodes + 1) / 2)[:, None, None]
    z = (out0 + t * (out - out0)).reshape(-1, out.shape[1]).detach().requires_grad_(True)
    with torch.enable_grad():
        value = (transform(z).reshape(len(nodes), *out.shape) * onehot).sum()
        (grad,) = torch.autograd.grad(value, z)
    return torch.einsum("n,nkc->kc", weights / 2, grad.reshape(len(nodes), *out.shape))


class DeepLiftRevealCancel(TorchMethod):
    name = "deeplift_revealcancel"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="single", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "deeplift_revealcancel"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = (
        "splits effects within same-sign groups and halves them across positive/negative groups"
    )

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        import torch

        from workers.methods._revealcancel_graph import Reference

        self.params(ctx)  # refuses unknown parameters (there are none)
        graph = ctx.model.torch_hookable(self.name)
        plan = _plan(graph, self.name, None)
        device = inputs.device
        per_row = plan.elements_per_row(tuple(inputs.shape[1:]), device)
        wide = 2 if plan.dtype == torch.float64 else 1  # _BUDGET counts float32 elements
        budget = _BUDGET * budget_scale(device)  # larger on a GPU (workers.device_budget)
        chunk = equal_parts(len(inputs), max(1, min(CHUNK, budget // (_COPIES * per_row * wide))))
        firsts, rows = distinct_references(baselines)
        x0 = firsts.to(torch.float64)  # float32 to float64 is exact
        ref = plan.reference(x0, rows)
        # x - x0 rounded once to float32 (a float32 subtraction is the exact difference, rounded),
        # or taken in float64 from the exact float32 values.
        dx_all = inputs.to(plan.dtype) - baselines.to(plan.dtype)
        out = torch.empty(inputs.shape, dtype=torch.float32, device=device)
        redo: list[torch.Tensor] = []
        with torch.no_grad():
            for start in range(0, inputs.shape[0], chunk):
                part = slice(start, start + chunk)
                dx = dx_all[part]
                seed = partial(target_seed, ctx.target, classes=classes[part], head=plan.head)
                m, shaky = plan.multipliers(dx, Reference(ref.values, rows[part]), seed)
                out[part] = dx * m
                if shaky is not None:
                    redo.append(torch.nonzero(shaky).flatten() + start)
            if redo and len(again := torch.cat(redo)):
                # Float64 only for rows where float32 could not tell a ReLU difference from zero.
                exact = _plan(graph, self.name, torch.float64)
                dx = inputs[again].double() - baselines[again].double()
                seed = partial(target_seed, ctx.target, classes=classes[again], head=exact.head)
                m, _ = exact.multipliers(dx, Reference(ref.values, rows[again]), seed)
                out[again] = (dx * m).float()
        return out


def release_derived() -> None:
    """Forget every graph's prepared plans (workers.methods.release_derived)."""
    _PLANS.clear()


def _plan(graph: Any, method: str, dtype: torch.dtype | None) -> RevealCancelGraph:
    """The plan of ``graph`` in ``dtype``; None: float32, or float64 for a graph with sums,
    concatenations or data movement (docs/science.md 5.8)."""
    import torch

    from workers.methods._fx_plan import family_plan
    from workers.methods._revealcancel_graph import RevealCancelGraph, needs_float64

    plans = _PLANS.setdefault(graph, {})
    if dtype is None:
        dtype = torch.float64 if needs_float64(family_plan(graph, method, "RevealCancel")) else torch.float32
    if dtype not in plans:
        plans[dtype] = RevealCancelGraph(graph, method, dtype)
    return plans[dtype]
