"""DeepLIFT with the RevealCancel rule (Shrikumar et al. 2017, section 3.5.3), written here: no
maintained library implements it.

The rules live in :mod:`workers.methods._revealcancel_rules`, the graph walk in
:mod:`workers.methods._revealcancel_graph`. Everything runs in float64 so that the differences
the rule divides stay exact; attributions are (x - x0) times the input multipliers.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method
from workers.targets import Target
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

__all__ = ["DeepLiftRevealCancel", "target_seed"]

CHUNK = 256  # most rows per pass
# Float64 elements held at once (about 1 GiB): a pass keeps ~6 copies of every node's values
# (at x and x0, the difference, its two parts, a multiplier).
_BUDGET = 2**27
_COPIES = 6
_QUADRATURE = np.polynomial.legendre.leggauss(64)


def target_seed(
    target: Target, out: torch.Tensor, out0: torch.Tensor, *, classes: torch.Tensor
) -> torch.Tensor:
    """Multipliers of the raw outputs (k, C) for the target score of ``classes``.

    For a logit target this is the one-hot vector. Probabilities and log-odds are a softmax of all
    outputs, which no DeepLIFT rule covers; their multipliers are the gradient averaged along the
    straight path from out0 to out (Gauss-Legendre, 64 nodes), which keeps summation-to-delta.
    """
    import torch

    onehot = torch.zeros_like(out).scatter_(1, classes[:, None], 1.0)
    if target.kind == "logit":
        return onehot
    nodes, weights = _QUADRATURE
    seed = torch.zeros_like(out)
    for t, w in zip((nodes + 1) / 2, weights / 2, strict=True):
        z = (out0 + float(t) * (out - out0)).detach().requires_grad_(True)
        with torch.enable_grad():
            value = (target.transform(z) * onehot).sum()
            (grad,) = torch.autograd.grad(value, z)
        seed += float(w) * grad
    return seed


class DeepLiftRevealCancel(Method):
    name = "deeplift_revealcancel"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="single", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "deeplift_revealcancel"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = (
        "splits effects within same-sign groups and halves them across positive/negative groups"
    )

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        import torch

        from workers.methods._revealcancel_graph import RevealCancelGraph

        self.params(ctx)  # refuses unknown parameters (there are none)
        plan = RevealCancelGraph(ctx.model.torch_hookable(self.name), self.name)
        device = ctx.model.device
        per_row = plan.elements_per_row(tuple(inputs.shape[1:]), device)
        chunk = max(1, min(CHUNK, _BUDGET // (_COPIES * per_row)))
        out: list[np.ndarray] = []
        for start in range(0, inputs.shape[0], chunk):
            rows = slice(start, start + chunk)
            x = torch.as_tensor(np.asarray(inputs[rows], dtype=np.float64), device=device)
            x0 = torch.as_tensor(np.asarray(baselines[rows], dtype=np.float64), device=device)
            c = torch.as_tensor(classes[rows], dtype=torch.long, device=device)
            with torch.no_grad():
                m = plan.multipliers(x, x0, partial(target_seed, ctx.target, classes=c))
            out.append(((x - x0) * m).cpu().numpy())
        return np.concatenate(out).astype(np.float32)
