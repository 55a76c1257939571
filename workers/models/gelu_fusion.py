"""GELU as one operator in the torch graph the methods run on.

torch.onnx's legacy exporter (and transformers' BERT through it) writes the exact GELU as five
operators: ``Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)``. Converted one by one they cost a
BERT's gradient pass 13-20% of its time (README, text scale): each keeps its own tensors for the
backward, and erf's backward recomputes ``exp(-x^2)``. Fused, the graph calls ``gelu`` once (the
module of ONNX's own Gelu operator, workers.models.onnx_converters), which LRP holds as it holds the
five (docs/science.md 5.8) and whose gradient is the same function's. The game runs the original
model on onnxruntime; only the methods' graph is rewritten.
"""

from __future__ import annotations

import math

import onnx

from workers.models.fused_nodes import DOMAIN, PatternReader, write_fused
from workers.models.onnx_nodes import default_opset

__all__ = ["fuse_gelu"]


def fuse_gelu(model: onnx.ModelProto) -> int:
    """Replace every exact GELU that ``model`` (constants lifted to initializers) writes out as
    Div, Erf, Add, Mul, Mul by one ``xaudit.Gelu`` node; returns how many were fused."""
    version = default_opset(model)
    if version < 13:  # the fused node's function body is written in opset 13 or later
        return 0
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    reader = PatternReader(graph)
    only_use = reader.only_use

    def other(node: onnx.NodeProto, name: str) -> str | None:
        rest = [i for i in node.input if i != name]
        return rest[0] if len(node.input) == 2 and len(rest) == 1 else None

    def scalar(name: str | None, value: float) -> bool:
        found = reader.scalar(name)
        return found is not None and math.isclose(found, value, rel_tol=1e-5)

    def matched(erf: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto]] | None:
        """x and the five nodes of ``x * (erf(x / sqrt 2) + 1) * 0.5`` around ``erf``, else None."""
        div = producer.get(erf.input[0])
        if div is None or div.op_type != "Div" or not scalar(div.input[1], math.sqrt(2.0)):
            return None
        x = div.input[0]
        add = only_use(erf.output[0], "Add")
        if (
            only_use(div.output[0], "Erf") is None
            or add is None
            or not scalar(other(add, erf.output[0]), 1.0)
        ):
            return None
        gate = only_use(add.output[0], "Mul")
        if gate is None or other(gate, add.output[0]) != x:
            return None
        half = only_use(gate.output[0], "Mul")
        if half is None or not scalar(other(half, gate.output[0]), 0.5):
            return None
        return x, [div, erf, add, gate, half]

    fused: dict[int, onnx.NodeProto] = {}  # id of a pattern's last node -> the node replacing it
    dropped: set[int] = set()
    for node in graph.node:
        found = matched(node) if node.op_type == "Erf" and not node.domain else None
        if found is None:
            continue
        x, (*rest, half) = found
        name = half.name or half.output[0]
        fused[id(half)] = onnx.helper.make_node("Gelu", [x], list(half.output), name=name, domain=DOMAIN)
        dropped.update(id(n) for n in rest)
    return write_fused(model, fused, dropped, _gelu_function(version))


def _gelu_function(version: int) -> onnx.FunctionProto:
    """xaudit.Gelu's body, in the model's own opset."""
    make = onnx.helper.make_node
    body = [
        make("Constant", [], ["root2"], value_float=math.sqrt(2.0)),
        make("Div", ["x", "root2"], ["scaled"]),
        make("Erf", ["scaled"], ["erf"]),
        make("Constant", [], ["one"], value_float=1.0),
        make("Add", ["erf", "one"], ["gate"]),
        make("Mul", ["x", "gate"], ["gated"]),
        make("Constant", [], ["half"], value_float=0.5),
        make("Mul", ["gated", "half"], ["y"]),
    ]
    return onnx.helper.make_function(
        DOMAIN, "Gelu", ["x"], ["y"], body, [onnx.helper.make_opsetid("", version)]
    )
