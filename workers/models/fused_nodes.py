"""The nodes the fusions write in place of an operator an exporter wrote out in several
(workers/models/gelu_fusion.py, rms_norm_fusion.py): one operator domain of xaudit's, converted by
workers.models.onnx_converters, each operator with an ONNX function body so that onnx's shape
inference still runs through it (onnx2torch sizes some modules from it; without the body the shapes
after the first fused node were lost, and swin_t's pooling read a wrong one)."""

from __future__ import annotations

import onnx

__all__ = ["DOMAIN", "write_fused"]

DOMAIN = "xaudit"


def write_fused(
    model: onnx.ModelProto,
    fused: dict[int, onnx.NodeProto],
    dropped: set[int],
    function: onnx.FunctionProto,
) -> int:
    """Rewrite ``model``'s main graph: each node whose id is a key of ``fused`` replaced by its
    value, the nodes in ``dropped`` removed with the constants only they read; the domain and
    ``function`` declared once. Returns how many nodes were fused."""
    if not fused:
        return 0
    graph = model.graph
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]  # the patterns' scalars go with them
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    if not any(f.domain == DOMAIN and f.name == function.name for f in model.functions):
        model.functions.append(function)
    return len(fused)
