"""Negative dimensions in an ONNX model's declared shapes, read as unknown.

``onnx.helper.make_tensor_value_info(name, type, [-1, 3])`` writes -1 as a dimension's value, where
the format has no value for an unknown dimension (a name, or nothing). onnxruntime runs such models;
onnx's shape inference, which onnx2torch and the token models' embedding cut run, clamps a Slice to
[0, -1] on them and its C++ assertion aborts the process: the CLI died with SIGABRT, the service's
sandboxed model process likewise (tests/unit/models/test_onnx_support.py)."""

from __future__ import annotations

import onnx

from xaudit.contract.onnx_checks import graphs_within

__all__ = ["negative_dims_unknown"]


def negative_dims_unknown(model: onnx.ModelProto) -> int:
    """Clear every negative dimension value of ``model``'s inputs, outputs and value infos, subgraphs
    included, in place; the number cleared."""
    cleared = 0
    for graph in graphs_within(model.graph):
        for info in (*graph.input, *graph.output, *graph.value_info):
            cleared += _clear(info.type)
    return cleared


def _clear(kind: onnx.TypeProto) -> int:
    field = kind.WhichOneof("value")
    if field == "tensor_type" or field == "sparse_tensor_type":
        dims = getattr(kind, field).shape.dim
        negative = [d for d in dims if d.WhichOneof("value") == "dim_value" and d.dim_value < 0]
        for dim in negative:
            dim.ClearField("dim_value")
        return len(negative)
    if field in ("sequence_type", "optional_type"):
        return _clear(getattr(kind, field).elem_type)
    if field == "map_type":
        return _clear(kind.map_type.value_type)
    return 0
