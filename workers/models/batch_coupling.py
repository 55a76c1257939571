"""Operators that make one row's output depend on the rows evaluated with it.

onnxruntime's dynamic quantization (``quantize_dynamic``, common for CPU serving of transformers)
writes ``DynamicQuantizeLinear``, which quantizes a tensor with the minimum and maximum of all of
it, batch included; a batch norm exported in training mode normalises with the batch's statistics.
Evaluated many rows per call, as the game evaluates sub-inputs, a row's output then moves with its
neighbours: the game's own check caught it (v(empty) apart from a plain evaluation by 4e-4 on a
quantized CNN) and every verdict was inconclusive. Such a model is evaluated one row per call, as a
service answering one request at a time runs it, and the report says why (docs/science.md, "Checks
that can fail": the game needs v(T) to depend on x_T alone)."""

from __future__ import annotations

import onnx

from xaudit.contract.onnx_checks import graphs_within

__all__ = ["rows_coupled_by"]

_STANDARD = ("", "ai.onnx")
# onnxruntime's contrib operators that quantize their float input with its own range, as
# DynamicQuantizeLinear does (its quantizer writes them for MatMul and LSTM).
_CONTRIB_DYNAMIC = ("DynamicQuantizeMatMul", "DynamicQuantizeLSTM")


def rows_coupled_by(model: onnx.ModelProto) -> str | None:
    """The first operator of ``model`` (subgraphs included) that couples the rows of a batch, and why;
    None where no operator xaudit knows of does."""
    for graph in graphs_within(model.graph):
        for node in graph.node:
            name = node.name or node.output[0]
            if node.domain == "com.microsoft" and node.op_type in _CONTRIB_DYNAMIC:
                return f"{node.op_type} (node '{name}') quantizes its input with the range of the whole batch"
            if node.domain not in _STANDARD:
                continue
            if node.op_type == "DynamicQuantizeLinear":
                return (
                    f"DynamicQuantizeLinear (node '{name}') quantizes with the minimum and maximum of "
                    "the whole batch"
                )
            if node.op_type == "BatchNormalization" and _training(node):
                return f"BatchNormalization (node '{name}') normalises with the batch's statistics (training mode)"
    return None


def _training(node: onnx.NodeProto) -> bool:
    return any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
