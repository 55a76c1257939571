"""Converters for ONNX operators that onnx2torch lacks and that exported public models use.

Registered in onnx2torch's public converter registry on import (workers.models.onnx_to_torch
imports this module). Each one is checked against onnxruntime in tests/unit/models/test_onnx_support.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from workers.light_imports import onnx2torch as _light_onnx2torch
from workers.models.fused_nodes import DOMAIN as FUSED

_light_onnx2torch()  # before any onnx2torch import: keeps torchvision out
from onnx2torch.node_converters import slice as _onnx2torch_slice  # noqa: E402
from onnx2torch.node_converters.clip import _create_torch_module as _clip_module  # noqa: E402
from onnx2torch.node_converters.cumsum import OnnxCumSum  # noqa: E402
from onnx2torch.node_converters.pad import _ONNX_TO_TORCH_MODE, OnnxPadDynamic, _onnx_to_torch_mode  # noqa: E402
from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes  # noqa: E402
from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription, add_converter  # noqa: E402
from onnx2torch.node_converters.unsqueeze import OnnxUnsqueezeStaticAxes  # noqa: E402
from onnx2torch.onnx_graph import OnnxGraph  # noqa: E402
from onnx2torch.onnx_node import OnnxNode  # noqa: E402
from onnx2torch.utils.common import (  # noqa: E402
    OnnxMapping,
    OperationConverterResult,
    get_const_value,
    onnx_mapping_from_node,
)

__all__ = ["fake_quantizes", "registered"]  # importing the module registers the converters


def _description(op: str, version: int) -> OperationDescription:
    return OperationDescription(domain="", operation_type=op, version=version)


def registered(op: str, version: int) -> Any:
    """The converter registered for ``op`` (default domain) at ``version``, as the registry holds it
    now: onnx2torch's own until this module's _REPLACED is applied."""
    return _CONVERTER_REGISTRY[_description(op, version)]


class GlobalMaxPool(nn.Module):
    """Max over every spatial axis (2..), keeping them as size 1, as ONNX GlobalMaxPool."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)


def _global_max_pool(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    return OperationConverterResult(torch_module=GlobalMaxPool(), onnx_mapping=onnx_mapping_from_node(node))


class Gelu(nn.Module):
    """ONNX Gelu (opset 20): exact (erf) or tanh-approximated."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate=self.approximate)


def _gelu(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    approximate = node.attributes.get("approximate", "none")
    return OperationConverterResult(
        torch_module=Gelu(str(approximate)), onnx_mapping=onnx_mapping_from_node(node)
    )


def _mish(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """ONNX Mish (opset 18; the dynamo exporter's default opset 20 writes nn.Mish as it)."""
    del graph
    return OperationConverterResult(torch_module=nn.Mish(), onnx_mapping=onnx_mapping_from_node(node))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2, last axis) + epsilon): the RMS normalisation workers.models.norm_fusion
    writes as one node (its scale a separate Mul)."""

    def __init__(self, epsilon: float) -> None:
        super().__init__()
        self.epsilon = epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.epsilon)


def _rms_norm(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    epsilon = float(node.attributes.get("epsilon", 1e-6))
    return OperationConverterResult(torch_module=RMSNorm(epsilon), onnx_mapping=onnx_mapping_from_node(node))


class Standardize(nn.Module):
    """(x - mean(x)) / sqrt(var(x) + epsilon) over one axis: a layer norm written out by hand (ConvNeXt's
    channels-first one), which workers.models.norm_fusion writes as one node (its affine separate)."""

    def __init__(self, axis: int, epsilon: float) -> None:
        super().__init__()
        self.axis, self.epsilon = axis, epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(self.axis, keepdim=True)
        return centred * torch.rsqrt(centred.square().mean(self.axis, keepdim=True) + self.epsilon)


class ResponseScale(nn.Module):
    """ConvNeXt V2's global response normalisation scale, s / (mean(s over the channels) + epsilon)
    with s the L2 norm over the spatial axes: what workers.models.norm_fusion writes as one node (the
    product with the input, the scale and the shift separate)."""

    def __init__(self, axes: tuple[int, ...], channel_axis: int, epsilon: float) -> None:
        super().__init__()
        self.axes, self.channel_axis, self.epsilon = axes, channel_axis, epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, 2, dim=self.axes, keepdim=True)
        return norm / (norm.mean(self.channel_axis, keepdim=True) + self.epsilon)


def _response_scale(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    (channel,) = node.attributes["channel_axes"]
    axes = tuple(int(a) for a in node.attributes["axes"])
    module = ResponseScale(axes, int(channel), float(node.attributes.get("epsilon", 1e-6)))
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


def _standardize(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    (axis,) = node.attributes["axes"]
    module = Standardize(int(axis), float(node.attributes.get("epsilon", 1e-5)))
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


class _Quantized(torch.autograd.Function):
    """ONNX's QuantizeLinear then DequantizeLinear: ``(clamp(round(x / s) + z, low, high) - z) * s``,
    rounded half to even and divided as onnxruntime divides (torch's own fake quantization multiplies
    by 1 / s, which moves values at a tie of the grid a step: 0.195 / 0.03 is 6.5 in float32, and
    0.195 * (1 / 0.03) just above it); its gradient the straight-through one, 1 where the level is
    inside [low, high], else 0."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, low: int, high: int
    ) -> torch.Tensor:
        levels = torch.round(x / scale).add_(zero)
        ctx.save_for_backward((levels >= low) & (levels <= high))
        return levels.clamp_(low, high).sub_(zero).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None, None, None


