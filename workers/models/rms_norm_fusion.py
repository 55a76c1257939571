"""RMS normalisation as one operator in the torch graph the methods run on.

Llama, Mistral, Qwen, Gemma and T5 normalise each token by its root mean square,
``x / sqrt(mean(x^2) + eps)`` over the last axis, then scale it (no centring, no shift: RMSNorm).
ONNX has no operator for it before opset 23, so both of torch's exporters write it out:
``Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2)), eps))))`` (dynamo) or with ``Div(1, Sqrt(...))``
(legacy), the weight a separate ``Mul``. Converted one by one, the rule methods stopped at the
``Pow`` ("no LRP rule"). Fused, the graph calls one ``RMSNorm`` module
(workers.models.onnx_converters), whose scale LRP holds constant as it holds a layer norm's
(docs/science.md 5.8), and whose gradient is the same function's. The game runs the original model
on onnxruntime; only the methods' graph is rewritten.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.fused_nodes import DOMAIN, PatternReader, write_fused
from workers.models.onnx_nodes import attributes, declared_ranks, reduced_axes

__all__ = ["fuse_rms_norm"]


def fuse_rms_norm(model: onnx.ModelProto) -> int:
    """Replace every ``x / sqrt(mean(x^2, last axis) + eps)`` that ``model`` (constants lifted to
    initializers) writes out by one ``xaudit.RMSNorm`` node; returns how many were fused."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version < 13:  # the fused node's function body is written in opset 13 or later
        return 0
    graph = model.graph
    reader = PatternReader(graph)
    only_use, scalar = reader.only_use, reader.scalar
    ranks = declared_ranks(graph)

    def over_last_axis(mean: onnx.NodeProto, x: str) -> bool:
        axes = reduced_axes(mean, reader.initializers)
        rank = ranks.get(x)
        last = (
            axes is not None
            and len(axes) == 1
            and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))
        )
        return last and attributes(mean).get("keepdims", 1) == 1

    def matched(power: onnx.NodeProto) -> tuple[str, float, list[onnx.NodeProto]] | None:
        """x, eps and the nodes of ``x / sqrt(mean(x^2) + eps)`` from ``power`` on, else None."""
        x = power.input[0]
        if scalar(power.input[1]) != 2.0:
            return None
        mean = only_use(power.output[0], "ReduceMean")
        if mean is None or not over_last_axis(mean, x):
            return None
        add = only_use(mean.output[0], "Add")
        if add is None:
            return None
        shift = [name for name in add.input if name != mean.output[0]]
        eps = scalar(shift[0]) if len(shift) == 1 else None
        sqrt = only_use(add.output[0], "Sqrt")
        if eps is None or eps < 0 or sqrt is None:
            return None
        root = sqrt.output[0]
        step = only_use(root, "Reciprocal", "Div")
        if step is None:
            return None
        if step.op_type == "Div" and list(step.input) == [x, root]:
            return x, eps, [power, mean, add, sqrt, step]  # x / sqrt(...)
        if step.op_type == "Div" and (step.input[1] != root or scalar(step.input[0]) != 1.0):
            return None
        scale = only_use(step.output[0], "Mul")  # x * (1 / sqrt(...))
        if scale is None or sorted(scale.input) != sorted([x, step.output[0]]):
            return None
        return x, eps, [power, mean, add, sqrt, step, scale]

    fused: dict[int, onnx.NodeProto] = {}  # id of a pattern's last node -> the node replacing it
    dropped: set[int] = set()
    for node in graph.node:
        found = matched(node) if node.op_type == "Pow" and not node.domain and len(node.input) == 2 else None
        if found is None:
            continue
        x, eps, (*rest, last) = found
        name = last.name or last.output[0]
        fused[id(last)] = onnx.helper.make_node(
            "RMSNorm", [x], list(last.output), name=name, domain=DOMAIN, epsilon=eps
        )
        dropped.update(id(n) for n in rest)
    return write_fused(model, fused, dropped, _rms_norm_function(version))


def _rms_norm_function(version: int) -> onnx.FunctionProto:
    """xaudit.RMSNorm's body, in the model's own opset: its ``epsilon`` an attribute."""
    make = onnx.helper.make_node
    eps = make("Constant", [], ["eps"])
    eps.attribute.append(
        onnx.helper.make_attribute_ref("value_float", onnx.AttributeProto.FLOAT, ref_attr_name="epsilon")
    )
    if version >= 18:  # ReduceMean's axes an input from opset 18
        axes = [
            make("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([-1], np.int64), "axes"))
        ]
        mean = make("ReduceMean", ["square", "axes"], ["mean"], keepdims=1)
    else:
        axes, mean = [], make("ReduceMean", ["square"], ["mean"], axes=[-1], keepdims=1)
    body = [
        eps,
        *axes,
        make("Mul", ["x", "x"], ["square"]),
        mean,
        make("Add", ["mean", "eps"], ["shifted"]),
        make("Sqrt", ["shifted"], ["rms"]),
        make("Div", ["x", "rms"], ["y"]),
    ]
    return onnx.helper.make_function(
        DOMAIN, "RMSNorm", ["x"], ["y"], body, [onnx.helper.make_opsetid("", version)], attributes=["epsilon"]
    )
