"""What the graph rewrites before the torch conversion read of ONNX nodes and tensors, how they put
new nodes in place of old ones, and how they drop what nothing reads any more, written once
(workers/models/ort_unfusion.py, ml_ops.py, attention_ops.py, einsum_ops.py, experimental_ops.py,
dense_layers.py, pinned_shapes.py, pooled_rows.py, row_indices.py, fused_nodes.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "attributes",
    "constant_node",
    "constant_tensors",
    "declared_ranks",
    "default_opset",
    "drop_unread",
    "fold_to_initializers",
    "names_read",
    "reduced_axes",
    "rewrite_nodes",
]


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes by name, as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def constant_node(name: str, values: Any, dtype: Any = np.int64) -> onnx.NodeProto:
    """A Constant node ``name`` (its output and its own name) holding ``values`` (a list, or a number
    for a scalar) in ``dtype``."""
    return helper.make_node(
        "Constant", [], [name], name=name, value=numpy_helper.from_array(np.array(values, dtype), name)
    )


def default_opset(model: onnx.ModelProto, missing: int = 0) -> int:
    """The version of the default (``ai.onnx``) domain ``model`` imports; ``missing`` where none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), missing)


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


def fold_to_initializers(
    graph: onnx.GraphProto,
    nodes: Sequence[onnx.NodeProto],
    outputs: Sequence[str],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> None:
    """Evaluate ``nodes`` (the graph's own, in graph order; they read only the graph's constant
    tensors and each other) with onnx's reference evaluator, write ``outputs`` as initializers and remove the nodes
    whose every output is one of them (constant_batch_norms.py's weight standardization,
    fake_quantization.py's integer weights); what else they read stays for others to read."""
    from onnx.reference import ReferenceEvaluator  # only models with such constants pay its import

    produced = {name for node in nodes for name in node.output}
    reads = {name for node in nodes for name in node.input} - produced
    known = constant_tensors(graph)
    values_out = [helper.make_value_info(name, onnx.TypeProto()) for name in outputs]
    sub = helper.make_graph(list(nodes), "constants", [], values_out)
    for name in reads & known.keys():  # a Constant node's tensor carries no name of its own
        tensor = onnx.TensorProto()
        tensor.CopyFrom(known[name])
        tensor.name = name
        sub.initializer.append(tensor)
    values = ReferenceEvaluator(helper.make_model(sub, opset_imports=list(opsets))).run(None, {})
    for name, value in zip(outputs, values, strict=True):
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    written = set(outputs)
    done = {id(node) for node in nodes if all(name in written for name in node.output if name)}
    kept = [node for node in graph.node if id(node) not in done]
    del graph.node[:]
    graph.node.extend(kept)


def names_read(graph: onnx.GraphProto) -> set[str]:
    """The value names ``graph``'s nodes and outputs read (its subgraphs' reads not among them)."""
    return {name for node in graph.node for name in node.input} | {o.name for o in graph.output}


def rewrite_nodes(
    graph: onnx.GraphProto, rewrite: Callable[[onnx.NodeProto], list[onnx.NodeProto] | None]
) -> int:
    """Replace, in place and in order, each node of ``graph`` that ``rewrite`` gives nodes for (None:
    the node stays) by those nodes; returns how many were replaced."""
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        written = rewrite(node)
        nodes.extend([node] if written is None else written)
        count += written is not None
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def drop_unread(graph: onnx.GraphProto) -> None:
    """Drop the nodes and initializers nothing reads any more (a subgraph's reads count), so that no
    session warns of them and the torch graph does not compute them."""
    while True:
        read = names_read(graph)
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
