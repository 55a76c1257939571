"""Constant shapes that pin a fixed-batch model's batch to 1, rewritten to keep the rows.

torch's dynamo exporter, given a batch-1 example and no dynamic axes (its default), writes the
example's sizes into every shape: ``torch.flatten(x, 1)`` before a classifier becomes
``Reshape(x, (1, 512))``, which fails at two rows. Most of torchvision's CNNs exported so stop
there and only there (workers/models/rebatch.py then evaluated them one row per call, 2^n calls a
sample, and DeepLIFT had no graph call over all rows). The TorchScript-based exporter without
``dynamic_axes`` reads most sizes from the input's at run time but writes the batch of 1 beside
them. Five rewrites keep such a graph the same model at batch 1 and let more rows through:

- a ``Reshape`` of the rows to a fixed shape reshapes to its result at batch 1 with the batch's -1
  where workers/models/batch_placement.py follows the rows to (also inside another axis:
  sequence-first attention's (L, 1, E) queries split into (L, H, d) hold them beside the heads,
  (L, B*H, d)), and an ``Expand`` of the rows to a fixed shape that names their size at one row
  takes 1 there; where the walk cannot follow them, a Reshape to a constant shape takes the -1 at
  the first size of 1, else at its one size of 1 (time-major recurrent outputs (T, 1, H));
- a recurrent operator's initial state given as constant zeros, sized for one row (the exporter
  writes ``nn.LSTM``'s default state so), is left to the operator, whose default is zeros;
- a ``Resize`` to constant sizes that keep the batch of 1 (``F.interpolate(x, size=...)``, as
  LRASPP's segmentation head upsamples) takes its input's own rows as the first size;
- a constant of one row (or a tensor computed from constants alone) that a ``Concat`` joins to the
  rows along another axis (a class token the exporter did not expand at batch 1), or that a
  ``GatherElements`` reads along another axis at the rows' indices (RoBERTa's buffered token-type
  ids), is expanded to the rows;
- a ``Gather`` of a flattened tensor at ``arange(N)`` laid out in the tensor's own shape (how the
  exporter writes an ``as_strided`` view that is the identity: convnext's pooled features) is that
  tensor itself.

Nothing here decides that the rewritten graph computes row by row: rebatch.py checks it on two
rows against the original and keeps the original where they differ (a Reshape whose leading 1 was
not the batch, where the walk could not follow the rows).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.batch_placement import OneRow, one_row_tensors, shapes_keeping_rows
from workers.models.onnx_nodes import constant_tensors, default_opset, drop_unread
from workers.models.onnx_shapes import SHAPE_BYTES, infer_shapes_light

__all__ = ["unpin_constant_shapes"]

_STANDARD = ("", "ai.onnx")
_RECURRENT = ("LSTM", "GRU", "RNN")
# Operators that put a constant of one row beside the rows along another axis.
_MEETS_ROWS = ("Concat", "GatherElements")


def unpin_constant_shapes(model: onnx.ModelProto, explained: str, held: Collection[str]) -> int:
    """Rewrite ``model`` (its batch still declared 1 on the input ``explained`` and the inputs
    ``held`` at one sample's values in every call) in place as the module says; the number of nodes
    rewritten, 0 where none was (or shapes cannot be inferred)."""
    graph = model.graph
    tensors = constant_tensors(graph)
    constants = {name: t for name, t in tensors.items() if _small(t)}  # shapes and indices
    fixed = {name: list(t.dims) for name, t in tensors.items()}
    alone = one_row_tensors(model)  # (it finds the legacy exporter's ``expand(1, -1, -1)`` fixed)
    fixed.update((name, list(t.dims)) for name, t in (alone or {}).items() if t.fixed and name not in fixed)
    shapes = _inferred_shapes(model)
    if shapes is None:
        return 0
    flattened = {
        node.output[0]: node.input[0]
        for node in graph.node
        if _standard(node, "Reshape") and _values(constants.get(node.input[1])) == [-1]
    }
    opset = default_opset(model)
    added: dict[str, list[onnx.NodeProto]] = {}  # by the output of the node that reads them
    count = 0
    for node in graph.node:
        if _standard(node, "Resize") and _resized_batch_pinned(node, constants, opset):
            sizes = f"{node.output[0]}_xaudit_sizes"
            rest = [int(v) for v in numpy_helper.to_array(constants[node.input[3]])[1:]]
            added[node.output[0]] = _rows_of(node.input[0], rest, sizes)
            node.input[3] = sizes  # the input's own rows, the other sizes as exported
            count += 1
        elif node.op_type in _MEETS_ROWS and node.domain in _STANDARD and opset >= 15:
            count += _expand_constant_rows(node, fixed, added)
        elif node.op_type in _RECURRENT and node.domain in _STANDARD:
            for k in (5, 6)[: 2 if node.op_type == "LSTM" else 1]:
                if k < len(node.input) and _all_zeros(constants.get(node.input[k])):
                    node.input[k] = ""  # the operator's own initial state: zeros, at any batch
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
    if added:  # each before the node that reads it, in the graph's order
        nodes = [made for node in graph.node for made in (*added.get(node.output[0], ()), node)]
        del graph.node[:]
        graph.node.extend(nodes)
    if count:
        drop_unread(graph)  # the flattening Reshapes behind an identity Gather
        alone = one_row_tensors(model)  # of the nodes added too
    count += _unpin_fixed_shapes(model, explained, held, constants, alone)
    if count:
        drop_unread(graph)
    return count


def _unpin_fixed_shapes(
    model: onnx.ModelProto,
    explained: str,
    held: Collection[str],
    constants: dict[str, onnx.TensorProto],
    alone: Mapping[str, OneRow] | None,
) -> int:
    """Each Reshape and Expand of the rows whose shape the graph fixes is given the shape that keeps
    them, where workers/models/batch_placement.py follows the rows to it (``alone``: the graph's
    tensors at one row, which it found); where it cannot, a Reshape to a constant shape reshapes to
    its result at batch 1 with -1 where the result's sizes alone say (``_batch_position``). The
    number of nodes rewritten."""
    kept = shapes_keeping_rows(model, explained, held, alone) if alone is not None else None
    if kept is None:
        kept, shapes = {}, _inferred_shapes(model) or {}
        for node in model.graph.node:
            result = shapes.get(node.output[0]) if _standard(node, "Reshape") else None
            at = _batch_position(result) if result and node.input[1] in constants else None
            if result and at is not None:
                kept[node.output[0]] = np.array(
                    [-1 if k == at else d for k, d in enumerate(result)], np.int64
                )
    count = 0
    for node in model.graph.node:
        if node.output and node.output[0] in kept:
            name = f"{node.output[0]}_xaudit_rows_shape"
            model.graph.initializer.append(numpy_helper.from_array(kept[node.output[0]], name))
            node.input[1] = name
            count += 1
    return count


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int]] | None:
    """Every tensor's static shape at batch 1, from onnx's inference (whose findings are dropped from
    the graph after, being no longer true of the rewritten one); None where it refuses the graph."""
    try:
        infer_shapes_light(model)
    except Exception:  # onnx's inference refuses some valid graphs: nothing to rewrite then
        return None
    shapes = _static_shapes(model.graph)
    del model.graph.value_info[:]
    return shapes


def _resized_batch_pinned(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto], opset: int) -> bool:
    """A Resize to constant sizes over every axis that keep the batch of 1 (interpolation to a fixed
    size, ``F.interpolate(x, size=...)``), at an opset whose ``Shape`` reads the rows alone (15)."""
    if len(node.input) < 4 or node.input[3] not in constants or opset < 15:
        return False
    if any(a.name == "axes" for a in node.attribute):
        return False
    sizes = _values(constants[node.input[3]])
    return sizes is not None and len(sizes) > 1 and sizes[0] == 1


def _expand_constant_rows(
    node: onnx.NodeProto, fixed: dict[str, list[int]], added: dict[str, list[onnx.NodeProto]]
) -> int:
    """A constant of one row that a Concat joins to the rows along another axis (a class token), or
    that a GatherElements reads along another axis at the rows' indices (RoBERTa's token-type ids),
    expanded to the rows of the node's first other input; the number of constants expanded."""
    rows_from = next((name for name in node.input if name and name not in fixed), None)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    constants = node.input[:1] if node.op_type == "GatherElements" else node.input
    count = 0
    for k, name in enumerate(constants):
        dims = fixed.get(name)
        if rows_from is None or not dims or dims[0] != 1 or axis in (0, -len(dims)):
            continue
        made = f"{node.output[0]}_xaudit_rows_{k}"
        expand = onnx.helper.make_node("Expand", [name, f"{made}_shape"], [made])
        added.setdefault(node.output[0], []).extend([*_rows_of(rows_from, dims[1:], f"{made}_shape"), expand])
        node.input[k] = made
        count += 1
    return count