class FakeQuantize(nn.Module):
    """A QuantizeLinear -> DequantizeLinear pair (workers.models.fake_quantization): the values ONNX
    defines for it and the straight-through gradient (:class:`_Quantized`); per tensor, or per
    channel along ``axis``."""

    def __init__(
        self, scale: torch.Tensor, zero_point: torch.Tensor, axis: int | None, low: int, high: int
    ) -> None:
        super().__init__()
        self.register_buffer("scale", scale.float().reshape(-1))
        self.register_buffer("zero_point", zero_point.to(torch.float32).reshape(-1))
        self.axis, self.low, self.high = axis, low, high
        self.scale: torch.Tensor
        self.zero_point: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1] * x.ndim
        if self.axis is not None:
            shape[self.axis % x.ndim] = -1
        scale, zero = self.scale.to(x.dtype).reshape(shape), self.zero_point.to(x.dtype).reshape(shape)
        out: torch.Tensor = _Quantized.apply(x, scale, zero, self.low, self.high)
        return out


def fake_quantizes(graph: nn.Module) -> bool:
    """``graph`` runs a quantized model's quantize-dequantize pairs as :class:`FakeQuantize`."""
    return any(isinstance(module, FakeQuantize) for module in graph.modules())


def _fake_quantize(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    scale, zero_point = (get_const_value(name, graph) for name in node.input_values[1:3])
    assert isinstance(scale, torch.Tensor) and isinstance(zero_point, torch.Tensor)
    axis = node.attributes.get("axis")
    module = FakeQuantize(
        scale,
        zero_point,
        None if axis is None else int(axis),
        int(node.attributes["low"]),
        int(node.attributes["high"]),
    )
    mapping = OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


def _average_pool_19(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Opset 19 adds ``dilations`` to AveragePool; without dilation it is the opset-11 operator."""
    dilations = node.attributes.get("dilations")
    if dilations is not None and any(int(d) != 1 for d in dilations):
        raise NotImplementedError(f"AveragePool with dilations {list(dilations)} (node '{node.name}')")
    return registered("AveragePool", 11)(node, graph)


def _clip(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Clip (opset 11 on) with constant bounds, an empty input name taken as an absent bound. The
    legacy exporter writes F.normalize's clamp(min=eps) as Clip(x, eps, ""), in torchvision's
    swin_v2_t, and onnx2torch looked up "" as a bound computed at run time and refused the model."""
    bounds: list[float | None] = []
    for name in (*node.input_values[1:3], "", "")[:2]:
        if not name:
            bounds.append(None)
            continue
        try:
            bounds.append(float(get_const_value(name, graph)))
        except KeyError:
            raise NotImplementedError(f"Clip with bounds computed at run time (node '{node.name}')") from None
    return OperationConverterResult(
        torch_module=_clip_module(min_val=bounds[0], max_val=bounds[1]),
        onnx_mapping=OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values),
    )


def _resize_18(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Resize 18 and 19 (HRNet's and MobileViT's upsampling from both of torch's exporters at opset 18)
    are Resize 13 where their additions are off: no antialiasing, no ``axes``, the default aspect
    policy, no half_pixel_symmetric coordinates. onnx2torch stops at 13, and every gradient method
    refused those models."""
    attributes = node.attributes
    if int(attributes.get("antialias", 0)) != 0 or attributes.get("axes") is not None:
        raise NotImplementedError(f"Resize with antialias or axes (node '{node.name}')")
    if attributes.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise NotImplementedError(f"Resize keeping the aspect ratio (node '{node.name}')")
    if attributes.get("coordinate_transformation_mode") == "half_pixel_symmetric":
        raise NotImplementedError(f"Resize with half_pixel_symmetric coordinates (node '{node.name}')")
    return registered("Resize", 13)(node, graph)


class Split(nn.Module):
    """ONNX Split (opset 18): at ``sections``, or in ``parts`` parts of ceil(length / parts) with the
    last one smaller (the ``num_outputs`` form torch's dynamo exporter writes for ``chunk``)."""

    def __init__(self, axis: int, sections: list[int] | None, parts: int) -> None:
        super().__init__()
        self.axis, self.sections, self.parts = axis, sections, parts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sections = self.sections
        if sections is None:
            length = x.shape[self.axis]
            size = -(-length // self.parts)
            sections = [size] * (self.parts - 1) + [length - size * (self.parts - 1)]
        return torch.split(x, sections, dim=self.axis)


def _split_18(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Opset 18 adds ``num_outputs``; the sections, where given, are an input (a constant here)."""
    inputs = node.input_values
    sections = None
    if len(inputs) > 1 and inputs[1]:
        try:
            value: Any = get_const_value(inputs[1], graph)
        except KeyError:
            raise NotImplementedError(
                f"Split with sections computed at run time (node '{node.name}')"
            ) from None
        sections = [int(v) for v in torch.as_tensor(value).reshape(-1).tolist()]
    parts = int(node.attributes.get("num_outputs", len(node.output_values)))
    module = Split(int(node.attributes.get("axis", 0)), sections, parts)
    return OperationConverterResult(module, OnnxMapping(inputs=(inputs[0],), outputs=node.output_values))


class LayerNorm(nn.Module):
    """ONNX LayerNormalization with constant scale and bias, normalising over the axes from ``axis``
    on at their sizes in the input at run time."""

    def __init__(self, axis: int, epsilon: float, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.axis, self.epsilon = axis, epsilon
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[self.axis :]
        bias = None if self.bias is None else self.bias.expand(shape)
        return nn.functional.layer_norm(x, shape, self.weight.expand(shape), bias, self.epsilon)


_ONNX2TORCH_LAYER_NORM = registered("LayerNormalization", 17)


def _layer_norm_17(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """onnx2torch sizes its nn.LayerNorm from the graph's recorded shape, which reads a symbolic size
    as 0 (swin_t from the legacy exporter: "normalized_shape = [0]"); with a size left symbolic the
    sizes are taken from the input instead."""
    inputs = node.input_values
    info = graph.value_info.get(inputs[0])
    sizes = [] if info is None else [d.dim_value for d in info.type.tensor_type.shape.dim]
    axis = int(node.attributes.get("axis", -1))
    constant = all(name in graph.initializers for name in inputs[1:] if name)
    if not constant or (sizes and all(v > 0 for v in sizes[axis:])):
        return _ONNX2TORCH_LAYER_NORM(node, graph)
    weight = graph.initializers[inputs[1]].to_torch()
    bias = graph.initializers[inputs[2]].to_torch() if len(inputs) > 2 and inputs[2] else None
    module = LayerNorm(axis, float(node.attributes.get("epsilon", 1e-5)), weight, bias)
    return OperationConverterResult(module, OnnxMapping(inputs=(inputs[0],), outputs=node.output_values))


def _rms_normalization_23(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """ONNX RMSNormalization (opset 23: the dynamo exporter's nn.RMSNorm there) with a constant scale
    over the trailing axes from ``axis``: torch's nn.RMSNorm, which the rule methods hold as they hold
    the norm the exporters write out at earlier opsets."""
    inputs = node.input_values
    if inputs[1] not in graph.initializers:
        raise NotImplementedError("RMSNormalization with a computed scale")
    scale = graph.initializers[inputs[1]].to_torch().float()
    axis = int(node.attributes.get("axis", -1))
    if axis >= 0:  # counted from the end, as nn.RMSNorm's trailing normalized_shape
        info = graph.value_info.get(inputs[0])
        rank = None if info is None else len(info.type.tensor_type.shape.dim)
        if rank is None:
            raise NotImplementedError("RMSNormalization over an axis of an input of unknown rank")
        axis -= rank
    if scale.dim() != -axis:  # a scale broadcast over the normalised axes
        raise NotImplementedError("RMSNormalization whose scale is not one value per normalised element")
    module = nn.RMSNorm(tuple(scale.shape), eps=float(node.attributes.get("epsilon", 1e-5)))
    with torch.no_grad():
        module.weight.copy_(scale)
    return OperationConverterResult(module, OnnxMapping(inputs=(inputs[0],), outputs=node.output_values))


class PadAxes(nn.Module):
    """ONNX Pad (opset 18 on) with ``axes``: the listed axes' pads spread over every axis, then
    onnx2torch's own Pad (ONNX pad order and modes to torch's)."""

    def __init__(self, mode: str, axes: list[int]) -> None:
        super().__init__()
        self.axes = axes
        self.pad = OnnxPadDynamic(mode=_onnx_to_torch_mode(mode))

    def forward(self, x: torch.Tensor, pads: torch.Tensor, value: torch.Tensor | None = None) -> torch.Tensor:
        rank, given, k = x.dim(), pads.tolist(), len(self.axes)
        full = [0] * (2 * rank)  # ONNX order: every axis' begin, then every axis' end
        for i, axis in enumerate(self.axes):
            full[axis % rank], full[rank + axis % rank] = given[i], given[k + i]
        return self.pad(x, torch.tensor(full), 0.0 if value is None else float(value))


def _pad_18(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Pad from opset 18 (``axes``), 19 (``wrap`` mode) and 21 (new types): onnx2torch's opset-13
    converter where no axes are given, which is what torch's exporters write."""
    mode = str(node.attributes.get("mode", "constant"))
    if mode not in _ONNX_TO_TORCH_MODE:
        raise NotImplementedError(f"Pad with mode '{mode}' (node '{node.name}')")
    inputs = list(node.input_values)
    while inputs and not inputs[-1]:
        inputs.pop()
    if len(inputs) < 4:
        return registered("Pad", 13)(node, graph)
    try:
        axes = [int(a) for a in torch.as_tensor(get_const_value(inputs[3], graph)).reshape(-1).tolist()]
    except KeyError:
        raise NotImplementedError(f"Pad with axes computed at run time (node '{node.name}')") from None
    runtime = tuple(name for name in inputs[:3] if name)  # data, pads and a constant_value if given
    return OperationConverterResult(
        PadAxes(mode, axes), OnnxMapping(inputs=runtime, outputs=node.output_values)
    )


class ScatterND(nn.Module):
    """ONNX ScatterND without a reduction: a copy of ``data`` with ``updates`` written where the last
    axis of ``indices`` points. onnx2torch's indexes with a list of lists built on the host, which
    torch deprecated ("will be interpreted as tensor index ... an error or a different result"); this
    indexes with a tuple of index tensors, on the data's device."""

    def forward(self, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        depth = indices.shape[-1]
        values = updates.reshape(-1, *data.shape[depth:]).to(data.dtype)
        if depth == 0:  # every index tuple is empty: each update replaces all of ``data``
            return values[-1].clone()
        out = data.clone()
        out[indices.reshape(-1, depth).to(torch.long).unbind(1)] = values
        return out


def _scatter_nd(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """ScatterND at every opset (torch's dynamo exporter writes it for slice assignment: swin_t's
    attention mask). Opset 16 adds the add and mul reductions, 18 max and min: refused, as onnx2torch
    refuses them."""
    del graph
    reduction = node.attributes.get("reduction", "none")
    if reduction not in ("none", b"none"):
        raise NotImplementedError(f"ScatterND with reduction '{reduction}' (node '{node.name}')")
    return OperationConverterResult(ScatterND(), onnx_mapping_from_node(node))


# ONNX gate order -> torch's: LSTM i,o,f,c -> i,f,g,o; GRU z,r,h -> r,z,n.
_GATES = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


class Recurrent(nn.Module):
    """ONNX LSTM / GRU (layout 0, default activations) as torch's nn.LSTM / nn.GRU of one layer:
    Y (seq, directions, batch, hidden), Y_h and (LSTM) Y_c, as many outputs as the node has."""

    def __init__(self, rnn: nn.RNNBase, op: str, has_h: bool, has_c: bool, outputs: int) -> None:
        super().__init__()
        self.rnn, self.op, self.has_h, self.has_c, self.outputs = rnn, op, has_h, has_c, outputs

    def forward(self, x: torch.Tensor, *state: torch.Tensor) -> Any:
        directions = 2 if self.rnn.bidirectional else 1
        shape = (directions, x.shape[1], self.rnn.hidden_size)
        h = state[0] if self.has_h else x.new_zeros(shape)
        if self.op == "LSTM":
            c = state[int(self.has_h)] if self.has_c else x.new_zeros(shape)
            y, (h_n, c_n) = self.rnn(x, (h, c))
            results: tuple[torch.Tensor, ...] = (y, h_n, c_n)
        else:
            y, h_n = self.rnn(x, h)
            results = (y, h_n)
        y = y.reshape(x.shape[0], x.shape[1], directions, -1).transpose(1, 2)
        results = (y, *results[1:])[: self.outputs]
        return results[0] if self.outputs == 1 else results


def _recurrent(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    op = node.operation_type
    attrs = node.attributes
    inputs = list(node.input_values) + [""] * 8
    unsupported = [
        name
        for name, bad in (
            ("layout=1", attrs.get("layout", 0) != 0),
            ("clip", "clip" in attrs),
            ("activations", "activations" in attrs),
            ("input_forget", attrs.get("input_forget", 0) != 0),
            ("linear_before_reset=0", op == "GRU" and attrs.get("linear_before_reset", 0) != 1),
            ("sequence_lens", bool(inputs[4])),
            ("peepholes", op == "LSTM" and bool(inputs[7])),
            ("direction=reverse", attrs.get("direction", "forward") == "reverse"),
        )
        if bad
    ]
    if unsupported:
        raise NotImplementedError(f"{op} with {', '.join(unsupported)} (node '{node.name}')")
    try:
        w, r = (get_const_value(inputs[k], graph) for k in (1, 2))
        b = get_const_value(inputs[3], graph) if inputs[3] else None
    except KeyError:
        raise NotImplementedError(f"{op} with weights computed at run time (node '{node.name}')") from None
    assert isinstance(w, torch.Tensor) and isinstance(r, torch.Tensor)
    directions, gates_h, size = w.shape
    hidden = gates_h // len(_GATES[op])
    rnn_type = nn.LSTM if op == "LSTM" else nn.GRU
    rnn = rnn_type(size, hidden, num_layers=1, bidirectional=directions == 2)

    def reorder(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[g * hidden : (g + 1) * hidden] for g in _GATES[op]])

    with torch.no_grad():
        for d in range(directions):
            suffix = "_l0" + ("_reverse" if d == 1 else "")
            getattr(rnn, "weight_ih" + suffix).copy_(reorder(w[d]))
            getattr(rnn, "weight_hh" + suffix).copy_(reorder(r[d]))
            bias = b[d] if isinstance(b, torch.Tensor) else torch.zeros(2 * gates_h)
            getattr(rnn, "bias_ih" + suffix).copy_(reorder(bias[:gates_h]))
            getattr(rnn, "bias_hh" + suffix).copy_(reorder(bias[gates_h:]))
    has_h, has_c = bool(inputs[5]), op == "LSTM" and bool(inputs[6])
    runtime = (inputs[0], *([inputs[5]] if has_h else []), *([inputs[6]] if has_c else []))
    outputs = len(node.output_values)
    module = Recurrent(rnn.eval(), op, has_h, has_c, outputs)
    return OperationConverterResult(module, OnnxMapping(inputs=runtime, outputs=node.output_values))


def _reduce_with_axes_input(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Opset 18 moved ``axes`` of the reductions from an attribute to a (constant) input."""
    axes: list[int] | None = None
    if len(node.input_values) > 1 and node.input_values[1]:
        try:
            value: Any = get_const_value(node.input_values[1], graph)
        except KeyError:
            raise NotImplementedError(
                f"{node.operation_type} with axes computed at run time (node '{node.name}')"
            ) from None
        axes = [int(a) for a in torch.as_tensor(value).reshape(-1).tolist()]
    if not axes and node.attributes.get("noop_with_empty_axes", 0):
        raise NotImplementedError(f"{node.operation_type} with noop_with_empty_axes=1 (node '{node.name}')")
    module = OnnxReduceStaticAxes(node.operation_type, axes or None, node.attributes.get("keepdims", 1))
    mapping = OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


_REDUCTIONS_18 = (
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
)  # fmt: skip


class ReshapeAllowZero(nn.Module):
    """ONNX Reshape with ``allowzero=1`` (what torch's dynamo exporter writes): a 0 in the shape is
    a size of 0, as in torch.reshape (onnx2torch refuses the attribute)."""

    def forward(self, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        return torch.reshape(x, [int(v) for v in shape.tolist()])


_ONNX2TORCH_RESHAPE = registered("Reshape", 14)


def _reshape_14(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """Reshape from opset 14: onnx2torch's converter, which refuses ``allowzero=1``; with it (every
    Reshape of torch's dynamo exporter, constant or computed shape) torch.reshape, whose 0 is a size
    of 0 as allowzero means."""
    if node.attributes.get("allowzero", 0) != 1:
        return _ONNX2TORCH_RESHAPE(node, graph)
    return OperationConverterResult(ReshapeAllowZero(), onnx_mapping_from_node(node))


class FlattenAt(nn.Module):
    """ONNX Flatten at any ``axis`` in [-rank, rank]: (product of the sizes before it, product of the
    rest). onnx2torch's fails at axis = rank (transformers' BERT from the legacy exporter flattens
    its (batch, sequence) mask at axis 2)."""

    def __init__(self, axis: int) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


_ONNX2TORCH_FLATTEN = registered("Flatten", 13)


def _flatten(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    axis = int(node.attributes.get("axis", 1))
    if axis == 1:  # onnx2torch's nn.Flatten: right at every rank
        return _ONNX2TORCH_FLATTEN(node, graph)
    return OperationConverterResult(FlattenAt(axis), onnx_mapping_from_node(node))


def _cumsum(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """onnx2torch's CumSum with ONNX's defaults: onnx2torch reads a missing ``reverse`` as 1, so a
    model that leaves it out (the legacy exporter's RoBERTa, whose position ids are a running count
    of its tokens) summed from the end: its torch graph gave other logits than the model."""
    exclusive = bool(node.attributes.get("exclusive", 0))
    reverse = bool(node.attributes.get("reverse", 0))
    return OperationConverterResult(OnnxCumSum(exclusive, reverse), onnx_mapping_from_node(node))


class OneHot(nn.Module):
    """ONNX OneHot: ``values[1]`` where an index names the position along the new ``axis``, else
    ``values[0]``; a negative index counts from the end, and one out of range is all ``values[0]``
    (GC ViT's relative position bias, torch's ``one_hot`` as exported)."""

    def __init__(self, axis: int) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, indices: torch.Tensor, depth: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        size = int(depth.reshape(-1)[0])
        index = indices.long()
        index = torch.where(index < 0, index + size, index)
        positions = torch.arange(size, device=indices.device)
        hot = index.unsqueeze(-1) == positions  # out of range: no position matches
        out = torch.where(hot, values[1], values[0])
        return out.movedim(-1, self.axis % out.ndim)


def _one_hot(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    module = OneHot(int(node.attributes.get("axis", -1)))
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


class Trilu(nn.Module):
    """ONNX Trilu: the upper (``upper``) or lower triangle of the last two axes, from diagonal ``k``
    (0 where not given). torch's default exporter writes a causal ``scaled_dot_product_attention`` (nanoGPT's) at
    opsets before 23 with it, building the causal mask."""

    def __init__(self, upper: bool) -> None:
        super().__init__()
        self.upper = upper

    def forward(self, x: torch.Tensor, k: torch.Tensor | None = None) -> torch.Tensor:
        diagonal = 0 if k is None else int(k.reshape(-1)[0])
        return torch.triu(x, diagonal) if self.upper else torch.tril(x, diagonal)


def _trilu(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    del graph
    module = Trilu(bool(node.attributes.get("upper", 1)))
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


_ONNX2TORCH_UNSQUEEZE = registered("Unsqueeze", 13)


def _unsqueeze_13(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """onnx2torch's Unsqueeze, also where the axes are one number (a 0-d constant, which onnxruntime
    runs and torch's dynamo exporter writes for ``enable_gqa``'s repeated keys); onnx2torch failed
    with "'int' object is not iterable"."""
    try:
        axes = torch.as_tensor(get_const_value(node.input_values[1], graph)).reshape(-1).tolist()
    except KeyError:  # computed axes
        return _ONNX2TORCH_UNSQUEEZE(node, graph)
    mapping = OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
    return OperationConverterResult(torch_module=OnnxUnsqueezeStaticAxes(axes=axes), onnx_mapping=mapping)


# (operator, since-version) -> converter; what this module adds to onnx2torch.
_ADDED: dict[tuple[str, int], Any] = {
    ("OneHot", 9): _one_hot,
    ("OneHot", 11): _one_hot,
    ("GlobalMaxPool", 1): _global_max_pool,
    ("Gelu", 20): _gelu,
    ("Mish", 18): _mish,
    ("Trilu", 14): _trilu,
    ("RMSNormalization", 23): _rms_normalization_23,
    ("LSTM", 14): _recurrent,
    ("LSTM", 7): _recurrent,
    ("GRU", 14): _recurrent,
    ("GRU", 7): _recurrent,
    ("AveragePool", 19): _average_pool_19,
    ("Resize", 18): _resize_18,
    ("Resize", 19): _resize_18,
    ("Split", 18): _split_18,
    ("Pad", 18): _pad_18,
    ("Pad", 19): _pad_18,
    ("Pad", 21): _pad_18,
    ("ScatterND", 18): _scatter_nd,
    **{(op, 18): _reduce_with_axes_input for op in _REDUCTIONS_18},
    ("ReduceMax", 20): _reduce_with_axes_input,  # 20 adds bool inputs only
    ("ReduceMin", 20): _reduce_with_axes_input,
}


# The operators the fusions write in xaudit's domain (workers.models.gelu_fusion's exact GELU,
# workers.models.norm_fusion's norms) -> converter.
_FUSED_OPS: dict[str, Any] = {
    "Gelu": _gelu,
    "RMSNorm": _rms_norm,
    "Standardize": _standardize,
    "ResponseScale": _response_scale,
    "FakeQuantize": _fake_quantize,
}


# onnx2torch's converters that this module replaces (a bug on models exported today).
_REPLACED: dict[tuple[str, int], Any] = {
    ("LayerNormalization", 17): _layer_norm_17,
    **{("Clip", version): _clip for version in (11, 12, 13)},
    ("Reshape", 14): _reshape_14,
    **{("Flatten", version): _flatten for version in (9, 11, 13)},
    **{("ScatterND", version): _scatter_nd for version in (11, 13, 16)},
    **{("CumSum", version): _cumsum for version in (11, 14)},
    ("Unsqueeze", 13): _unsqueeze_13,
}


def _slice_by_tuple(
    x: torch.Tensor, flip_dims: list[int], pos_axes_slices: list[Any], neg_axes_slices: list[Any]
) -> torch.Tensor:
    """onnx2torch's Slice, indexing with a tuple of slices where it passes a list: torch deprecated
    the list ("will be interpreted as tensor index ... either an error or a different result"), and
    warns on every BERT's position ids until then. Bounds are clipped to the axis first: exporters
    write int64's extremes for "to the end", which torch truncates with a warning on every call."""
    if flip_dims:
        x = torch.flip(x, dims=flip_dims)
    if pos_axes_slices:
        x = x[tuple(_within(s, x.shape[axis]) for axis, s in enumerate(pos_axes_slices))]
    if neg_axes_slices:  # [Ellipsis, then the last axes in order]
        last = len(neg_axes_slices) - 1
        x = x[tuple(_within(s, x.shape[i - last - 1]) if i else s for i, s in enumerate(neg_axes_slices))]
    return x


def _within(part: slice, size: int) -> slice:
    """``part`` (a positive step: onnx2torch flips for negative ones) with start and stop clipped to
    [-size, size], which selects the same elements."""

    def clip(bound: Any) -> Any:
        return None if bound is None else max(-size, min(size, int(bound)))

    return slice(clip(part.start), clip(part.stop), part.step)


def _register() -> None:
    _onnx2torch_slice._do_slice = _slice_by_tuple  # read at call time by both of its Slice modules
    for op, converter in _FUSED_OPS.items():
        _CONVERTER_REGISTRY[OperationDescription(domain=FUSED, operation_type=op, version=1)] = converter
    for (op, version), converter in _ADDED.items():
        if _description(op, version) not in _CONVERTER_REGISTRY:
            add_converter(operation_type=op, version=version)(converter)
    for (op, version), converter in _REPLACED.items():
        _CONVERTER_REGISTRY[_description(op, version)] = converter


_register()
