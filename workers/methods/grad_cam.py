"""Grad-CAM (Selvaraju et al. 2017) through Captum's LayerGradCam, spread back onto input elements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method, to_numpy, to_tensor
from xaudit.contract.errors import InvalidInput, NotApplicable
from xaudit.contract.params import parameter_defaults

__all__ = ["GradCam", "conv_layers"]

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


class GradCam(Method):
    """Grad-CAM on the output of the last convolution (or the one named by ``layer``).

    The map (channel-summed, ReLU'd when ``relu``) is upsampled to the input's spatial size with
    Captum's interpolate (bilinear in 2-D) and spread evenly over the input channels, so that the
    element attributions at each position sum to the map there.
    """

    name = "grad_cam"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="none", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults("grad_cam")  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "first-order Taylor term at feature-map level; drops interactions"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        import torch
        from captum.attr import LayerAttribution, LayerGradCam

        p = self.params(ctx)
        graph = ctx.model.torch_hookable(self.name)
        convs = conv_layers(graph)
        if not convs:
            raise NotApplicable(self.name, "the model has no convolution layer")
        if p["layer"] is None:
            layer = convs[-1][1]
        else:
            by_name = dict(convs)
            if p["layer"] not in by_name:
                raise InvalidInput(
                    f"{self.name}: no convolution layer '{p['layer']}'; the model has {list(by_name)}"
                )
            layer = by_name[p["layer"]]
        spatial = inputs.shape[2:]
        spatial_axes = len(layer.kernel_size)
        if inputs.ndim - 2 != spatial_axes:
            raise NotApplicable(
                self.name,
                f"the input of shape {inputs.shape[1:]} has no channel and spatial axes matching the "
                f"{spatial_axes}-d convolution's map",
            )
        device = ctx.model.device
        explainer = LayerGradCam(ctx.target.wrap(graph), layer)
        with torch.enable_grad():
            cam = explainer.attribute(
                to_tensor(inputs, device),
                target=torch.as_tensor(classes, dtype=torch.long, device=device),
                relu_attributions=bool(p["relu"]),
            )
        upsampled = LayerAttribution.interpolate(cam.detach(), tuple(spatial), _MODES[len(spatial)])
        channels = inputs.shape[1]
        return to_numpy(upsampled.expand(-1, channels, *spatial) / channels).astype(np.float32)
