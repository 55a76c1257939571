"""Batch norms in training mode over constants, computed once (weight standardization).

NF-ResNets and NFNets (timm's ScaledStdConv2d) and BiT's StdConv standardise each convolution's
weight in their forward pass with ``F.batch_norm(weight, training=True)``. The legacy exporter
writes a BatchNormalization in training mode (with its mean and variance outputs) over the weight,
and onnx2torch refuses that operator ("BatchNorm operation with mean/var output is not
implemented"), so such a model converted for no method at all. Its inputs are constants: the
standardised weight is a constant too. It is computed here with onnx's reference evaluator, with
every constant node it reads and every one after it that reads only constants (the reshape and the
gain onnx2torch's Conv needs folded into its weight), and written as initializers; the convolution
then reads a plain weight. Only such batch norms and what follows them are folded: every other
constant computation stays as written.
"""

from __future__ import annotations

import onnx

from workers.models.onnx_nodes import attributes, drop_unread, fold_to_initializers

__all__ = ["fold_constant_batch_norms"]


def fold_constant_batch_norms(model: onnx.ModelProto) -> int:
    """Replace each training-mode BatchNormalization of ``model``'s main graph (constants lifted to
    initializers) whose inputs are all constants, and what reads only constants after it, by
    initializers of their outputs; returns how many batch norms were folded."""
    graph = model.graph
    norms = [n for n in graph.node if _in_training_mode(n)]
    if not norms:  # every other model: nothing to index
        return 0
    constants = {t.name for t in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    order = {id(node): i for i, node in enumerate(graph.node)}
    nodes: dict[int, onnx.NodeProto] = {}  # what is computed ahead, in one evaluation
    outputs: list[str] = []
    derived: set[str] = set()  # the folded batch norms' outputs, and what is computed from them alone
    for norm in norms:
        ancestry = _constant_ancestry(norm, order, producers, constants)
        if ancestry is None:
            continue
        nodes.update((id(node), node) for node in ancestry)
        outputs += [name for name in norm.output if name]
        derived.update(norm.output)
    if not derived:
        return 0
    constants |= derived
    for node in graph.node:  # in graph order: what reads only constants, one of them derived
        inputs = [name for name in node.input if name]
        if id(node) in nodes or node.domain or not any(n in derived for n in inputs):
            continue
        if all(n in constants for n in inputs):
            nodes[id(node)] = node
            outputs += list(node.output)
            constants.update(node.output)
            derived.update(node.output)
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    fold_to_initializers(graph, sorted(nodes.values(), key=lambda n: order[id(n)]), outputs, opsets)
    drop_unread(graph)  # the constant nodes that only the batch norms read
    return sum(1 for norm in norms if id(norm) in nodes)


def _in_training_mode(node: onnx.NodeProto) -> bool:
    if node.op_type != "BatchNormalization" or node.domain:
        return False
    return attributes(node).get("training_mode", 0) == 1 or len(node.output) > 1


def _constant_ancestry(
    node: onnx.NodeProto, order: dict[int, int], producers: dict[str, onnx.NodeProto], constants: set[str]
) -> list[onnx.NodeProto] | None:
    """``node`` and every node it reads through, in graph order, when all of them read only
    constants in the end (no graph input, no subgraph, the default domain); else None."""
    found: dict[int, onnx.NodeProto] = {}
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in found:
            continue
        subgraph = any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in current.attribute
        )
        if current.domain or subgraph:
            return None
        found[id(current)] = current
        for name in current.input:
            if not name or name in constants:
                continue
            producer = producers.get(name)
            if producer is None:  # a graph input
                return None
            stack.append(producer)
    return sorted(found.values(), key=lambda n: order[id(n)])
