"""The nodes the fusions write in place of an operator an exporter wrote out in several
(workers/models/gelu_fusion.py, norm_fusion.py): one operator domain of xaudit's, converted by
workers.models.onnx_converters, each operator with an ONNX function body so that onnx's shape
inference still runs through it (onnx2torch sizes some modules from it; without the body the shapes
after the first fused node were lost, and swin_t's pooling read a wrong one)."""

from __future__ import annotations

import math

import onnx
from onnx import numpy_helper

from workers.models.onnx_nodes import drop_unread

__all__ = ["DOMAIN", "PatternReader", "write_fused"]

DOMAIN = "xaudit"


class PatternReader:
    """What a fusion's matcher reads of the main graph (constants lifted to initializers): the one
    node that reads a tensor, and the value of a constant scalar."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.initializers = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.uses: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.uses.setdefault(name, []).append(node)

    def only_use(self, name: str, *ops: str) -> onnx.NodeProto | None:
        """The node of one of the default domain's ``ops`` that alone reads ``name`` (not a graph
        output), else None."""
        users = self.uses.get(name, [])
        if name in self.outputs or len(users) != 1 or users[0].op_type not in ops or users[0].domain:
            return None
        return users[0]

    def scalar(self, name: str | None) -> float | None:
        """The value of the constant ``name`` where it holds one element, else None."""
        tensor = self.initializers.get(name or "")
        if tensor is None or math.prod(tensor.dims) != 1:
            return None
        return float(numpy_helper.to_array(tensor).reshape(()))


def write_fused(
    model: onnx.ModelProto,
    fused: dict[int, onnx.NodeProto],
    dropped: set[int],
    *functions: onnx.FunctionProto,
) -> int:
    """Rewrite ``model``'s main graph: each node whose id is a key of ``fused`` replaced by its
    value, the nodes in ``dropped`` removed with what only they read; the domain and each of
    ``functions`` declared once. Returns how many nodes were fused."""
    if not fused:
        return 0
    graph = model.graph
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unread(graph)  # the patterns' scalars go with them
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    for function in functions:
        if not any(f.domain == DOMAIN and f.name == function.name for f in model.functions):
            model.functions.append(function)
    return len(fused)
