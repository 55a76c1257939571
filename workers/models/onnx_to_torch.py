"""ONNX -> differentiable torch graph, through onnx2torch's public converter registry.

onnx2torch stops at opset 18 for several operators. Where a newer operator version only widens the
accepted tensor types (float8, int4, bfloat16...) or adds an attribute we check for, we register
the older converter for the newer version. That is sound for the float32 graphs audited here; any
other gap surfaces as a clear "unsupported operator" error naming the operator.
"""

from __future__ import annotations

import logging

import onnx
import torch
from onnx import defs, numpy_helper

from workers.errors import InvalidModel
from workers.light_imports import onnx2torch as _light_onnx2torch

_light_onnx2torch()  # before any onnx2torch import: keeps torchvision out
from onnx2torch import convert  # noqa: E402
from onnx2torch.node_converters.registry import (  # noqa: E402
    _CONVERTER_REGISTRY,
    OperationDescription,
    add_converter,
)

__all__ = ["onnx_to_torch"]

logger = logging.getLogger(__name__)

# Operators whose versions 19-21 differ from the last onnx2torch-supported one only in types.
_TYPE_ONLY_UPDATES: dict[str, int] = {
    "Flatten": 13,
    "Identity": 16,
    "Shape": 15,
    "Unsqueeze": 13,
    "Transpose": 13,
    "Constant": 13,
    "ConstantOfShape": 9,
    "Cast": 13,  # 19 adds `saturate`, which only affects float8 targets.
    "Reshape": 14,  # 19/21 add types; `allowzero` is normalised away in _normalise_graph.
}


def _register_type_only_updates() -> None:
    for op, old in _TYPE_ONLY_UPDATES.items():
        converter = _CONVERTER_REGISTRY[OperationDescription(domain="", operation_type=op, version=old)]
        for opset in (19, 20, 21):
            since = defs.get_schema(op, opset).since_version
            if OperationDescription(domain="", operation_type=op, version=since) not in _CONVERTER_REGISTRY:
                add_converter(operation_type=op, version=since)(converter)


_register_type_only_updates()


def _normalise_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop ``allowzero=1`` from Reshape nodes whose constant shape has no zero (same semantics)."""
    constants = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    for node in model.graph.node:
        if node.op_type != "Reshape":
            continue
        for attr in list(node.attribute):
            if attr.name == "allowzero" and attr.i == 1:
                shape = constants.get(node.input[1])
                if shape is None or (numpy_helper.to_array(shape) == 0).any():
                    raise InvalidModel(
                        f"Reshape node '{node.name}' uses allowzero=1 with a zero or non-constant shape; not supported"
                    )
                node.attribute.remove(attr)
    return model


def onnx_to_torch(model: onnx.ModelProto) -> torch.nn.Module:
    """A torch.fx GraphModule equivalent to ``model``, in eval mode, float32."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        module = convert(_normalise_graph(copy))
    except NotImplementedError as exc:
        raise InvalidModel(f"cannot build a differentiable graph from this ONNX model: {exc}") from None
    return module.eval().float()
