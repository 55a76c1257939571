"""Constant shapes that pin a fixed-batch model's batch to 1, rewritten to keep the rows.

torch's dynamo exporter, given a batch-1 example and no dynamic axes (its default), writes the
example's sizes into every shape: ``torch.flatten(x, 1)`` before a classifier becomes
``Reshape(x, (1, 512))``, which fails at two rows. Most of torchvision's CNNs exported so stop
there and only there (workers/models/rebatch.py then evaluated them one row per call, 2^n calls a
sample, and DeepLIFT had no graph call over all rows). Two rewrites keep such a graph the same
model at batch 1 and let more rows through:

- a ``Reshape`` to a constant shape whose result starts with the batch of 1 reshapes to that
  result's sizes at batch 1 (shape inference: every size is static there) with the first one -1;
- a ``Gather`` of a flattened tensor at ``arange(N)`` laid out in the tensor's own shape (how the
  exporter writes an ``as_strided`` view that is the identity: convnext's pooled features) is that
  tensor itself.

Nothing here decides that the rewritten graph computes row by row: rebatch.py checks it on two
rows against the original and keeps the original where they differ (a Reshape whose leading 1 was
not the batch, a class token concatenated at batch 1).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.onnx_shapes import SHAPE_BYTES, infer_shapes_light

__all__ = ["unpin_constant_shapes"]

_STANDARD = ("", "ai.onnx")


def unpin_constant_shapes(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` (its batch still declared 1) in place as the module says; the number of
    nodes rewritten, 0 where none was (or shapes cannot be inferred)."""
    graph = model.graph
    constants = _constants(graph)
    try:
        infer_shapes_light(model)
    except Exception:  # onnx's inference refuses some valid graphs: nothing to rewrite then
        return 0
    shapes = _static_shapes(graph)
    del graph.value_info[:]  # the batch-1 shapes found are no longer true of the rewritten graph
    flattened = {
        node.output[0]: node.input[0]
        for node in graph.node
        if _standard(node, "Reshape") and _values(constants.get(node.input[1])) == [-1]
    }
    count = 0
    for node in graph.node:
        if _standard(node, "Reshape") and node.input[1] in constants:
            result = shapes.get(node.output[0])
            if result and result[0] == 1 and 0 not in result and len(result) > 1:
                name = f"{node.output[0]}_xaudit_rows_shape"
                graph.initializer.append(numpy_helper.from_array(np.array([-1, *result[1:]], np.int64), name))
                node.input[1] = name
                count += 1
        elif (
            _standard(node, "Gather")
            and node.input[0] in flattened
            and _is_identity_gather(node, constants.get(node.input[1]), shapes.get(flattened[node.input[0]]))
        ):
            source = flattened[node.input[0]]
            node.op_type = "Identity"
            del node.input[:], node.attribute[:]
            node.input.append(source)
            count += 1
    if count:
        _drop_unread(graph)
    return count


def _standard(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in _STANDARD


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Small constant tensors (initializers and Constant nodes) by name: shapes and indices."""
    found = {t.name: t for t in graph.initializer if _small(t)}
    for node in graph.node:
        if _standard(node, "Constant") and len(node.output) == 1:
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
            if tensor is not None and _small(tensor):
                found[node.output[0]] = tensor
    return found


def _small(tensor: onnx.TensorProto) -> bool:
    return int(np.prod(tensor.dims, dtype=np.int64)) * 8 <= SHAPE_BYTES


def _values(tensor: onnx.TensorProto | None) -> list[int] | None:
    if tensor is None or tensor.data_type != onnx.TensorProto.INT64:
        return None
    return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Tensor name -> its sizes, where inference found every one of them."""
    shapes = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        dims = info.type.tensor_type.shape.dim
        if info.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = [d.dim_value for d in dims]
    return shapes


def _is_identity_gather(
    node: onnx.NodeProto, indices: onnx.TensorProto | None, source: list[int] | None
) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if indices is None or source is None or axis != 0 or list(indices.dims) != source:
        return False
    values = _values(indices)
    return values is not None and values == list(range(len(values)))


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Drop the nodes and initializers nothing reads any more (the flattening Reshapes behind an
    identity Gather, the shapes replaced), so that no session warns of them and the torch graph does
    not compute them."""
    while True:
        read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        read |= {name for node in graph.node for sub in _subgraphs(node) for name in _names_read(sub)}
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    unread = [t for t in graph.initializer if t.name not in read]
    for tensor in unread:
        graph.initializer.remove(tensor)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]


def _names_read(graph: onnx.GraphProto) -> set[str]:
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for sub in _subgraphs(node):
            names |= _names_read(sub)
    return names
