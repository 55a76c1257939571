"""Affine layers as exporters other than torch's write them, made whole for the methods' graph.

skl2onnx writes an MLP's layers as ``MatMul`` by the weight matrix then ``Add`` of the bias, after
a ``Cast`` of the standardised input to the float type it already has; tf2onnx writes Keras'
``Dense`` the same way. Keras 3's own ONNX export (torch backend) writes a ``Cast`` to float after
most layers and each ``Conv2D`` as ``Transpose`` (channels last to first), a bias-free ``Conv``,
``Transpose`` back, then ``Add`` of the bias. The rule methods' planners (LRP, Deep Taylor,
DeepLIFT's own pass, RevealCancel) have rules for a Linear or Conv layer but none for a MatMul, a
bias added after it or a Cast, so they were not applicable on such a model. Here, for the methods'
graph only:

- a ``Cast`` to the type its input is known to have is the identity (ONNX defines it so): its
  readers read its input (an ``Identity`` where it writes a graph output);
- a ``Conv`` whose output, directly or through one ``Transpose``, then gets constants that vary
  along the channel axis only added, subtracted, multiplied or divided by (a bias; an inference
  batch norm written out) takes them into its weight and bias (``_conv_affine``);
- ``MatMul(A, W)`` then ``Add(., b)``, with ``W`` a constant matrix, ``b`` a constant vector and
  ``A`` known to have rank 2, is ``Gemm(A, W, b)``: the same sums (the bias added once per output),
  which the torch conversion makes an ``nn.Linear``. A rank it cannot tell (a transformer's
  (batch, sequence, width) activations) leaves the pair as it is: ``Gemm`` is defined on matrices;
- a binary classifier's ``Concat(1 - sigmoid(z), sigmoid(z))`` over a one-column layer is one
  two-column layer and its sigmoid (``_two_class_sigmoids``);
- a run of such per-channel constants that scales and shifts an activation no Conv took in (a
  batch norm after a pooling or a concatenation, a Normalization layer, as Keras writes them) is one
  ``BatchNormalization`` (``_channel_norms``), so every method reads it as torch's exporters' norm.

Constants are read from the graph's weights and from its ``Constant`` nodes.

Types and ranks are read from the graph's inputs, weights and declared value infos, and carried
through the operators listed below; anything else is unknown, and an unknown never fuses.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.fused_nodes import DOMAIN as FUSED
from workers.models.onnx_nodes import attributes, constant_tensors, declared_ranks, reduced_axes

__all__ = ["fuse_dense_layers"]

# Operators whose output has the element type of their first input.
_SAME_TYPE = {
    "Abs", "Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose",
    "Div", "Dropout", "Elu", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "Reciprocal", "RMSNorm", "Standardize", "ResponseScale",
    "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu",
    "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "Pad", "Pow", "PRelu",
    "ReduceMax", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Resize", "Selu", "Sigmoid", "Slice",
    "Softmax", "Softplus", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze",
}  # fmt: skip
# Elementwise operators: the output's rank is the largest of their inputs' (broadcasting; a Concat's
# inputs all have its rank).
_ELEMENTWISE = {
    "Abs", "Add", "Cast", "Clip", "Div", "Dropout", "Elu", "Exp", "Identity", "LeakyRelu", "Log", "Max",
    "Min", "Mul", "Neg", "Pow", "Relu", "Selu", "Sigmoid", "Softmax", "LogSoftmax", "Sqrt", "Sub", "Tanh",
}  # fmt: skip
# Operators whose output has the rank of their first input.
_SAME_RANK = {
    "AveragePool", "BatchNormalization", "Conv", "ConvTranspose", "Erf", "Gelu", "GlobalAveragePool",
    "GlobalMaxPool", "InstanceNormalization", "LayerNormalization", "MaxPool", "Pad", "Reciprocal", "Resize",
    "ResponseScale", "RMSNorm", "Standardize", "Transpose",
}  # fmt: skip
_REDUCTIONS = {"ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum"}
_PER_CHANNEL = {"Add", "Sub", "Mul", "Div"}  # by a constant per channel (_conv_affine, _channel_norms)


def fuse_dense_layers(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s main graph in place (module docstring); returns how many Casts, MatMul+Add
    pairs, convolution biases and two-class sigmoids were rewritten."""
    graph = model.graph
    weights = constant_tensors(graph)
    types, ranks = _known(graph, weights)
    outputs = {o.name for o in graph.output}
    nodes = [_copied(node) for node in graph.node]  # objects of our own: identities stay fixed
    count, dropped = _bypass_casts(nodes, types, outputs), set()
    nodes = [node for node in nodes if node.op_type != "Cast" or node.input]
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "MatMul":
            add = _bias_after(node, readers, weights, outputs)
            matrix = weights.get(node.input[1])
            if add is None or matrix is None or len(matrix.dims) != 2 or ranks.get(node.input[0]) != 2:
                continue
            bias = _as_vector(
                graph, weights, weights[next(name for name in add.input if name != node.output[0])]
            )
            node.op_type = "Gemm"
            node.input.append(bias)
            node.output[0] = add.output[0]
            dropped.add(id(add))
            count += 1
        elif node.op_type == "Conv":
            count += _conv_affine(graph, node, readers, weights, outputs, dropped)
    norms = _channel_norms(graph, nodes, (types, ranks), readers, weights, outputs, dropped)
    count += len(norms) + _two_class_sigmoids(graph, nodes, weights, readers, dropped)
    if count:
        del graph.node[:]
        for node in nodes:
            graph.node.extend(norms.get(id(node), [] if id(node) in dropped else [node]))
    return count


