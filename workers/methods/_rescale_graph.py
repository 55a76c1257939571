"""DeepLIFT with the Rescale rule as one forward at the inputs, one at the distinct references, and
one backward pass over the fx plan (docs/science.md 5.8).

Each ReLU keeps its value and takes Captum's multiplier as its gradient:
``(relu(z) - relu(z0)) / (z - z0)``, or the ReLU's gradient where ``|z - z0| < 1e-10`` (Captum's
``eps``). Linear, Conv, pooling and reshapes are linear: their gradient is their multiplier. The
target's softmax (probability, log-odds) is crossed by its gradient at the input, as Captum does
through the wrapped model. Attributions are ``(x - x0) * multiplier``, Captum's DeepLift with
``multiply_by_inputs=True``. Sums, concatenations and data movement (Transpose, Slice, Split) are
linear too, and Captum passes them by the chain rule, as this pass does.

Max-pooling takes DeepLIFT's max-pool rule as Captum writes it (:class:`_MaxPoolRescale`), made to
add up: each pooled output's difference goes back to the inputs its window picked at x and at x0,
so the multipliers satisfy summation-to-delta. Captum's own DeepLift does not deliver that rule
(docs/science.md 5.8): where a max-pool's input is a ReLU's output, the ReLU's hook takes the
gradient before the pool's hook has replaced it, so the pool passes its plain gradient; its
unpooling writes rather than adds where windows overlap; and the gradient it mixes in from the
reference half of its doubled batch is the reference's own (this pass carries the input's alone:
the chain rule of one set of multipliers).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from workers.methods._base import distinct_references
from workers.methods._fx_plan import Plan, evaluate, plan_graph
from workers.methods._reroute import rerouted
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

__all__ = ["EPS", "RescaleGraph"]

EPS = 1e-10  # Captum's DeepLift eps: below it a ReLU's input change counts as none


_POOLS: dict[type[nn.Module], Any] = {
    nn.MaxPool1d: F.max_pool1d,
    nn.MaxPool2d: F.max_pool2d,
    nn.MaxPool3d: F.max_pool3d,
}


class _MaxPoolRescale(torch.autograd.Function):
    """DeepLIFT's max-pool multipliers for input ``z`` against reference ``z0``, given the gradient
    ``g`` at the pool's output: with ``m = max(y, y0)``, output ``j`` sends ``g_j (m_j - y0_j)`` to
    the input its window picks at ``z`` and ``g_j (y_j - m_j)`` to the one it picks at ``z0``; an
    input's multiplier is what it received over ``z - z0`` (together ``g_j (y_j - y0_j)``), or the
    pool's own gradient where ``|z - z0| < eps`` (an input with ``z = z0`` receives nothing: a
    window that picks it at one point has at least its value at the other)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, z0: torch.Tensor, pool: nn.Module) -> torch.Tensor:
        pool_fn = _POOLS[type(pool)]
        shape = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        y, picked = pool_fn(z, *shape, return_indices=True)
        y0, picked0 = pool_fn(z0, *shape, return_indices=True)
        if len(y0) != len(y):  # one reference for every row: pooled once
            y0, picked0 = y0.expand_as(y), picked0.expand_as(picked)
        ctx.save_for_backward(z, z0, y, y0, picked, picked0)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        z, z0, y, y0, picked, picked0 = ctx.saved_tensors

        def gathered(values: torch.Tensor, where: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
            # into the inputs each output picked (indices within each channel's plane); where windows
            # overlap and pick the same input, the shares add up
            return into.scatter_add_(2, where.flatten(2), values.flatten(2))

        top = torch.maximum(y, y0)
        flat = torch.zeros_like(z).flatten(2)
        received = gathered(g * (y - top), picked0, gathered(g * (top - y0), picked, flat)).view_as(z)
        own = gathered(g, picked, torch.zeros_like(z).flatten(2)).view_as(z)
        delta_in = z - z0
        return torch.where(delta_in.abs() < EPS, own, received / delta_in), None, None


class RescaleGraph:
    """A plan of ReLU, Linear/Conv, pooling, merge, data-movement and reshape nodes; :meth:`build`
    gives None for the graphs left to Captum (an operator the plan refuses)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.relus = [s for s in plan.steps if s.kind == "relu"]
        self.pools = [s for s in plan.steps if s.kind == "maxpool"]

    @classmethod
    def build(cls, graph: nn.Module, method: str) -> RescaleGraph | None:
        try:
            plan = plan_graph(graph, method, "DeepLIFT", merges=True, moves=True)
        except NotApplicable:
            return None
        if any(s.kind == "maxpool" and type(s.module) not in _POOLS for s in plan.steps):
            return None
        return cls(plan)

    def attributions(
        self, x: torch.Tensor, x0: torch.Tensor, target: Target, classes: torch.Tensor
    ) -> torch.Tensor:
        """(x - x0) times the Rescale multipliers of the target score of ``classes``."""
        refs, runs = distinct_references(x0)
        rows = None if len(refs) == len(x0) else runs  # every row its own reference: no gather
        with torch.no_grad():
            env0 = evaluate(self.plan, refs)

        def at_reference(node: fx.Node) -> torch.Tensor:
            value: torch.Tensor = env0[node]
            return value if rows is None or len(value) == 1 else value[rows]  # one reference broadcasts

        def rescaled(z: torch.Tensor, step: Any) -> torch.Tensor:
            with torch.no_grad():  # in place on two temporaries: new tensors cost more than arithmetic
                y = torch.relu(z)
                delta_in = z - at_reference(step.source)
                multiplier = torch.sub(y, at_reference(step.node)).div_(delta_in)
                unchanged = delta_in.abs_() < EPS
                gradient = torch.sign(y, out=delta_in)  # the ReLU's own gradient: 1 where z > 0, else 0
                multiplier = torch.where(unchanged, gradient, multiplier, out=multiplier)
            return rerouted(y, z, multiplier)

        def pooled(z: torch.Tensor, step: Any) -> torch.Tensor:
            out: torch.Tensor = _MaxPoolRescale.apply(z, at_reference(step.source), step.module)
            return out

        replace = {s.node: (lambda z, s=s: rescaled(z, s)) for s in self.relus}
        replace.update({s.node: (lambda z, s=s: pooled(z, s)) for s in self.pools})
        x = x.detach().requires_grad_(True)
        out = evaluate(self.plan, x, replace)[self.plan.output]
        scores = out.reshape(out.shape[0], -1)
        if target.kind != "logit":
            scores = target.transform(scores)
        (grad,) = torch.autograd.grad(scores.gather(1, classes[:, None]).sum(), x)
        return (x.detach() - x0) * grad