def _rows_of(tensor: str, sizes: list[int], name: str) -> list[onnx.NodeProto]:
    """Nodes that write ``name``: ``tensor``'s rows (its first size, read at run time), then
    ``sizes`` (opset 15's Shape with start and end)."""
    rest = f"{name}_rest"
    return [
        onnx.helper.make_node("Shape", [tensor], [f"{name}_rows"], start=0, end=1),
        onnx.helper.make_node(
            "Constant", [], [rest], value=numpy_helper.from_array(np.array(sizes, np.int64), rest)
        ),
        onnx.helper.make_node("Concat", [f"{name}_rows", rest], [name], axis=0),
    ]


def _batch_position(result: list[int] | None) -> int | None:
    """Where a Reshape's result at batch 1 holds the batch, as far as its sizes tell: first where it
    leads with 1, else its one axis of size 1 (a time-major (T, 1, H) state), else nowhere."""
    if not result or len(result) < 2 or 0 in result:
        return None
    if result[0] == 1:
        return 0
    ones = [k for k, size in enumerate(result) if size == 1]
    return ones[0] if len(ones) == 1 else None


def _all_zeros(tensor: onnx.TensorProto | None) -> bool:
    return tensor is not None and not np.any(numpy_helper.to_array(tensor))


def _standard(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in _STANDARD


def _small(tensor: onnx.TensorProto) -> bool:
    return int(np.prod(tensor.dims, dtype=np.int64)) * 8 <= SHAPE_BYTES


def _values(tensor: onnx.TensorProto | None) -> list[int] | None:
    if tensor is None or tensor.data_type != onnx.TensorProto.INT64:
        return None
    return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Tensor name -> its sizes, where inference found every one of them (a type without a shape is
    a rank not found, not a scalar)."""
    shapes = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        kind = info.type.tensor_type
        known = info.type.HasField("tensor_type") and kind.HasField("shape")
        if known and all(d.HasField("dim_value") for d in kind.shape.dim):
            shapes[info.name] = [d.dim_value for d in kind.shape.dim]
    return shapes


def _is_identity_gather(
    node: onnx.NodeProto, indices: onnx.TensorProto | None, source: list[int] | None
) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if indices is None or source is None or axis != 0 or list(indices.dims) != source:
        return False
    values = _values(indices)
    return values is not None and values == list(range(len(values)))
