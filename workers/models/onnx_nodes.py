"""What the graph rewrites before the torch conversion read of ONNX nodes and tensors, written once
(workers/models/ort_unfusion.py, ml_ops.py, dense_layers.py, pinned_shapes.py, pooled_rows.py)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper, numpy_helper

__all__ = ["attributes", "constant_tensors", "declared_ranks", "reduced_axes"]


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes by name, as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def declared_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> rank, where the graph's inputs, value infos or outputs declare a shape."""
    return {
        info.name: len(info.type.tensor_type.shape.dim)
        for info in (*graph.input, *graph.value_info, *graph.output)
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape")
    }


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's constant tensors by name: its initializers, and the tensors its ``Constant``
    nodes hold (Keras writes its Normalization layer's mean and variance so; the legacy exporter its
    shapes), to be read as weights are."""
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
            if tensor is not None:
                found[node.output[0]] = tensor
    return found


def reduced_axes(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The axes a Reduce node names: its attribute, or from opset 18 a constant second input; [] where
    it names none (all of them), None where its second input is computed."""
    attrs = attributes(node)
    if "axes" in attrs:
        return list(attrs["axes"])
    if len(node.input) > 1 and node.input[1]:
        axes = constants.get(node.input[1])
        return None if axes is None else numpy_helper.to_array(axes).reshape(-1).tolist()
    return []
