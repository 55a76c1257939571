"""onnx's shape inference without the weights' bytes, for the torch conversion.

onnx2torch infers shapes on the whole model before it converts it: onnx serialises the model,
weights and all, for its C++ inference and parses the result back, two more copies of the weights
at once (2 GB more at the peak for VGG11's 515 MB; models over 2 GB took a round trip through
temporary files). Shapes need an initializer's type and dimensions, and the values of the small
ones a Reshape, Slice or Expand reads. So the large initializers go in as graph inputs of their type
and shape, and the shapes found are written into the model itself (workers/models/onnx_to_torch.py
installs this as onnx2torch's shape inference).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

__all__ = ["SHAPE_BYTES", "infer_shapes_light", "inferred_tensors", "nbytes", "weightless"]

# Larger initializers are weights: no operator reads a shape or an index from that many bytes.
SHAPE_BYTES = 1 << 16


def infer_shapes_light(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    """``model`` with the value types onnx's shape inference finds (``kwargs``: its options), the
    inference run on a copy that holds only the initializers of at most :data:`SHAPE_BYTES`."""
    light, _ = weightless(model)
    inferred = onnx.shape_inference.infer_shapes(light, **kwargs)
    source = model.graph
    del source.value_info[:]
    source.value_info.extend(inferred.graph.value_info)
    for output, found in zip(source.output, inferred.graph.output, strict=True):
        output.type.CopyFrom(found.type)
    return model


def inferred_tensors(model: onnx.ModelProto) -> dict[str, tuple[list[int | None], int]]:
    """Each value's dims (None where symbolic) and element type, from :func:`infer_shapes_light`
    (which also writes them into ``model``, as the torch conversion does anyway)."""
    graph = infer_shapes_light(model).graph
    found: dict[str, tuple[list[int | None], int]] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            found[value.name] = (dims, tensor.elem_type)
    return found


def weightless(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of ``model`` with only the initializers of at most :data:`SHAPE_BYTES`, each larger one
    a graph input of its type and shape instead; and the names of the inputs so added."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.sparse_initializer.extend(source.sparse_initializer)
    declared = {value.name for value in source.input}
    added: set[str] = set()
    for tensor in source.initializer:
        if (nbytes(tensor) or 0) <= SHAPE_BYTES:  # no numpy type: kept
            graph.initializer.append(tensor)
        elif tensor.name not in declared:  # older exporters list weights as inputs too
            graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
            added.add(tensor.name)
    return light, added


def nbytes(tensor: onnx.TensorProto) -> int | None:
    """The tensor's size from its type and dimensions (reading its data would copy it); None where
    onnx knows no numpy type for it."""
    try:
        width = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return int(np.prod(tensor.dims, dtype=np.int64)) * width
