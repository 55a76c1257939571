"""Where the batch goes in each fixed ``Reshape`` or ``Expand`` shape of a fixed-batch graph, found
by following the rows through it.

A Reshape to a constant shape that holds the batch of 1 as a size of its own is rewritten by that
size alone (workers/models/pinned_shapes.py). Attention written sequence first has none: torch's
``nn.MultiheadAttention`` reshapes the (L, 1, E) queries to (L, H, d) and later its (L, 1, H, d)
result to (L, E), and the sizes alone do not say whether the rows go into (L, B*H, d) or
(L*B, H, d). Both keep the memory order at batch 1; one attends within a row and the other across.

So the graph is walked in order at a probe batch of :data:`PROBE` rows, each tensor's shape found by
onnx's inference node by node, and the batch followed as (axis, inner): the axis that holds it and
the product of that axis' sizes laid out inside it (1 where the batch is the axis' major factor or
the axis itself). A Reshape keeps the number of elements laid out after the batch, so its result can
hold the batch in few places, tried in order: an axis of size 1 of its own, then the later axes
first (the batch beside the heads, as attention needs it). A choice is undone, and the next tried,
where a later node's shapes disagree at the probe batch (a Linear given (L, B*E)), where the batch
would stand in two axes of one tensor (a product of every row with every other), where the
explained input's rows are lost (a shape fixed at one row; a held input's rows may be, being one
sample's in every call), or where an output does not lead with the rows.

A shape counts as fixed where it has the same value at the probe batch as at one row: a constant,
or a size computed from sizes that do not grow with the rows (the legacy exporter reads a window's
sizes from the input's shape and writes the batch of 1 beside them). The sizes at one row come
from a first walk, since onnx's inference leaves sizes computed from sizes open. The walk is
bounded; where it is undecided or an operator is beyond onnx's inference, the caller keeps its local
rule. Either way rebatch.py's two-row check decides.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from workers.models.onnx_shapes import SHAPE_BYTES, nbytes

__all__ = ["PROBE", "OneRow", "one_row_tensors", "rows_axes", "shapes_keeping_rows"]

PROBE = 3  # rows: a prime, so that a batch folded with another axis cannot pass for a size of its own
_FREE = 5  # another symbolic size, where only the rows' places are wanted: a prime other than PROBE
_STANDARD = ("", "ai.onnx")
# Operators that keep the memory order: the batch keeps the elements laid out after it.
_RESHAPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
_SHAPED = ("Reshape", "Expand")  # operators given a shape, which an exporter may have fixed
_MAX_CHOICES = 400  # nested ambiguous Reshapes (the walk recurses once per choice)


@dataclass(frozen=True)
class OneRow:
    """A tensor at one row: its sizes, and whether it is computed from the graph's constants alone
    (the legacy exporter writes ``expand(1, -1, -1)`` of a class token as such a computation)."""

    dims: tuple[int, ...]
    fixed: bool
    value: np.ndarray | None  # where it is small and known (a shape)


@dataclass(frozen=True)
class _Tensor:
    dims: tuple[int, ...]  # at the walk's rows
    elem_type: int
    fixed: bool  # from constants alone: the same at any batch
    batch: tuple[int, int | None] | None = None  # (axis, inner); inner None where it was not followed
    value: np.ndarray | None = None  # small tensors whose values are known (shapes, indices)
    # Its rows come from the explained input's. A held input's rows are one sample's, repeated in
    # every call (workers/models/named.py): a graph may read its first alone (BERT's mask, exported
    # from one row, is gathered at row 0's positions) where the explained rows must stay apart.
    explains: bool = False


class _Undecided(Exception):
    """The walk cannot follow the batch through this graph (or ran out of steps)."""


class _Refuted(Exception):
    """A node's shapes at the probe batch contradict the places chosen for the rows before it."""


def one_row_tensors(
    model: onnx.ModelProto, batched: Collection[str] = (), free: int | None = None
) -> dict[str, OneRow] | None:
    """Every tensor of ``model`` at one row (the inputs ``batched`` at a batch of 1 where it is
    declared symbolic; another symbolic size at ``free``, where given), through the sizes it computes
    from sizes, which onnx's own inference leaves open; None where the walk cannot go through."""
    try:
        walk = _Walk(model, "", batched, 1, {}, free)
        found = walk.search(0, 0)
        return {n: OneRow(t.dims, t.fixed, t.value) for n, t in walk.tensors.items()} if found else None
    except _Undecided:
        return None


