"""onnxruntime's fused operators written back as ONNX's own, for the methods' torch graph.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``), which CPU deployments
run on a BERT before serving it, fuses each residual sum with the layer norm after it into
``com.microsoft.SkipLayerNormalization`` and each bias with the exact GELU after it into
``com.microsoft.BiasGelu``. Only onnxruntime runs them: the torch conversion has no converter, so
every gradient and rule method was not applicable. Written back as ``Add`` + ``LayerNormalization``
and ``Add`` + the five operators of the exact GELU (which workers.models.gelu_fusion then fuses into
one ``gelu``), the methods' graph is the unfused model's, its layer norms where LRP's transformer
rules find them. The game runs the model as given.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["unfuse_onnxruntime_ops"]

_DOMAIN = "com.microsoft"
_LAYER_NORM_OPSET = 17  # LayerNormalization joined ONNX at opset 17
_SKIP_LAYER_NORM_EPSILON = 1e-12  # onnxruntime's default for SkipLayerNormalization
# The GELU's constants, as workers.models.gelu_fusion looks for them.
_SCALARS = {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}


def unfuse_onnxruntime_ops(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s main graph in place: SkipLayerNormalization, BiasGelu and onnxruntime's Gelu
    as ONNX's own operators; returns how many were rewritten. A model below opset 17 (no
    LayerNormalization), or a SkipLayerNormalization whose mean or inverse deviation is read, is left
    as it is (the methods then name the operator they cannot convert)."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version < _LAYER_NORM_OPSET:
        return 0
    graph = model.graph
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    taken = {t.name for t in graph.initializer} | {o for node in graph.node for o in node.output}
    scalars = {key: _fresh(f"xaudit_unfused_{key}", taken) for key in _SCALARS}
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        written = _written(node, read, scalars) if node.domain == _DOMAIN else None
        nodes.extend([node] if written is None else written)
        rewritten += written is not None
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        used = {name for node in nodes for name in node.input}
        graph.initializer.extend(
            numpy_helper.from_array(np.array(_SCALARS[key], np.float32), name)
            for key, name in scalars.items()
            if name in used
        )
    return rewritten


def _written(node: onnx.NodeProto, read: set[str], scalars: dict[str, str]) -> list[onnx.NodeProto] | None:
    if node.op_type == "SkipLayerNormalization":
        return _skip_layer_norm(node, read)
    if node.op_type == "BiasGelu":
        total = f"{node.output[0]}/biased"
        add = helper.make_node("Add", list(node.input[:2]), [total], name=f"{_name(node)}/bias")
        return [add, *_gelu(total, node.output[0], _name(node), scalars)]
    if node.op_type == "Gelu":
        return _gelu(node.input[0], node.output[0], _name(node), scalars)
    return None


def _skip_layer_norm(node: onnx.NodeProto, read: set[str]) -> list[onnx.NodeProto] | None:
    """LayerNorm(input + skip (+ bias)) * gamma (+ beta), its sum also as output 3 where asked."""
    inputs = list(node.input) + [""] * (5 - len(node.input))
    data, skip, gamma, beta, bias = inputs[:5]
    outputs = list(node.output) + [""] * (4 - len(node.output))
    if any(name and name in read for name in outputs[1:3]):  # the mean or inverse deviation is read
        return None
    name = _name(node)
    total = outputs[3] or f"{outputs[0]}/skip_sum"
    summed = f"{total}/unbiased" if bias else total
    nodes = [helper.make_node("Add", [data, skip], [summed], name=f"{name}/skip")]
    if bias:
        nodes.append(helper.make_node("Add", [summed, bias], [total], name=f"{name}/bias"))
    epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), _SKIP_LAYER_NORM_EPSILON)
    norm_inputs = [total, gamma, beta] if beta else [total, gamma]
    nodes.append(
        helper.make_node(
            "LayerNormalization", norm_inputs, [outputs[0]], name=f"{name}/norm", axis=-1, epsilon=epsilon
        )
    )
    return nodes


def _gelu(x: str, y: str, name: str, scalars: dict[str, str]) -> list[onnx.NodeProto]:
    """``y = x * (erf(x / sqrt 2) + 1) * 0.5``, the exact GELU as the legacy exporter writes it."""
    make = helper.make_node
    return [
        make("Div", [x, scalars["sqrt2"]], [f"{y}/scaled"], name=f"{name}/div"),
        make("Erf", [f"{y}/scaled"], [f"{y}/erf"], name=f"{name}/erf"),
        make("Add", [f"{y}/erf", scalars["one"]], [f"{y}/gate"], name=f"{name}/add"),
        make("Mul", [x, f"{y}/gate"], [f"{y}/gated"], name=f"{name}/mul"),
        make("Mul", [f"{y}/gated", scalars["half"]], [y], name=f"{name}/half"),
    ]


def _name(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _fresh(name: str, taken: set[str]) -> str:
    found, index = name, 0
    while found in taken:
        index += 1
        found = f"{name}_{index}"
    return found
