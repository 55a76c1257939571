"""Checks of untrusted ONNX bytes that need only the ``onnx`` package (no torch, no onnxruntime).

The service validates uploads with these in its own process; workers run the same checks again
before they build a session.
"""

from __future__ import annotations

import onnx

from xaudit.contract.errors import InvalidModel


def detect_format(data: bytes) -> str:
    """``torchscript`` for zip archives, ``onnx`` otherwise (parsing decides whether it really is)."""
    return "torchscript" if data[:2] == b"PK" else "onnx"


__all__ = ["detect_format", "external_tensors", "graphs_within", "parse_onnx"]

# Operator domains a model may use: ONNX's own, and onnxruntime's contrib operators (com.microsoft),
# which are compiled into onnxruntime itself (its transformer optimizer writes them: Attention,
# SkipLayerNormalization, BiasGelu). Any other domain needs a custom-op library: refused.
_ALLOWED_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}


def graphs_within(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """The graph and every subgraph (If / Loop / Scan bodies), where refused features can hide too."""
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found.extend(graphs_within(sub))
    return found


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of ``model`` (subgraphs included) whose bytes live in an external file."""
    tensors = []
    for graph in graphs_within(model.graph):
        tensors.extend(graph.initializer)
        tensors.extend(s.values for s in graph.sparse_initializer)
        for node in graph.node:
            tensors.extend(attr.t for attr in node.attribute if attr.HasField("t"))
            tensors.extend(t for attr in node.attribute for t in attr.tensors)
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data) > 0]


def parse_onnx(data: bytes) -> onnx.ModelProto:
    """Parse and check untrusted ONNX bytes; refuse external data and custom-op domains."""
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:
        raise InvalidModel(f"not a readable ONNX model ({type(exc).__name__})") from None
    if not model.graph.node:
        raise InvalidModel("not a readable ONNX model (empty graph)")
    external = external_tensors(model)
    if external:
        files = sorted({e.value for t in external for e in t.external_data if e.key == "location"})
        raise InvalidModel(
            f"ONNX model refers to external data files ({', '.join(files[:3])}) and the service reads no files: "
            "give the .onnx path to the xaudit CLI or client, which read the side files from the model's "
            "directory and send one self-contained model (or save it with onnx.save(model, path, "
            "save_as_external_data=False))"
        )
    custom = sorted(
        {n.domain for g in graphs_within(model.graph) for n in g.node if n.domain not in _ALLOWED_DOMAINS}
    )
    if custom:
        raise InvalidModel(
            f"ONNX model uses custom operator domains {custom}; they are refused (allowed: ONNX's own and "
            "onnxruntime's contrib operators, com.microsoft)"
        )
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise InvalidModel(f"ONNX checker rejected the model: {str(exc).splitlines()[0][:200]}") from None
    return model
