"""Expected Gradients (Erion et al. 2021): Integrated Gradients averaged over references drawn from data.

The constituent for one reference b is Integrated Gradients from b with a fixed quadrature (the
expectation over alpha ~ U(0, 1) is an integral, so quadrature computes it without sampling noise);
:func:`workers.methods.attribute` averages the constituents over the background set, every sample of
it up to :data:`workers.methods.references.MAX_EXACT_REFERENCES` (docs/science.md, section 5.5).
The result is deterministic: the audit judges the expectation, not a Monte Carlo draw of it.
Quadrature nodes per reference default to :func:`xaudit.contract.params.expected_gradients_steps`
of the number of references averaged (64 over one, 8 from eight up), fixed once per job by :meth:`bind`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, TorchMethod
from workers.methods.integrated_gradients import min_steps, path_integral
from workers.methods.references import references_used
from xaudit.contract.params import expected_gradients_steps, parameter_defaults

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

__all__ = ["ExpectedGradients"]


class ExpectedGradients(TorchMethod):
    name = "expected_gradients"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="distribution", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "expected_gradients"
    )  # declared in xaudit.contract.params
    resolution: ClassVar[str | None] = "steps"
    paper_context: ClassVar[str] = "Integrated Gradients averaged over baselines drawn from data"

    def min_resolution(self, params: Mapping[str, Any]) -> int:
        return min_steps(str(self.params_from(params)["quadrature"]))

    def bind(
        self, params: Mapping[str, Any], inputs: np.ndarray, references: tuple[np.ndarray, ...]
    ) -> dict[str, Any]:
        """``references``: (baselines, background); steps from the background samples averaged."""
        bound = dict(params)
        if bound.get("steps") is None:
            used = references_used(len(references[-1])) if len(references) > 1 else 1
            bound["steps"] = expected_gradients_steps(used)
        return bound

    def passes_per_row(self, params: Mapping[str, Any]) -> int:
        return _steps(self.params_from(params))

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        p = self.params(ctx)
        return path_integral(ctx, self.name, _steps(p), str(p["quadrature"]), inputs, baselines, classes)


def _steps(params: Mapping[str, Any]) -> int:
    """Nodes per reference; unbound (one constituent run on its own): a single reference's."""
    return expected_gradients_steps(1) if params["steps"] is None else int(params["steps"])
