"""What the graph rewrites before the torch conversion read of ONNX nodes and tensors, written once
(workers/models/ort_unfusion.py, ml_ops.py, dense_layers.py)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

__all__ = ["attributes", "declared_ranks"]


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
