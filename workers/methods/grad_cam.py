"""Grad-CAM (Selvaraju et al. 2017) as Captum's LayerGradCam computes it, spread back onto input elements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from workers.methods._base import AttributionContext, Capabilities, TorchMethod, in_row_chunks
from xaudit.contract.errors import InvalidInput, NotApplicable
from xaudit.contract.params import parameter_defaults

__all__ = ["GradCam", "conv_layers", "with_its_batch_norm"]

# Interpolation mode by number of spatial axes (F.interpolate names).
_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

    ConvLayer = torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Conv3d


def conv_layers(graph: torch.nn.Module) -> list[tuple[str, ConvLayer]]:
    """(name, module) of every convolution, in execution order for an fx graph."""
    import torch

    conv_types = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    if isinstance(graph, torch.fx.GraphModule):
        found: list[tuple[str, ConvLayer]] = []
        for node in graph.graph.nodes:
            if node.op == "call_module":
                module = graph.get_submodule(str(node.target))
                if isinstance(module, conv_types):
                    found.append((str(node.target), module))
        return found
    return [(name, m) for name, m in graph.named_modules() if isinstance(m, conv_types)]


def with_its_batch_norm(graph: torch.nn.Module, name: str, conv: ConvLayer) -> torch.nn.Module:
    """The batch norm that is the only use of the convolution ``name``, where there is one, else the
    convolution: the map Grad-CAM weighs. Both exporters fold such a norm into the convolution (the
    legacy one from opset 9, the dynamo one always), so that the same model exported at opset 7 or
    with ``do_constant_folding=False`` would otherwise give another map (the norm's shift, weighted
    by the gradient, is part of the folded layer's output)."""
    import torch

    if not isinstance(graph, torch.fx.GraphModule):
        return conv
    node = next(n for n in graph.graph.nodes if n.op == "call_module" and str(n.target) == name)
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_module" or users[0].args[0] is not node:
        return conv
    norm = graph.get_submodule(str(users[0].target))
    return norm if isinstance(norm, torch.nn.modules.batchnorm._BatchNorm) else conv


class GradCam(TorchMethod):
    """Grad-CAM on the output of the last convolution (or the one named by ``layer``), with the batch
    norm right after it where there is one (:func:`with_its_batch_norm`).

    The map (channel-summed, ReLU'd when ``relu``) is upsampled to the input's spatial size with
    Captum's interpolate (bilinear in 2-D) and spread evenly over the input channels, so that the
    element attributions at each position sum to the map there.
    """

    name = "grad_cam"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="none", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults("grad_cam")  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "first-order Taylor term at feature-map level; drops interactions"

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        import torch

        p = self.params(ctx)
        graph = ctx.model.torch_hookable(self.name, row_by_row=True)
        convs = conv_layers(graph)
        if not convs:
            raise NotApplicable(self.name, "the model has no convolution layer")
        if p["layer"] is None:
            name, layer = convs[-1]
        else:
            by_name = dict(convs)
            if p["layer"] not in by_name:
                raise InvalidInput(
                    f"{self.name}: no convolution layer '{p['layer']}'; the model has {list(by_name)}"
                )
            name, layer = p["layer"], by_name[p["layer"]]
        spatial = inputs.shape[2:]
        spatial_axes = len(layer.kernel_size)
        if inputs.ndim - 2 != spatial_axes:
            raise NotApplicable(
                self.name,
                f"the input of shape {tuple(inputs.shape[1:])} has no channel and spatial axes matching the "
                f"{spatial_axes}-d convolution's map",
            )
        scores, channels = ctx.target.wrap(graph), inputs.shape[1]
        mapped = with_its_batch_norm(graph, name, layer)

        def maps(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            cam = _class_activation_map(scores, mapped, x, c)
            if p["relu"]:
                cam = torch.relu(cam)
            # Captum's LayerAttribution.interpolate: F.interpolate to the input's size, align_corners unset.
            upsampled = torch.nn.functional.interpolate(cam, size=tuple(spatial), mode=_MODES[len(spatial)])
            return upsampled.expand(-1, channels, *spatial) / channels

        # Rows are independent: a graph with a fixed batch of 1 is called one row at a time.
        fixed = ctx.model.hook_batch
        return in_row_chunks(fixed or len(inputs), maps, classes, inputs, exact=fixed is not None)


def _class_activation_map(
    scores: torch.nn.Module, layer: torch.nn.Module, x: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    """sum_k alpha_k A^k (N, 1, *spatial), alpha_k the mean of d score / d A^k over positions, as
    Captum's LayerGradCam. One backward pass of the summed scores, from the output down to the layer
    only: rows are independent, so each row's gradient is its own score's. Captum differentiates the
    N scores as N outputs, whose gradients autograd sums to the same tensor, at a cost above that of
    the backward pass itself for a small model (bench/suite.py, methods)."""
    import torch

    acts: list[torch.Tensor] = []

    def keep(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        if not output.requires_grad:  # a graph whose parameters are frozen: differentiate from here
            output.requires_grad_(True)
        acts.append(output)  # the last call counts, as in Captum, when a layer runs twice

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            out = scores(x)
            picked = out.gather(1, classes[:, None])
            (grads,) = torch.autograd.grad(picked.sum(), acts[-1])
    finally:
        handle.remove()
    weights = grads.mean(dim=tuple(range(2, grads.ndim)), keepdim=True)
    return (weights * acts[-1].detach()).sum(dim=1, keepdim=True)
