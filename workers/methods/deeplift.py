"""DeepLIFT with the Rescale rule and DeepSHAP on a hookable graph: one modified backward pass over
the fx plan (:mod:`workers.methods._rescale_graph`), Captum's DeepLift where the plan has no form for
the graph (other operators)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from workers.methods._base import AttributionContext, Capabilities, TorchMethod, in_row_chunks

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

    from workers.models.base import ModelAdapter

__all__ = ["DeepLiftRescale", "DeepShap"]


def _deeplift(
    ctx: AttributionContext, method: str, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    import torch  # here, not at import: the catalogue loads no torch

    from workers.methods._passes import rows_per_pass
    from workers.methods._rescale_graph import RescaleGraph

    graph = ctx.model.torch_hookable(method)
    rescale = RescaleGraph.build(graph, method)
    if rescale is None:
        return _captum(ctx, graph, inputs, baselines, classes)

    def attributions(c: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        return rescale.attributions(x, x0, ctx.target, c)

    with torch.enable_grad():
        rows = rows_per_pass(inputs, graph)
        return in_row_chunks(rows, attributions, classes, inputs, baselines)


def _captum(
    ctx: AttributionContext,
    graph: torch.nn.Module,
    inputs: torch.Tensor,
    baselines: torch.Tensor,
    classes: torch.Tensor,
) -> torch.Tensor:
    import torch

    from workers.device_budget import equal_parts
    from workers.methods._captum_deeplift import RowwiseDeepLift
    from workers.methods._deeplift_hooks import ModuleCalledTwice, ReferenceOnceDeepLift
    from workers.methods._passes import rows_per_pass

    model = ctx.target.wrap(graph)
    once = ReferenceOnceDeepLift.for_graph(model, graph)
    if once is not None:
        hooked = once  # bound for the closure (mypy: not None)

        def at_rows(c: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
            return hooked.attributions(x, x0, c)

        try:
            with torch.enable_grad():
                return in_row_chunks(rows_per_pass(inputs, graph), at_rows, classes, inputs, baselines)
        except ModuleCalledTwice:
            pass  # Captum itself, which refuses the graph with its own message
    explainer = RowwiseDeepLift(model, multiply_by_inputs=True)
    # Captum runs each row beside its reference, twice the rows in one pass: half a pass's rows per
    # call. All at once, 256 rows of a BERT at 128 tokens held 8 GB.
    rows = equal_parts(len(inputs), max(1, rows_per_pass(inputs, graph) // 2))

    def attributions(c: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        # Captum sets requires_grad on what it is given: detached aliases
        found: torch.Tensor = explainer.attribute(x.detach(), baselines=x0.detach(), target=c)
        return found.detach()

    with torch.enable_grad():
        return in_row_chunks(rows, attributions, classes, inputs, baselines)


def _implementation(model: ModelAdapter, method: str) -> str | None:
    """xaudit's Rescale pass, or Captum's DeepLift with the operator that sent the graph there."""
    from workers.methods._embedding import graph_model
    from workers.methods._fx_plan import crossed_head
    from workers.methods._rescale_graph import RescaleGraph
    from xaudit.contract.errors import NotApplicable

    try:
        graph = graph_model(model).torch_hookable(method)
    except NotApplicable:
        return None  # the method does not run at all; its entry says why
    refusal = RescaleGraph.refusal(graph, method)
    if refusal is None:
        return "xaudit's Rescale pass (docs/science.md 5.8)" + crossed_head(graph, method, "DeepLIFT")
    from workers.methods._captum_deeplift import corrected  # Captum's path: captum is loaded

    softmax = (
        "; its Softmax rule as Captum corrected it after 0.9.0, row by row (docs/science.md 5.8)"
        if any(corrected(m) for m in graph.modules())
        else ""
    )
    from workers.methods._deeplift_hooks import ReferenceOnceDeepLift

    once = (
        "; computed with Captum's rules and hooks, each reference evaluated once (docs/science.md 5.8)"
        if ReferenceOnceDeepLift.covers(graph)
        else ""
    )
    return (
        f"Captum's DeepLift: xaudit's Rescale pass has no rule for this graph ({refusal}); Captum "
        f"passes the gradient through operators it has no DeepLIFT rule for, and the verdict judges that{softmax}{once}"
    )


class DeepLiftRescale(TorchMethod):
    name = "deeplift_rescale"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = (
        "splits each Taylor term by degree, like Integrated Gradients; expected to pass"
    )

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        return _deeplift(ctx, self.name, inputs, baselines, classes)

    def implementation(self, model: ModelAdapter) -> str | None:
        return _implementation(model, self.name)


class DeepShap(TorchMethod):
    """DeepLIFT Rescale averaged over background references (Captum's DeepLiftShap, constituent-wise)."""

    name = "deepshap"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="distribution", stochastic=False)
    paper_context: ClassVar[str] = (
        "DeepLIFT Rescale averaged over baselines drawn from data; Shapley-like split"
    )

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        return _deeplift(ctx, self.name, inputs, baselines, classes)

    def implementation(self, model: ModelAdapter) -> str | None:
        return _implementation(model, self.name)
