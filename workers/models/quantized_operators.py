"""onnxruntime's QOperator format written as QDQ for the methods' graph.

Older quantized models (``quantize_static(..., quant_format=QuantFormat.QOperator)``, and the ONNX
Model Zoo's int8 models) compute on integer tensors with one operator per quantized layer:
``QLinearConv``, ``QLinearMatMul`` and onnxruntime's ``QGemm``, ``QLinearAdd``, ``QLinearMul``,
``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearConcat``, ``QLinearSigmoid`` and
``QLinearLeakyRelu``, with ``MaxPool``, ``Flatten`` and other data movement applied to the integers
themselves. Each such operator is, by its definition, its float operator between
``DequantizeLinear`` of its inputs and ``QuantizeLinear`` of its output (an integer bias is the
float bias quantized with the scale ``x_scale * w_scale`` and zero point 0); a data movement or max
pooling of integers commutes with the dequantization (monotone, elementwise). Written so, the model
is QDQ, and workers/models/fake_quantization.py takes it from there (docs/science.md 5.9).

Only the methods' graph is rewritten; the game runs the model itself on onnxruntime. An operator
with attributes this rewrite does not write (channels-last pooling, a ``QGemm`` with ``alpha`` other
than 1) stays as it is and is named.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from workers.models.onnx_nodes import attributes, constant_tensors

__all__ = ["as_qdq"]

_Q, _DQ = "QuantizeLinear", "DequantizeLinear"
# Operators that move or pick integer values without computing new ones: they commute with a
# (monotone, elementwise) dequantization, so op(q) = Q(op(DQ(q))) with q's own scale and zero point.
_COMMUTING = {"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice"}
_Params = tuple[str, str]  # a quantized tensor's scale and zero point (tensor names)


class _Writer:
    """The rewritten node list, new constants and the quantization of each integer tensor."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.constants = constant_tensors(graph)
        self.nodes: list[onnx.NodeProto] = []
        self.params: dict[str, _Params] = {}
        self.count = 0

    def name(self, base: str, part: str) -> str:
        self.count += 1
        return f"{base}_xaudit_{part}_{self.count}"

    def dequantized(self, value: str, scale: str, zero: str, axis: int | None = None) -> str:
        out = self.name(value, "float")
        node = onnx.helper.make_node(_DQ, [value, scale, zero], [out])
        if axis is not None:
            node.attribute.append(onnx.helper.make_attribute("axis", axis))
        self.nodes.append(node)
        return out

    def quantized(self, value: str, out: str, scale: str, zero: str) -> None:
        self.nodes.append(onnx.helper.make_node(_Q, [value, scale, zero], [out]))
        self.params[out] = (scale, zero)

    def per_channel_axis(self, scale: str, axis: int) -> int | None:
        tensor = self.constants.get(scale)
        return axis if tensor is not None and len(tensor.dims) == 1 and tensor.dims[0] > 1 else None

    def float_bias(self, bias: str, scales: list[str], name: str) -> str | None:
        """The float bias of an int32 ``bias`` quantized with the product of ``scales``, zero point 0."""
        values = [self.constants.get(n) for n in (bias, *scales)]
        if any(v is None for v in values):
            return None
        ints, *factors = (numpy_helper.to_array(v).astype(np.float32) for v in values if v is not None)
        scale = np.ones(1, np.float32)
        for factor in factors:
            scale = scale * factor.reshape(-1)
        tensor = numpy_helper.from_array((ints * scale).astype(np.float32), self.name(name, "bias"))
        self.graph.initializer.append(tensor)
        self.constants[tensor.name] = tensor
        return tensor.name


def _conv(w: _Writer, node: onnx.NodeProto) -> bool:
    names: list[str] = [*node.input, ""]
    x, xs, xz, weight, ws, wz, ys, yz, given = names[:9]
    inputs = [w.dequantized(x, xs, xz), w.dequantized(weight, ws, wz, w.per_channel_axis(ws, 0))]
    if given:
        bias = w.float_bias(given, [xs, ws], node.output[0])
        if bias is None:
            return False
        inputs.append(bias)
    out = w.name(node.output[0], "conv")
    w.nodes.append(onnx.helper.make_node("Conv", inputs, [out], name=node.name, **attributes(node)))
    w.quantized(out, node.output[0], ys, yz)
    return True


def _matmul(w: _Writer, node: onnx.NodeProto) -> bool:
    a, as_, az, b, bs, bz, ys, yz = node.input
    inputs = [w.dequantized(a, as_, az), w.dequantized(b, bs, bz, w.per_channel_axis(bs, -1))]
    out = w.name(node.output[0], "matmul")
    w.nodes.append(onnx.helper.make_node("MatMul", inputs, [out], name=node.name))
    w.quantized(out, node.output[0], ys, yz)
    return True


