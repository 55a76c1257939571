"""Row indices an exporter wrote as the constant ``arange(1)``, rewritten to count the rows.

``x[torch.arange(B), index]`` picks one entry of each row. transformers' decoder classifiers pool so
(GPT-2, and every ``*ForSequenceClassification`` that reads the last non-padding token): their
logits at each row's last token. Exported from a batch-1 example without dynamic axes (each
exporter's default), ``arange(B)`` is the constant ``[0]``: the legacy exporter gathers the flattened
(rows x positions, classes) logits at ``argmax + [0] * positions``, the dynamo exporter writes
``GatherND(logits, Concat([[0]], argmax))``. At more rows every row then reads row 0's logits, and
rebatch.py's two-row check rightly refuses the widened graph: the model ran one row per call, and
the methods that need one graph call over all rows (LRP, Deep Taylor, DeepLIFT, Grad-CAM) did not
run.

Here each integer constant of one element 0 that reaches the indices of a ``Gather`` on axis 0 or of
a ``GatherND`` through index arithmetic (Add, Mul, Concat, Unsqueeze...) is read as the exporter's
``arange(1)`` and becomes ``Range(0, rows)`` in its shape, the rows counted on the explained input.
A constant 0 with another meaning would change the model: rebatch.py tries this rewrite only where
the graph fails its check without it, and the check decides.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.onnx_nodes import attributes, constant_node, constant_tensors, drop_unread

__all__ = ["count_rows_in_indices"]

_STANDARD = ("", "ai.onnx")
# Index arithmetic between the constant and the gather: None, any input; else the inputs that carry
# the value (not a Reshape's shape or an Unsqueeze's axes).
_ARITHMETIC: dict[str, tuple[int, ...] | None] = {
    "Add": None,
    "Sub": None,
    "Mul": None,
    "Concat": None,
    "Cast": (0,),
    "Unsqueeze": (0,),
    "Squeeze": (0,),
    "Reshape": (0,),
    "Expand": (0,),
}
_DEPTH = 8  # arithmetic steps followed from the constant to a gather
_INTEGER = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def count_rows_in_indices(model: onnx.ModelProto, explained: str) -> int:
    """Rewrite ``model`` in place: each constant ``arange(1)`` the module names becomes
    ``Range(0, rows of explained)``; the number of constants rewritten."""
    graph = model.graph
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, k))
    constants = constant_tensors(graph)
    # what a row index cannot pick from: a shape, or a constant (a lookup table, a weight)
    unpicked = {node.output[0] for node in graph.node if node.op_type == "Shape" and node.output} | set(
        constants
    )
    rewritten = 0
    added: list[onnx.NodeProto] = []
    for name, tensor in constants.items():
        if not _is_arange_of_one(tensor):
            continue
        uses = [
            (node, k)
            for node, k in readers.get(name, ())
            if _reaches_row_index(node, k, readers, unpicked, 0)
        ]
        if not uses:
            continue
        made = f"{name}_xaudit_row_count"
        added += _range_of_rows(explained, len(tensor.dims), tensor.data_type, made)
        for node, k in uses:
            node.input[k] = made
        rewritten += 1
    if added:  # they read the explained input alone: first in the graph's order
        nodes = [*added, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
        drop_unread(graph)  # the constants no reader is left for
    return rewritten


def _is_arange_of_one(tensor: onnx.TensorProto) -> bool:
    if tensor.data_type not in _INTEGER or not tensor.dims or any(d != 1 for d in tensor.dims):
        return False
    return bool(numpy_helper.to_array(tensor).reshape(-1)[0] == 0)


def _reaches_row_index(
    node: onnx.NodeProto,
    slot: int,
    readers: dict[str, list[tuple[onnx.NodeProto, int]]],
    unpicked: set[str],
    depth: int,
) -> bool:
    """Whether the value read at ``node``'s input ``slot`` becomes, through index arithmetic, the
    indices of a gather over the first axis of a computed tensor (not a shape, not a constant)."""
    if node.domain not in _STANDARD or depth > _DEPTH:
        return False
    attrs = attributes(node)
    if node.op_type == "Gather" and slot == 1:
        return attrs.get("axis", 0) == 0 and node.input[0] not in unpicked
    if node.op_type == "GatherND" and slot == 1:
        return attrs.get("batch_dims", 0) == 0 and node.input[0] not in unpicked
    if node.op_type not in _ARITHMETIC:
        return False
    slots = _ARITHMETIC[node.op_type]
    if slots is not None and slot not in slots:
        return False
    return any(
        _reaches_row_index(reader, k, readers, unpicked, depth + 1) for reader, k in _readers(node, readers)
    )


def _readers(
    node: onnx.NodeProto, readers: dict[str, list[tuple[onnx.NodeProto, int]]]
) -> Iterator[tuple[onnx.NodeProto, int]]:
    for output in node.output:
        yield from readers.get(output, ())


def _range_of_rows(explained: str, rank: int, data_type: int, made: str) -> list[onnx.NodeProto]:
    """Nodes that write ``made``: ``arange(rows of explained)`` shaped (rows, 1, ...) to ``rank``,
    of ``data_type``; each node named (onnx2torch names an unnamed one by its type and a count, which
    can meet an exporter's name: the legacy exporter's ``/Add_1`` is its ``Add_1`` too)."""

    def constant(suffix: str, value: np.ndarray) -> tuple[str, onnx.NodeProto]:
        name = f"{made}_{suffix}"
        return name, constant_node(name, value, value.dtype)

    zero, zero_node = constant("zero", np.array(0, np.int64))
    one, one_node = constant("one", np.array(1, np.int64))
    shape, shape_node = constant("shape", np.array([-1] + [1] * (rank - 1), np.int64))
    counted = f"{made}_range" if data_type != onnx.TensorProto.INT64 else made
    nodes = [
        zero_node,
        one_node,
        shape_node,
        onnx.helper.make_node("Shape", [explained], [f"{made}_dims"], name=f"{made}_dims"),
        onnx.helper.make_node(
            "Gather", [f"{made}_dims", zero], [f"{made}_rows"], name=f"{made}_rows", axis=0
        ),
        onnx.helper.make_node("Range", [zero, f"{made}_rows", one], [f"{made}_flat"], name=f"{made}_flat"),
        onnx.helper.make_node("Reshape", [f"{made}_flat", shape], [counted], name=counted),
    ]
    if counted != made:
        nodes.append(onnx.helper.make_node("Cast", [counted], [made], name=made, to=data_type))
    return nodes