def shapes_keeping_rows(
    model: onnx.ModelProto, explained: str, held: Collection[str], alone: Mapping[str, OneRow]
) -> dict[str, np.ndarray] | None:
    """For each Reshape and Expand the rows reach whose shape is fixed in the graph (by the node's
    output's name): the shape that keeps the rows, the same at one row (a Reshape's result with -1
    where the rows go, an Expand's shape with 1 there). None where the walk cannot decide. The input
    ``explained`` and the inputs ``held`` lead with their rows, declared 1; ``alone`` is
    :func:`one_row_tensors` of ``model``."""
    try:
        walk = _Walk(model, explained, held, PROBE, alone)
        return dict(walk.kept) if walk.search(0, 0) else None
    except _Undecided:
        return None


def rows_axes(model: onnx.ModelProto, explained: str, held: Collection[str] = ()) -> dict[str, int]:
    """The axis of each tensor that holds the rows of ``explained`` (or of the inputs ``held``), for
    the tensors the walk follows them to; empty where it cannot. Each input's batch leads, declared
    1 or symbolic; its other symbolic sizes (a sequence's length) are read as :data:`_FREE`, which
    only places the rows: no graph is rewritten from these shapes."""
    alone = one_row_tensors(model, (explained, *held), _FREE)
    if alone is None:
        return {}
    try:
        walk = _Walk(model, explained, held, PROBE, alone, _FREE)
        found = walk.search(0, 0)
    except _Undecided:
        return {}
    return {name: t.batch[0] for name, t in walk.tensors.items() if t.batch is not None} if found else {}


