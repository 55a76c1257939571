"""Statically quantized models (QDQ) in the methods' graph: weights dequantized ahead, each
quantize-dequantize pair of an activation as one fake-quantization operator.

onnxruntime's ``quantize_static`` (its default QDQ format), TensorRT's and most edge toolchains write
a quantized model as the float graph with ``QuantizeLinear`` -> ``DequantizeLinear`` pairs around
each layer's inputs and outputs, and each weight stored as integers behind a ``DequantizeLinear``.
onnx2torch converts neither operator, so no gradient or rule method ran on such a model.

- A ``QuantizeLinear`` or ``DequantizeLinear`` that reads only constants (a weight, a bias) is
  computed here once, with onnx's reference evaluator: the layer then reads the float weight the
  model computes with, as onnxruntime's kernels read it.
- A ``DequantizeLinear`` of a ``QuantizeLinear``'s output with the same scale, zero point and axis
  becomes one ``xaudit.FakeQuantize`` node (its ONNX function body is the pair), which
  workers.models.onnx_converters runs as a fake quantization: the same values as ONNX's
  definition of the pair (rounding half to even, saturating), and the straight-through gradient
  (1 inside the quantized range, 0 where it saturates) that quantization-aware training uses:
  the rounding's own gradient is 0 almost everywhere (docs/science.md 5.9).

Only the methods' graph is rewritten; the game runs the quantized model itself on onnxruntime.
Pairs of other types (float8, 4-bit, block-quantized activations) stay as they are, and the
methods that need the torch graph name the operator.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from workers.models.fused_nodes import DOMAIN, write_fused
from workers.models.onnx_nodes import attributes, constant_tensors, default_opset, fold_to_initializers

__all__ = ["simulate_quantization"]

_QUANTIZE, _DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
# Integer types a fake-quantized activation may have, and their ranges.
_RANGES: dict[int, tuple[int, int]] = {
    TensorProto.UINT8: (0, 255),
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT16: (0, 65535),
    TensorProto.INT16: (-32768, 32767),
}


def simulate_quantization(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s main graph as the module docstring says; returns how many
    quantize-dequantize pairs became ``xaudit.FakeQuantize`` nodes."""
    graph = model.graph
    if not any(n.op_type in (_QUANTIZE, _DEQUANTIZE) and not n.domain for n in graph.node):
        return 0
    _fold_constant_quantization(model)
    return _fuse_pairs(model)


def _fold_constant_quantization(model: onnx.ModelProto) -> None:
    """Every Q/DQ node that reads only constants (or what such nodes computed), computed once; and
    every Identity of one, through which the legacy exporter aliases a weight equal to another
    layer's (a transformer's layer norms at their initial ones and zeros)."""
    graph = model.graph
    constants = set(constant_tensors(graph))
    nodes = []
    for node in graph.node:
        inputs = [name for name in node.input if name]
        foldable = node.op_type in (_QUANTIZE, _DEQUANTIZE, "Identity") and not node.domain
        if foldable and all(n in constants for n in inputs):
            nodes.append(node)
            constants.update(node.output)
    if nodes:
        # onnx's reference evaluator has these operators from opset 19, whose semantics extend the
        # earlier ones' (more types, block-wise scales) without changing theirs
        version = default_opset(model)
        opsets = [onnx.helper.make_opsetid("", max(version, 21))]
        fold_to_initializers(graph, nodes, [name for node in nodes for name in node.output], opsets)


def _fuse_pairs(model: onnx.ModelProto) -> int:
    graph = model.graph
    values = constant_tensors(graph)
    producers = {name: node for node in graph.node for name in node.output}
    version = default_opset(model)
    fused: dict[int, onnx.NodeProto] = {}
    zero_points: list[TensorProto] = []
    for dq in graph.node:
        if dq.op_type != _DEQUANTIZE or dq.domain:
            continue
        q = producers.get(dq.input[0])
        if q is None or q.op_type != _QUANTIZE or q.domain:
            continue
        quantized, kind = _parameters(q, values), _quantized_type(q, values)
        if quantized is None or quantized != _parameters(dq, values) or kind not in _RANGES:
            continue
        axis = quantized[2]
        low, high = _RANGES[kind]
        inputs = [q.input[0], q.input[1]]
        if len(q.input) > 2 and q.input[2]:
            inputs.append(q.input[2])
        else:  # absent: a zero of the quantized type, written out for the function body and torch
            name = f"{dq.output[0]}_xaudit_zero_point"
            zero_points.append(onnx.helper.make_tensor(name, kind, [], [0]))
            inputs.append(name)
        node = onnx.helper.make_node(
            "FakeQuantize", inputs, list(dq.output), name=dq.name, domain=DOMAIN, low=low, high=high
        )
        if axis is not None:
            node.attribute.append(onnx.helper.make_attribute("axis", axis))
        fused[id(dq)] = node
    graph.initializer.extend(zero_points)
    return write_fused(model, fused, set(), _function(version)) if fused else 0


def _parameters(
    node: onnx.NodeProto, values: dict[str, TensorProto]
) -> tuple[tuple[float, ...], tuple[int, ...], int | None] | None:
    """A Q or DQ node's constant scales, zero points (0 where absent) and axis (None: per tensor);
    None where either is computed or the quantization is block-wise."""
    attrs = attributes(node)
    scale = values.get(node.input[1])
    has_zero = len(node.input) > 2 and bool(node.input[2])
    zero = values.get(node.input[2]) if has_zero else None
    if attrs.get("block_size", 0) or scale is None or (has_zero and zero is None):
        return None
    if scale.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
        return None
    scales = numpy_helper.to_array(scale).astype(np.float64).reshape(-1)
    zeros = (
        np.zeros(1, np.int64) if zero is None else numpy_helper.to_array(zero).astype(np.int64).reshape(-1)
    )
    axis = None if len(scale.dims) == 0 or scales.size == 1 else int(attrs.get("axis", 1))
    return tuple(scales.tolist()), tuple(zeros.tolist()), axis


def _quantized_type(q: onnx.NodeProto, values: dict[str, TensorProto]) -> int:
    """The type a QuantizeLinear writes: its zero point's, else its ``output_dtype`` (opset 21),
    else uint8."""
    zero = values.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    if zero is not None:
        return int(zero.data_type)
    return int(attributes(q).get("output_dtype", 0)) or TensorProto.UINT8


def _function(version: int) -> onnx.FunctionProto:
    """xaudit.FakeQuantize's body in the model's own opset: the pair it stands for, over ``axis``."""
    make = onnx.helper.make_node
    body = [
        make(_QUANTIZE, ["x", "scale", "zero_point"], ["q"]),
        make(_DEQUANTIZE, ["q", "scale", "zero_point"], ["y"]),
    ]
    for node in body:
        node.attribute.append(
            onnx.helper.make_attribute_ref("axis", onnx.AttributeProto.INT, ref_attr_name="axis")
        )
    return onnx.helper.make_function(
        DOMAIN,
        "FakeQuantize",
        ["x", "scale", "zero_point"],
        ["y"],
        body,
        [onnx.helper.make_opsetid("", version)],
        attributes=["axis", "low", "high"],
    )