def _bypass_casts(nodes: list[onnx.NodeProto], types: dict[str, int], outputs: set[str]) -> int:
    """A ``Cast`` to the type its input is known to have is the identity (ONNX defines it so): its
    readers read its input instead, and it is emptied for the caller to drop (an Identity where it
    writes a graph output). Keras 3 writes one after most layers; a Cast between a MatMul and its
    bias would keep the pair apart."""
    renamed: dict[str, str] = {}
    count = 0
    for node in nodes:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        if types.get(node.input[0]) != attributes(node).get("to"):
            continue
        count += 1
        if node.output[0] in outputs:
            node.op_type = "Identity"
            del node.attribute[:]
        else:
            renamed[node.output[0]] = node.input[0]
            del node.input[:]
    return count


def _conv_affine(
    graph: onnx.GraphProto,
    conv: onnx.NodeProto,
    readers: dict[str, list[onnx.NodeProto]],
    weights: dict[str, onnx.TensorProto],
    outputs: set[str],
    dropped: set[int],
) -> int:
    """A ``Conv`` whose channels then get constants added, subtracted, multiplied or divided by, one
    per channel, directly or after a ``Transpose`` that moves the channel axis, takes them into its
    weight and bias: the same sums (up to rounding), one affine layer for the planners. Keras 3 on
    torch writes a Conv2D's bias so (NHWC -> Conv -> back to NHWC -> Add(bias)) and an inference
    batch norm as ``Sub(mean)``, ``Mul(scale)``, ``Add(beta)`` after it (what torch's exporters fold
    into the convolution). 1 where rewritten, else 0."""
    kernel = weights.get(conv.input[1]) if len(conv.input) > 1 else None
    bias = weights.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if kernel is None or not kernel.dims or (len(conv.input) > 2 and conv.input[2] and bias is None):
        return 0
    channels, rank = kernel.dims[0], len(kernel.dims)
    value, axis, between = conv.output[0], 1, None
    users = readers.get(value, [])
    if len(users) == 1 and users[0].op_type == "Transpose" and value not in outputs:
        between = users[0]
        perm = list(attributes(between).get("perm", []))
        if sorted(perm) != list(range(rank)):
            return 0
        value, axis = between.output[0], perm.index(1)
        users = readers.get(value, [])
    scale, shift, chain = _channel_chain(value, users, readers, weights, outputs, (rank, axis, channels))
    if not chain:
        return 0
    w = numpy_helper.to_array(kernel).astype(np.float64)
    b = numpy_helper.to_array(bias).astype(np.float64) if bias is not None else np.zeros(channels)
    scaled = (w * scale.reshape(-1, *[1] * (rank - 1))).astype(np.float32)
    conv.input[1] = _new_weight(graph, weights, scaled, f"{kernel.name}/folded")
    offset = _new_weight(
        graph, weights, (b * scale + shift).astype(np.float32), f"{conv.name or kernel.name}/bias"
    )
    if len(conv.input) > 2:
        conv.input[2] = offset
    else:
        conv.input.append(offset)
    (between or conv).output[0] = chain[-1].output[0]
    if between is not None:
        between.input[0] = conv.output[0]
    dropped.update(id(step) for step in chain)
    return 1


