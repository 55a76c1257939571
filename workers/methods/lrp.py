"""Layer-wise Relevance Propagation (Bach et al. 2015) and Deep Taylor decomposition (Montavon et al.
2017) on the hookable graph: Zennit's rules as one modified backward pass
(:mod:`workers.methods._modified_backward`; Zennit itself where that pass has no form for a rule).

Rules are declared for Linear/Conv layers; average pooling gets LRP-0 (Zennit's Norm); ReLU,
flatten, reshape and max-pooling keep Zennit's default (the gradient), which passes relevance
through; ReLU6, SiLU, Hardswish, GELU and tanh pass it unchanged, and sigmoid gates, attention
weights and layer norms' scales are held constant (transformers: Ali et al. 2022). Graphs with
any other operator on the input's path are refused (NotApplicable); the layer kinds and their rules
are in :mod:`workers.methods._fx_plan` and docs/science.md 5.8. For probability or log-odds targets
the softmax sits above the graph and relevance crosses it by its gradient (no LRP rule covers it), as
it crosses a Softmax or Sigmoid that is the model's own output, so relevance is then no longer
conservative. Relevance starts as the target score of the explained class, so it is in the target's
units.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, TorchMethod
from xaudit.contract.errors import InvalidInput
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # the catalogue loads neither torch nor zennit
    import torch

    from workers.methods._lrp_rules import LayerRule
    from workers.models.base import ModelAdapter

__all__ = ["DeepTaylor", "LrpAlphaBeta", "LrpEpsilon", "LrpMethod"]

_CAPABILITIES = Capabilities(gradients=True, hooks=True, baseline="none", stochastic=False)


class LrpMethod(TorchMethod):
    """What the three LRP-family methods share: the plan they run on (:meth:`check_plan`, which
    `xaudit inspect` asks too), and the report's word on what the pass holds constant (gates, layer
    norms, attention weights) and on a model's output head (its Softmax, LogSoftmax or Sigmoid)
    crossed by its gradient."""

    # The first layer's rule needs the input itself (Deep Taylor's z-beta).
    first_layer_needs_input: ClassVar[bool] = False

    def check_plan(self, graph: Any) -> None:
        """NotApplicable where this method has no rule for ``graph`` (a hookable torch graph)."""
        from workers.methods._modified_backward import lrp_plan

        lrp_plan(graph, self.name, self.first_layer_needs_input)

    def implementation(self, model: ModelAdapter) -> str | None:
        from workers.methods._embedding import graph_model
        from workers.methods._fx_plan import crossed_head, held_constant
        from xaudit.contract.errors import NotApplicable

        try:
            graph = graph_model(model).torch_hookable(self.name, row_by_row=True)
        except NotApplicable:
            return None  # the method does not run at all; its entry says why
        said = held_constant(graph, self.name) + crossed_head(graph, self.name, "LRP")
        return f"xaudit's LRP pass{said}" if said else None


class LrpEpsilon(LrpMethod):
    """LRP-epsilon on every Linear/Conv layer (bias kept in the denominator, as in Bach et al. eq. 58).

    ``epsilon`` defaults to 1e-6, a stabiliser only: with it LRP-epsilon on a ReLU network is
    Gradient x Input up to the relevance that biases absorb (Ancona et al. 2018), the reading of
    Deng et al.'s Table 1. Larger values (e.g. 0.25) damp weak contributions; pass them explicitly.
    """

    name = "lrp_epsilon"
    capabilities = _CAPABILITIES
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "lrp_epsilon"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "first-order Taylor term only, like Gradient x Input; drops interactions"

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        epsilon = float(self.params(ctx)["epsilon"])
        if epsilon < 0:
            raise InvalidInput(f"{self.name}: epsilon must be >= 0, got {epsilon}")

        from workers.methods._lrp_rules import Epsilon  # torch only when computing
        from workers.methods._modified_backward import lrp_relevance

        def rule(index: int) -> LayerRule:
            return Epsilon(epsilon)

        return lrp_relevance(ctx, self.name, rule, inputs, classes)


class LrpAlphaBeta(LrpMethod):
    """LRP-alpha-beta on every Linear/Conv layer (Bach et al. eq. 60; positive/negative bias parts in
    the matching denominators). Zennit requires alpha - beta = 1 (relevance conservation)."""

    name = "lrp_alpha_beta"
    capabilities = _CAPABILITIES
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "lrp_alpha_beta"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = (
        "hands effects of negatively contributing sets to positively contributing units outside them"
    )

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        p = self.params(ctx)
        alpha, beta = float(p["alpha"]), float(p["beta"])
        if alpha < 0 or beta < 0 or abs(alpha - beta - 1.0) > 1e-9:
            raise InvalidInput(
                f"{self.name}: needs alpha, beta >= 0 and alpha - beta = 1, got {alpha}, {beta}"
            )

        from workers.methods._lrp_rules import AlphaBeta  # torch only when computing
        from workers.methods._modified_backward import lrp_relevance

        def rule(index: int) -> LayerRule:
            return AlphaBeta(alpha, beta)

        return lrp_relevance(ctx, self.name, rule, inputs, classes)


class DeepTaylor(LrpMethod):
    """Deep Taylor decomposition: the z-beta (ZBox) rule on the first affine layer, z+ on the others.

    Both rules follow Montavon et al. 2017 exactly: z+ ignores biases (Zennit's ZPlus would otherwise
    let positive biases absorb relevance), z-beta cancels them by construction. ``low``/``high`` are
    the input domain's bounds; by default the min and max over the job's inputs and references,
    fixed once per job (:meth:`bind`) so that every batch, and every sub-input the audit attributes,
    uses the same rule as the shipped map.
    """

    name = "deep_taylor"
    capabilities = _CAPABILITIES
    first_layer_needs_input = True
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "deep_taylor"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = (
        "hands effects of negatively contributing sets to positively contributing units outside them"
    )

    def bind(
        self, params: Mapping[str, Any], inputs: np.ndarray, references: tuple[np.ndarray, ...]
    ) -> dict[str, Any]:
        bound = dict(params)
        arrays = (inputs, *references)
        if bound.get("low") is None:
            bound["low"] = float(min(a.min() for a in arrays))
        if bound.get("high") is None:
            bound["high"] = float(max(a.max() for a in arrays))
        return bound

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        p = self.params(ctx)
        low = float(min(inputs.min(), baselines.min())) if p["low"] is None else float(p["low"])
        high = float(max(inputs.max(), baselines.max())) if p["high"] is None else float(p["high"])
        if low > high:
            raise InvalidInput(f"{self.name}: low ({low}) must not exceed high ({high})")

        from workers.methods._lrp_rules import AlphaBeta, ZBox  # torch only when computing
        from workers.methods._modified_backward import lrp_relevance

        def rule(index: int) -> LayerRule:
            # z+ is alpha-beta with alpha=1, beta=0 and the biases left out (Zennit's ZPlus).
            return ZBox(low, high) if index == 0 else AlphaBeta(1.0, 0.0, zero_bias=True)

        assert rule(0).needs_input_layer == self.first_layer_needs_input

        return lrp_relevance(ctx, self.name, rule, inputs, classes)