def _gemm(w: _Writer, node: onnx.NodeProto) -> bool:
    attrs = attributes(node)
    if float(attrs.get("alpha", 1.0)) != 1.0:
        return False
    a, as_, az, b, bs, bz, *rest = node.input
    c, ys, yz = [*rest, "", "", ""][:3]
    channel = 0 if attrs.get("transB", 0) else 1
    inputs = [w.dequantized(a, as_, az), w.dequantized(b, bs, bz, w.per_channel_axis(bs, channel))]
    if c:
        bias = w.float_bias(c, [as_, bs], node.output[0])
        if bias is None:
            return False
        inputs.append(bias)
    quantized = bool(ys)
    out = w.name(node.output[0], "gemm") if quantized else node.output[0]
    kept = {k: v for k, v in attrs.items() if k in ("transA", "transB")}
    w.nodes.append(onnx.helper.make_node("Gemm", inputs, [out], name=node.name, **kept))
    if quantized:
        w.quantized(out, node.output[0], ys, yz or _zero_like(w, node.input[2]))
    return True


def _binary(op: str) -> Callable[[_Writer, onnx.NodeProto], bool]:
    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        a, as_, az, b, bs, bz, ys, yz = node.input
        out = w.name(node.output[0], op.lower())
        inputs = [w.dequantized(a, as_, az), w.dequantized(b, bs, bz)]
        w.nodes.append(onnx.helper.make_node(op, inputs, [out], name=node.name))
        w.quantized(out, node.output[0], ys, yz)
        return True

    return rewrite


def _unary(op: str, kept: tuple[str, ...] = ()) -> Callable[[_Writer, onnx.NodeProto], bool]:
    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        attrs = attributes(node)
        if attrs.get("channels_last", 0):
            return False
        x, xs, xz, ys, yz = node.input
        out = w.name(node.output[0], op.lower())
        extra = {k: v for k, v in attrs.items() if k in kept}
        w.nodes.append(onnx.helper.make_node(op, [w.dequantized(x, xs, xz)], [out], name=node.name, **extra))
        w.quantized(out, node.output[0], ys, yz)
        return True

    return rewrite


def _concat(w: _Writer, node: onnx.NodeProto) -> bool:
    ys, yz, *parts = node.input
    if len(parts) % 3:
        return False
    inputs = [w.dequantized(*parts[i : i + 3]) for i in range(0, len(parts), 3)]
    out = w.name(node.output[0], "concat")
    w.nodes.append(
        onnx.helper.make_node("Concat", inputs, [out], name=node.name, axis=attributes(node)["axis"])
    )
    w.quantized(out, node.output[0], ys, yz)
    return True


_POOL_ATTRIBUTES = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
_REWRITES: dict[tuple[str, str], Callable[[_Writer, onnx.NodeProto], bool]] = {
    ("", "QLinearConv"): _conv,
    ("", "QLinearMatMul"): _matmul,
    ("com.microsoft", "QGemm"): _gemm,
    ("com.microsoft", "QLinearAdd"): _binary("Add"),
    ("com.microsoft", "QLinearMul"): _binary("Mul"),
    ("com.microsoft", "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    ("com.microsoft", "QLinearAveragePool"): _unary("AveragePool", _POOL_ATTRIBUTES),
    ("com.microsoft", "QLinearSigmoid"): _unary("Sigmoid"),
    ("com.microsoft", "QLinearLeakyRelu"): _unary("LeakyRelu", ("alpha",)),
    ("com.microsoft", "QLinearConcat"): _concat,
}


def _zero_like(w: _Writer, zero: str) -> str:
    """A zero point of ``zero``'s type for an output quantized with a scale but none given."""
    tensor = w.constants.get(zero)
    kind = tensor.data_type if tensor is not None else TensorProto.UINT8
    made = onnx.helper.make_tensor(w.name(zero or "zero", "zero_point"), kind, [], [0])
    w.graph.initializer.append(made)
    return made.name


def as_qdq(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s QOperator nodes (module docstring) in place; returns how many."""
    graph = model.graph
    if not any((n.domain or "", n.op_type) in _REWRITES for n in graph.node):
        return 0
    w = _Writer(graph)
    rewritten = 0
    for node in graph.node:
        rewrite = _REWRITES.get((node.domain or "", node.op_type))
        start = len(w.nodes)
        if rewrite is not None and rewrite(w, node):
            rewritten += 1
            continue
        del w.nodes[start:]  # a rewrite that gave up leaves the node as it was
        if node.op_type == _Q and not node.domain and len(node.input) > 2:
            w.params[node.output[0]] = (node.input[1], node.input[2])
        elif node.op_type in _COMMUTING and not node.domain and node.input[0] in w.params:
            scale, zero = w.params[node.input[0]]
            moved = onnx.NodeProto()
            moved.CopyFrom(node)
            moved.input[0] = w.dequantized(node.input[0], scale, zero)
            moved.output[0] = w.name(node.output[0], "moved")
            w.nodes.append(moved)
            w.quantized(moved.output[0], node.output[0], scale, zero)
            continue
        w.nodes.append(node)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    if opsets.get("", 0) < 13 and any(n.op_type == _DQ and n.attribute for n in w.nodes):
        return 0  # per-channel scales need opset 13's DequantizeLinear: left as they were
    del graph.node[:]
    graph.node.extend(w.nodes)
    return rewritten