def _channel_chain(
    value: str,
    users: list[onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    weights: dict[str, onnx.TensorProto],
    outputs: set[str],
    layout: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray, list[onnx.NodeProto]]:
    """The run of Add, Sub, Mul and Div by constants that vary along the channel axis only, from
    ``value`` read by ``users`` on (``layout``: the activation's rank, channel axis and channel
    count), each the only reader of the one before, as one map ``z * scale + shift``."""
    rank, axis, channels = layout
    scale, shift = np.ones(channels), np.zeros(channels)  # the chain so far: z * scale + shift
    chain: list[onnx.NodeProto] = []
    while value not in outputs and len(users) == 1 and users[0].op_type in _PER_CHANNEL:
        step = users[0]
        if len(step.input) != 2 or step.input[0] != value or step.input[1] == value:
            break  # c - z and c / z are not this layer's affine map
        constant = _per_channel(weights.get(step.input[1]), rank, axis, channels)
        if constant is None or (step.op_type == "Div" and not constant.all()):
            break
        if step.op_type in ("Mul", "Div"):
            factor = constant if step.op_type == "Mul" else 1.0 / constant
            scale, shift = scale * factor, shift * factor
        else:
            shift = shift + constant if step.op_type == "Add" else shift - constant
        chain.append(step)
        value = step.output[0]
        users = readers.get(value, [])
    return scale, shift, chain


def _channel_norms(
    graph: onnx.GraphProto,
    nodes: list[onnx.NodeProto],
    known: tuple[dict[str, int], dict[str, int]],
    readers: dict[str, list[onnx.NodeProto]],
    weights: dict[str, onnx.TensorProto],
    outputs: set[str],
    dropped: set[int],
) -> dict[int, list[onnx.NodeProto]]:
    """Runs of per-channel constant Sub, Mul, Add and Div that scale and shift an activation no Conv
    took in (``_conv_affine``): a batch norm after a pooling or a concatenation (DenseNet's), or a
    Normalization layer, as Keras writes them. Each becomes the ``BatchNormalization`` it is (mean 0,
    variance 1, epsilon 0), between two Transposes where the channels are the last axis, so the
    planners take it as a batch norm, as torch's exporters write one. The new nodes by the id of the
    run's first node (the run is dropped)."""
    types, ranks = known
    inserted: dict[int, list[onnx.NodeProto]] = {}
    for node in nodes:
        value = node.input[0] if node.input else ""
        rank = ranks.get(value)
        if id(node) in dropped or node.op_type not in _PER_CHANNEL or rank is None or rank < 2:
            continue
        if value in weights or types.get(value) != onnx.TensorProto.FLOAT:
            continue
        layout = _channel_layout(node, rank, readers, weights)
        if layout is None:
            continue
        scale, shift, chain = _channel_chain(value, [node], readers, weights, outputs, layout)
        kinds = {step.op_type in ("Mul", "Div") for step in chain}
        if kinds != {True, False}:  # a scaling and a shift; one alone keeps its own rule
            continue
        name = chain[0].name or chain[0].output[0]
        parts = [_new_weight(graph, weights, v.astype(np.float32), f"{name}/norm_{k}") for k, v in (
            ("scale", scale), ("shift", shift), ("mean", np.zeros_like(scale)), ("var", np.ones_like(scale))
        )]  # fmt: skip
        result = chain[-1].output[0]
        if layout[1] == 1:
            inserted[id(node)] = [_norm_node(name, value, parts, result)]
        else:
            first, back = [0, rank - 1, *range(1, rank - 1)], [0, *range(2, rank), 1]
            inserted[id(node)] = [
                onnx.helper.make_node("Transpose", [value], [f"{name}/first"], f"{name}/first", perm=first),
                _norm_node(name, f"{name}/first", parts, f"{name}/normed"),
                onnx.helper.make_node("Transpose", [f"{name}/normed"], [result], f"{name}/last", perm=back),
            ]
        dropped.update(id(step) for step in chain)
    return inserted


def _norm_node(name: str, value: str, parts: list[str], result: str) -> onnx.NodeProto:
    return onnx.helper.make_node("BatchNormalization", [value, *parts], [result], f"{name}/norm", epsilon=0.0)


def _channel_layout(
    node: onnx.NodeProto,
    rank: int,
    readers: dict[str, list[onnx.NodeProto]],
    weights: dict[str, onnx.TensorProto],
) -> tuple[int, int, int] | None:
    """(rank, channel axis, channels) of the run of constant Sub, Mul, Add, Div from ``node`` on, read
    off its first constant of more than one value: the axis 1 or the last one; None for another."""
    step: onnx.NodeProto | None = node
    while step is not None and step.op_type in _PER_CHANNEL and len(step.input) == 2:
        shape = _aligned(weights.get(step.input[1]), rank)
        if shape is None:
            return None
        wide = [axis for axis, size in enumerate(shape) if size != 1]
        if len(wide) > 1 or (wide and wide[0] not in (1, rank - 1)):
            return None
        if wide:
            return rank, wide[0], shape[wide[0]]
        users = readers.get(step.output[0], [])
        step = users[0] if len(users) == 1 else None
    return None


def _per_channel(tensor: onnx.TensorProto | None, rank: int, axis: int, channels: int) -> np.ndarray | None:
    """A constant that varies along ``axis`` only, as the (channels,) vector it broadcasts to; None
    for anything else (a per-element constant, a rank above the activation's)."""
    shape = _aligned(tensor, rank)
    if tensor is None or shape is None:
        return None
    if math.prod(shape) not in (1, channels) or (math.prod(shape) == channels and shape[axis] != channels):
        return None
    values = numpy_helper.to_array(tensor).astype(np.float64).reshape(-1)
    return np.broadcast_to(values, (channels,)).copy()


def _aligned(tensor: onnx.TensorProto | None, rank: int) -> list[int] | None:
    """A constant's dimensions as broadcasting aligns them with an activation of ``rank`` axes; None
    for no constant or one of a higher rank."""
    if tensor is None or len(tensor.dims) > rank:
        return None
    return [1] * (rank - len(tensor.dims)) + list(tensor.dims)


def _copied(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _two_class_sigmoids(
    graph: onnx.GraphProto,
    nodes: list[onnx.NodeProto],
    weights: dict[str, onnx.TensorProto],
    readers: dict[str, list[onnx.NodeProto]],
    dropped: set[int],
) -> int:
    """``Concat(1 - sigmoid(z), sigmoid(z))`` of a one-column ``z = Gemm(A, w, b)`` (skl2onnx's
    binary MLP) as ``sigmoid(Gemm(A, [-w, w], [-b, b]))``: the same probabilities (1 - sigmoid(z) =
    sigmoid(-z)), from a Linear layer and a Sigmoid output, which the planners know, where a
    subtraction from a constant and a concatenation of it are not activations they have rules for."""
    producer = {name: node for node in nodes if id(node) not in dropped for name in node.output}
    count = 0
    for concat in nodes:
        if concat.op_type != "Concat" or len(concat.input) != 2 or id(concat) in dropped:
            continue
        axis = attributes(concat).get("axis")
        complement, chance = (producer.get(name) for name in concat.input)
        sigmoid = chance
        if axis not in (1, -1) or sigmoid is None or sigmoid.op_type != "Sigmoid" or complement is None:
            continue
        gemm = producer.get(sigmoid.input[0])
        one = weights.get(complement.input[0]) if complement.op_type == "Sub" else None
        if (
            gemm is None
            or gemm.op_type != "Gemm"
            or one is None
            or complement.input[1] != sigmoid.output[0]
            or numpy_helper.to_array(one).size != 1
            or float(numpy_helper.to_array(one).reshape(())) != 1.0
            or {id(n) for n in readers.get(sigmoid.output[0], [])} != {id(complement), id(concat)}
            or len(readers.get(complement.output[0], [])) != 1
            or len(readers.get(gemm.output[0], [])) != 1
        ):
            continue
        doubled = _doubled(graph, weights, gemm)
        if doubled is None:
            continue
        gemm.input[1], gemm.input[2] = doubled
        sigmoid.output[0] = concat.output[0]
        dropped.update({id(complement), id(concat)})
        count += 1
    return count


def _doubled(
    graph: onnx.GraphProto, weights: dict[str, onnx.TensorProto], gemm: onnx.NodeProto
) -> tuple[str, str] | None:
    """A one-column Gemm's weight and bias as two columns, negated then as they are."""
    attrs = attributes(gemm)
    if (
        len(gemm.input) != 3
        or attrs.get("transA", 0)
        or attrs.get("alpha", 1.0) != 1.0
        or attrs.get("beta", 1.0) != 1.0
    ):
        return None
    w, b = weights.get(gemm.input[1]), weights.get(gemm.input[2])
    if w is None or b is None:
        return None
    matrix, bias = numpy_helper.to_array(w), numpy_helper.to_array(b).reshape(-1)
    column = matrix.T if attrs.get("transB", 0) else matrix  # (inputs, outputs)
    if column.ndim != 2 or column.shape[1] != 1 or bias.size != 1:
        return None
    doubled = np.concatenate([-column, column], axis=1)  # (inputs, 2), laid out as the Gemm reads it
    both = _new_weight(
        graph, weights, doubled.T.copy() if attrs.get("transB", 0) else doubled, f"{w.name}/two_classes"
    )
    return both, _new_weight(graph, weights, np.concatenate([-bias, bias]), f"{b.name}/two_classes")


def _as_vector(graph: onnx.GraphProto, weights: dict[str, onnx.TensorProto], bias: onnx.TensorProto) -> str:
    """The name of ``bias`` as a vector (skl2onnx stores it (1, width)): one that the torch
    conversion makes a Linear layer's bias."""
    if len(bias.dims) == 1:
        return bias.name
    return _new_weight(graph, weights, numpy_helper.to_array(bias).reshape(-1), f"{bias.name}/vector")


def _new_weight(
    graph: onnx.GraphProto, weights: dict[str, onnx.TensorProto], values: np.ndarray, name: str
) -> str:
    """``values`` added to the graph's weights as ``name``; returns the name."""
    tensor = numpy_helper.from_array(values, name)
    graph.initializer.append(tensor)
    weights[name] = tensor
    return name


def _bias_after(
    matmul: onnx.NodeProto,
    readers: dict[str, list[onnx.NodeProto]],
    weights: dict[str, onnx.TensorProto],
    outputs: set[str],
) -> onnx.NodeProto | None:
    """The Add that is the only reader of ``matmul``'s output and adds a constant vector to it."""
    product = matmul.output[0]
    users = readers.get(product, [])
    if product in outputs or len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    add = users[0]
    other = weights.get(add.input[1] if add.input[0] == product else add.input[0])
    matrix = weights.get(matmul.input[1])
    if other is None or matrix is None or add.input[0] == add.input[1]:
        return None
    width = matrix.dims[-1] if matrix.dims else None
    fits = other.dims[-1:] == [width] and math.prod(other.dims) == width  # (width,) or (1, width)
    return add if len(other.dims) <= 2 and fits else None


def _known(
    graph: onnx.GraphProto, weights: dict[str, onnx.TensorProto]
) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and ranks of the main graph's tensors, where they can be told."""
    types = {
        value.name: value.type.tensor_type.elem_type
        for value in (*graph.input, *graph.value_info, *graph.output)
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type
    }
    ranks = declared_ranks(graph)
    lengths: dict[str, int] = {}  # 1-d integer tensors: how many values (a Reshape's target shape)
    for name, tensor in weights.items():  # a Constant node's tensor is named by the node's output
        types[name], ranks[name] = tensor.data_type, len(tensor.dims)
        if len(tensor.dims) == 1:
            lengths[name] = tensor.dims[0]
    for node in graph.node:  # nodes come in topological order
        # (the fusions' Gelu, RMSNorm, Standardize and ResponseScale, run before, keep their input's type and rank too)
        if not node.input or node.domain not in ("", "ai.onnx", FUSED) or len(node.output) != 1:
            continue
        out, first = node.output[0], node.input[0]
        if node.op_type == "Cast":
            types.setdefault(out, attributes(node).get("to", 0))
        elif node.op_type in _SAME_TYPE and first in types:
            types.setdefault(out, types[first])
        known = [ranks.get(name) for name in node.input if name]
        if (node.op_type in _ELEMENTWISE or node.op_type == "Concat") and known and None not in known:
            ranks.setdefault(out, max(r for r in known if r is not None))
        elif node.op_type in _SAME_RANK and first in ranks:
            ranks.setdefault(out, ranks[first])
        elif node.op_type == "Flatten":
            ranks.setdefault(out, 2)
        elif node.op_type in _REDUCTIONS and first in ranks:
            reduced = _reduced_rank(node, ranks[first], weights)
            if reduced is not None:
                ranks.setdefault(out, reduced)
        elif node.op_type == "Gemm" or (node.op_type == "MatMul" and known == [2, 2]):
            ranks.setdefault(out, 2)
        _shape_arithmetic(node, weights, ranks, lengths)
    return types, ranks


def _shape_arithmetic(
    node: onnx.NodeProto, weights: dict[str, onnx.TensorProto], ranks: dict[str, int], lengths: dict[str, int]
) -> None:
    """Ranks through a Reshape whose target shape is computed at run time, as Keras' Flatten writes it:
    ``Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])``, a vector of known length."""
    out, first = node.output[0], node.input[0]
    if node.op_type == "Shape" and first in ranks:
        lengths[out] = ranks[first]
    elif node.op_type == "Gather" and first in lengths and ranks.get(node.input[1]) == 0:
        ranks[out] = 0  # one value of a shape
    elif node.op_type == "Unsqueeze" and ranks.get(first) == 0:
        axes = weights.get(node.input[1]) if len(node.input) > 1 else None
        count = len(attributes(node).get("axes", [])) if axes is None else math.prod(axes.dims)
        if count == 1:
            lengths[out] = 1
    elif (
        node.op_type == "Concat"
        and attributes(node).get("axis") == 0
        and all(i in lengths for i in node.input)
    ):
        lengths[out] = sum(lengths[i] for i in node.input)
    elif node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in lengths:
        ranks.setdefault(out, lengths[node.input[1]])


def _reduced_rank(node: onnx.NodeProto, rank: int, weights: dict[str, onnx.TensorProto]) -> int | None:
    """A reduction's output rank: its input's with ``keepdims``, else less the axes it reduces (an
    attribute, or from opset 18 a constant second input); None where they cannot be told."""
    if attributes(node).get("keepdims", 1):
        return rank
    axes = reduced_axes(node, weights)
    if axes is None:
        return None
    return rank - len(set(axes)) if axes else 0  # no axes: all of them
