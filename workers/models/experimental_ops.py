"""ONNX's former experimental ``ImageScaler`` written as ONNX's own operators, for the methods' graph.

Old converters (CNTK's and Caffe2's, the ONNX Model Zoo's opset 7 and 8 models such as
emotion_ferplus and tiny-yolov2) put the input's normalisation in an ``ImageScaler``: y = scale * x
+ bias[c] over an (N, C, H, W) image. onnxruntime still runs it, but onnx no longer defines it, so
the torch conversion had no converter and onnx's version converter stopped at it: every gradient
and rule method was refused. It is written as a Mul by the scale and an Add of the per-channel bias
(tests/unit/models/test_old_opsets.py); the game runs the model as given.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from workers.models.onnx_nodes import attributes, constant_node, rewrite_nodes

__all__ = ["image_scalers_as_onnx"]


def image_scalers_as_onnx(model: onnx.ModelProto) -> int:
    """Rewrite each ``ImageScaler`` of ``model``'s main graph in place; returns how many."""
    return rewrite_nodes(model.graph, _written)


def _written(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    if node.op_type != "ImageScaler" or node.domain not in ("", "ai.onnx"):
        return None
    options = attributes(node)
    bias = np.asarray(options.get("bias", [0.0]), np.float32).reshape(1, -1, 1, 1)
    scale, shift, scaled = (f"{node.output[0]}__xaudit_{part}" for part in ("scale", "bias", "scaled"))
    # Constant nodes, not initializers: a model before IR 4 must list every initializer as an input
    return [
        constant_node(scale, options.get("scale", 1.0), np.float32),
        constant_node(shift, bias, np.float32),
        helper.make_node("Mul", [node.input[0], scale], [scaled], name=f"{node.name}_scale"),
        helper.make_node("Add", [scaled, shift], [node.output[0]], name=f"{node.name}_bias"),
    ]