class _Walk:
    """The graph's nodes in order at ``rows`` rows: at one row, its tensors; at more, where the rows
    go, the tensors at one row given (``alone``)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        explained: str,
        held: Collection[str],
        rows: int,
        alone: Mapping[str, OneRow],
        free: int | None = None,
    ) -> None:
        graph = model.graph
        if any(_has_subgraph(node) for node in graph.node) or model.functions:
            raise _Undecided  # control flow and local functions are beyond a node-by-node walk
        self.nodes = list(graph.node)
        self.rows = rows
        self.shapes = {name: tensor.dims for name, tensor in alone.items()}
        self.alone = alone
        self.opsets = list(model.opset_import)
        self.versions = {o.domain or "": o.version for o in model.opset_import}
        self.outputs = [o.name for o in graph.output]
        self.tensors: dict[str, _Tensor] = {}
        self.added: list[str] = []  # names in the order set, to undo a branch's
        self.kept: dict[str, np.ndarray] = {}
        self.steps = max(1000, 4 * len(self.nodes))
        for tensor in graph.initializer:
            size = nbytes(tensor)  # no numpy type: never read as a value
            value = numpy_helper.to_array(tensor) if size is not None and size <= SHAPE_BYTES else None
            self.tensors[tensor.name] = _Tensor(tuple(tensor.dims), tensor.data_type, True, value=value)
        for value_info in graph.input:
            kind = value_info.type.tensor_type
            if value_info.name in self.tensors:
                continue
            name = value_info.name
            dims = _declared(kind, name in (explained, *held), free)
            leads = name in (explained, *held) and len(dims) > 0 and dims[0] == 1 and rows > 1
            at_rows = (rows, *dims[1:]) if leads else dims
            batch = (0, 1) if leads else None
            self.tensors[name] = _Tensor(
                at_rows, kind.elem_type, False, batch, explains=leads and name == explained
            )

    def search(self, start: int, depth: int) -> bool:
        """Walk the nodes from ``start``; at a Reshape the rows reach, try each place for them."""
        if depth > _MAX_CHOICES:
            raise _Undecided
        for k in range(start, len(self.nodes)):
            self.steps -= 1
            if self.steps < 0:
                raise _Undecided
            node = self.nodes[k]
            places = self._places(node)
            if places is None:
                try:
                    self._step(node)
                except _Refuted:
                    return False
                continue
            mark = len(self.added)
            for axis, inner in places:
                self._set_reshaped(node, axis, inner)
                if self.search(k + 1, depth + 1):
                    return True
                self._undo(mark)
            return False
        return self.rows == 1 or self._outputs_lead_with_rows()

    def _fixed_shape(self, node: onnx.NodeProto) -> np.ndarray | None:
        """The shape a Reshape or an Expand of the rows is given, where it is the same as at one row:
        a constant, or computed without the rows' count (the legacy exporter reads a window's sizes
        from the input's shape and writes its batch of 1 as a constant beside them)."""
        if self.rows == 1 or node.op_type not in _SHAPED or node.domain not in _STANDARD:
            return None
        source, shape = self.tensors.get(node.input[0]), self.tensors.get(node.input[1])
        alone = self.alone.get(node.input[1])
        if source is None or source.batch is None or shape is None or alone is None:
            return None
        same = (
            shape.value is not None and alone.value is not None and np.array_equal(shape.value, alone.value)
        )
        return shape.value if same else None

    def _places(self, node: onnx.NodeProto) -> list[tuple[int, int]] | None:
        """For a Reshape of the rows to a fixed shape: the (axis, inner) its result can hold them at,
        in the order tried; None for any other node."""
        if node.op_type != "Reshape" or self._fixed_shape(node) is None:
            return None
        axis, inner = self.tensors[node.input[0]].batch  # type: ignore[misc]
        result, before = self.shapes.get(node.output[0]), self.shapes.get(node.input[0])
        if inner is None or result is None or before is None or 0 in result:
            return []
        after = inner * math.prod(before[axis + 1 :])  # elements laid out after the batch
        places = []
        for at, size in enumerate(result):
            laid_after = math.prod(result[at + 1 :])
            if after % laid_after == 0 and size % (after // laid_after) == 0:
                places.append((at, after // laid_after))
        own = [(at, i) for at, i in places if result[at] == 1]
        return own + [p for p in reversed(places) if result[p[0]] != 1]

    def _set_reshaped(self, node: onnx.NodeProto, axis: int, inner: int) -> None:
        alone = self.shapes[node.output[0]]
        dims = list(alone)
        dims[axis] *= self.rows
        elem = self.tensors[node.input[0]].elem_type
        explains = self.tensors[node.input[0]].explains
        self._add(node.output[0], _Tensor(tuple(dims), elem, False, (axis, inner), explains=explains))
        shape = np.array(alone, np.int64)
        shape[axis] = -1
        self.kept[node.output[0]] = shape

    def _step(self, node: onnx.NodeProto) -> None:
        """The node's outputs at the walk's rows."""
        for name in node.output:
            self.kept.pop(name, None)  # a choice a branch given up made
        inputs = [self.tensors.get(name) if name else None for name in node.input]
        if any(name and tensor is None for name, tensor in zip(node.input, inputs, strict=True)):
            raise _Undecided  # a tensor no earlier node wrote
        fixed = all(t is None or t.fixed for t in inputs)
        if node.op_type == "Shape" and node.domain in _STANDARD and inputs[0] is not None:
            ends = {a.name: a.i for a in node.attribute}
            dims = inputs[0].dims
            sizes = np.array(dims[ends.get("start", 0) : ends.get("end", len(dims))], np.int64)
            self._add(node.output[0], _Tensor((len(sizes),), onnx.TensorProto.INT64, fixed, value=sizes))
            return
        found = self._infer(node, self._expanded_rows(node))
        value = self._value(node, inputs, found)
        explains = any(t is not None and t.batch is not None and t.explains for t in inputs)
        for name, (dims, elem) in found.items():
            batch = self._batch_of(node, name, dims, inputs)
            self._add(name, _Tensor(dims, elem, fixed, batch, value, explains and batch is not None))

    def _expanded_rows(self, node: onnx.NodeProto) -> dict[str, np.ndarray]:
        """An Expand of the rows to a fixed shape that names their size at one row (torch writes
        ``expand_as`` so: (49, 3, 64, 32) for swin_v2's 49 windows of one image) expands by 1 there,
        which keeps the rows: that shape, by its name, for the inference; nothing for other nodes."""
        shape = self._fixed_shape(node) if node.op_type == "Expand" else None
        if shape is None:
            return {}
        source, alone = self.tensors[node.input[0]], self.shapes.get(node.input[0])
        if source.batch is None or alone is None:
            return {}
        axis = source.batch[0] + len(shape) - len(source.dims)
        if axis < 0 or shape[axis] == 1 or shape[axis] != alone[source.batch[0]]:
            return {}
        ones = shape.astype(np.int64)
        ones[axis] = 1
        self.kept[node.output[0]] = ones
        return {node.input[1]: ones}

    def _infer(
        self, node: onnx.NodeProto, given: Mapping[str, np.ndarray]
    ) -> dict[str, tuple[tuple[int, ...], int]]:
        """onnx's inference of the node's output shapes and types at the walk's rows (``given``:
        values that replace inputs' own)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.versions.get(node.domain or "", 1), node.domain)
        except Exception as exc:  # an operator of a domain onnx does not know
            raise _Undecided from exc
        types, data = {}, {}
        for name in filter(None, node.input):
            tensor = self.tensors[name]
            types[name] = helper.make_tensor_type_proto(tensor.elem_type, list(tensor.dims))
            value = given.get(name, tensor.value)
            if value is not None:
                data[name] = numpy_helper.from_array(value, name)
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=self.opsets
            )
        except Exception as exc:  # the shapes disagree (or onnx cannot tell: the budget bounds that)
            raise _Refuted from exc
        found = {}
        for name in filter(None, node.output):
            kind = inferred.get(name)
            if kind is None or not kind.HasField("tensor_type") or not kind.tensor_type.HasField("shape"):
                raise _Undecided
            dims = kind.tensor_type.shape.dim
            if not all(d.HasField("dim_value") for d in dims):
                raise _Undecided  # a size known only at run time (NonZero...)
            found[name] = (tuple(d.dim_value for d in dims), kind.tensor_type.elem_type)
        return found

    def _value(
        self,
        node: onnx.NodeProto,
        inputs: list[_Tensor | None],
        found: Mapping[str, tuple[tuple[int, ...], int]],
    ) -> np.ndarray | None:
        """A one-output node's value where every input's is known and the output is small (the sizes
        an Expand or a Resize is given, computed from the rows' count)."""
        if len(found) != 1 or any(t is not None and t.value is None for t in inputs):
            return None
        if any(math.prod(dims) * 8 > SHAPE_BYTES for dims, _ in found.values()):
            return None
        feeds = {name: t.value for name, t in zip(node.input, inputs, strict=True) if t is not None}
        try:
            return np.asarray(ReferenceEvaluator(node).run(None, feeds)[0])  # type: ignore[index]
        except Exception:  # values help later nodes' inference; they are not needed
            return None

    def _batch_of(
        self, node: onnx.NodeProto, name: str, dims: tuple[int, ...], inputs: list[_Tensor | None]
    ) -> tuple[int, int | None] | None:
        """Where an output holds the rows, from its sizes at one row and at the probe batch (None
        where it holds none); refuted where they are not one batch in one axis."""
        if self.rows == 1:
            return None
        alone = self.shapes.get(name)
        if alone is None:
            raise _Undecided
        rows = [(t.batch, self.shapes[n]) for t, n in zip(inputs, node.input, strict=True) if t and t.batch]
        grown = [k for k, (a, b) in enumerate(zip(alone, dims, strict=False)) if a != b]
        if (
            len(alone) != len(dims)
            or len(grown) > 1
            or (grown and dims[grown[0]] != self.rows * alone[grown[0]])
        ):
            raise _Refuted  # the rows in two axes (every row met with every other)
        if not grown:
            if any(t is not None and t.batch is not None and t.explains for t in inputs):
                raise _Refuted  # the rows lost: a shape fixed at one row, a reduction over them
            return None
        axis = grown[0]
        if alone[axis] == 1:
            return axis, 1
        if node.op_type in _RESHAPING and node.domain in _STANDARD and rows:
            (source_axis, inner), before = rows[0]
            if inner is None:
                return axis, None
            after = inner * math.prod(before[source_axis + 1 :])
            laid_after = math.prod(alone[axis + 1 :])
            if after % laid_after or alone[axis] % (after // laid_after):
                raise _Refuted
            return axis, after // laid_after
        carried = {inner for (at, inner), before in rows if before[at] == alone[axis]}
        return axis, (carried.pop() if len(carried) == 1 else None)

    def _outputs_lead_with_rows(self) -> bool:
        """Every output declared with a leading 1 holds the rows there, and no other holds them."""
        for name in self.outputs:
            tensor, alone = self.tensors.get(name), self.shapes.get(name)
            if tensor is None or alone is None:
                return False
            held, leads = tensor.batch is not None, bool(alone) and alone[0] == 1
            if held != leads or (tensor.batch is not None and tensor.batch[0] != 0):
                return False
        return True

    def _add(self, name: str, tensor: _Tensor) -> None:
        self.tensors[name] = tensor
        self.added.append(name)

    def _undo(self, mark: int) -> None:
        for name in self.added[mark:]:
            del self.tensors[name]
            self.kept.pop(name, None)
        del self.added[mark:]


def _declared(kind: onnx.TypeProto.Tensor, rows: bool, free: int | None) -> tuple[int, ...]:
    """An input's declared sizes, a symbolic batch read as 1 where it holds ``rows``, another symbolic
    size as ``free`` (none given: the walk stops)."""
    if not kind.HasField("shape"):
        raise _Undecided
    dims = []
    for k, dim in enumerate(kind.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif k == 0 and rows:
            dims.append(1)
        elif free is not None:
            dims.append(free)
        else:
            raise _Undecided
    return tuple(dims)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)
