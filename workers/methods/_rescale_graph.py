"""DeepLIFT with the Rescale rule as one forward at the inputs, one at the distinct references, and
one backward pass over the fx plan (docs/science.md 5.8).

Each ReLU keeps its value and takes Captum's multiplier as its gradient:
``(relu(z) - relu(z0)) / (z - z0)``, or the ReLU's gradient where ``|z - z0| < 1e-10`` (Captum's
``eps``). A ReLU6, SiLU and Hardswish take the same Rescale multiplier of their own functions (the
paper's rule for any nonlinearity; Captum, which does not list them, would pass their gradients:
docs/science.md 5.8); SiLU also where the exporter wrote it as ``x * sigmoid(x)``.
Linear, Conv, pooling and reshapes are linear: their gradient is their multiplier. The target's
softmax (probability, log-odds) is crossed by its gradient at the input, as Captum does
through the wrapped model. Attributions are ``(x - x0) * multiplier``, Captum's DeepLift with
``multiply_by_inputs=True``. Sums, concatenations, data movement (Transpose, Slice, Split) and
eval-mode batch norms are linear too, and Captum passes them by the chain rule, as this pass does.

Max-pooling passes its gradient: the max-pool mode of DeepLIFT's reference implementation (the
only one it implements), of this package's RevealCancel, and what Captum's DeepLift delivers on
real networks (docs/science.md 5.8). With a reference that changes a window's maximum, the
attributions then need not add up to f(x) - f(x0), and the audit is meant to show it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from workers.methods._base import at_references, distinct_references
from workers.methods._fx_plan import ACTIVATIONS, Plan, elementwise, evaluate, family_plan
from workers.methods._reroute import rerouted
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

__all__ = ["EPS", "RescaleGraph"]

EPS = 1e-10  # Captum's DeepLift eps: below it a ReLU's input change counts as none


class RescaleGraph:
    """A plan of ReLU, Linear/Conv, pooling, merge, data-movement and reshape nodes; :meth:`build`
    gives None for the graphs left to Captum (an operator the plan refuses)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.relus = [s for s in plan.steps if s.kind in (*ACTIVATIONS, "quantize", "gated")]

    @staticmethod
    def refusal(graph: nn.Module, method: str) -> str | None:
        """Why this pass cannot run on ``graph`` (the operator it has no rule for); None where it can."""
        planned = _plan_or_refusal(graph, method)
        return planned if isinstance(planned, str) else None

    @classmethod
    def build(cls, graph: nn.Module, method: str) -> RescaleGraph | None:
        planned = _plan_or_refusal(graph, method)
        return None if isinstance(planned, str) else cls(planned)

    def attributions(
        self, x: torch.Tensor, x0: torch.Tensor, target: Target, classes: torch.Tensor
    ) -> torch.Tensor:
        """(x - x0) times the Rescale multipliers of the target score of ``classes``."""
        refs, runs = distinct_references(x0)
        with torch.no_grad():
            env0 = evaluate(self.plan, refs)

        def at_reference(node: fx.Node, like: torch.Tensor) -> torch.Tensor:
            return at_references(env0[node], like.shape, len(refs), runs, len(x))

        def rescaled(z: torch.Tensor, step: Any) -> torch.Tensor:
            with torch.no_grad():  # in place on two temporaries: new tensors cost more than arithmetic
                y = torch.relu(z) if step.kind == "relu" else elementwise(step)(z)
                delta_in = z - at_reference(step.source, z)
                multiplier = torch.sub(y, at_reference(step.node, y)).div_(delta_in)
                unchanged = delta_in.abs_() < EPS
                if step.kind == "relu":
                    gradient = torch.sign(y, out=delta_in)  # the ReLU's own gradient: 1 where z > 0, else 0
                elif step.kind == "clip":  # a clamp to [0, c]: 1 strictly inside
                    gradient = ((z > 0) & (z < step.module.max_val)).to(z.dtype)
                elif bool(unchanged.any()):  # SiLU, Hardswish: their derivative, by autograd
                    gradient = _derivative(elementwise(step), z)
                else:
                    gradient = multiplier
                multiplier = torch.where(unchanged, gradient, multiplier, out=multiplier)
            return rerouted(y, z, multiplier)

        replace = {s.node: (lambda z, s=s: rescaled(z, s)) for s in self.relus}
        x = x.detach().requires_grad_(True)
        out = evaluate(self.plan, x, replace)[self.plan.output]
        scores = out.reshape(out.shape[0], -1)
        if target.kind != "logit":
            scores = target.transform(scores)
        (grad,) = torch.autograd.grad(scores.gather(1, classes[:, None]).sum(), x)
        return (x.detach() - x0) * grad


def _derivative(function: Any, z: torch.Tensor) -> torch.Tensor:
    """The derivative of an elementwise ``function`` at ``z``."""
    with torch.enable_grad():
        at = z.detach().requires_grad_(True)
        (slope,) = torch.autograd.grad(function(at).sum(), at)
    return slope


def _plan_or_refusal(graph: nn.Module, method: str) -> Plan | str:
    """The DeepLIFT plan of ``graph``, or the reason it has none (the operator without a rule)."""
    try:
        return family_plan(graph, method, "DeepLIFT")
    except NotApplicable as exc:
        return exc.reason
