"""ONNX's LSTM operator written out step by step, for the methods' graph (docs/science.md 5.8).

torch's exporters write ``nn.LSTM`` as one ``LSTM`` node, which the conversion runs as ``nn.LSTM``
(workers.models.onnx_converters.Recurrent): one opaque module, so LRP, alpha-beta and Deep Taylor
refused it by name. Written out as its equations, with ONNX's gate order i, o, f, c,

    z = x_t W^T + h W_r^T + b,  c = sigmoid(z_f) c + sigmoid(z_i) tanh(z_c),  h = sigmoid(z_o) tanh(c),

it is Gemms, Slices, Sigmoids, Tanhs, Muls and Adds, each of which the LRP pass has a rule for: the
sigmoid gates are held constant (Arras et al. 2017's rule for LSTMs, as Keras' own export of its LSTM
already gets), tanh passes relevance on, and the sum of the input's and the state's products splits
it by the proportional rule. The values and gradients are the operator's; the gradient methods run
on the same graph.

Written out only where every step can be: the time axis known from the shapes and at most
:data:`MAX_STEPS` long (a longer sequence would make a graph of thousands of nodes), the default
activations, no clip, peepholes, ``sequence_lens`` or ``input_forget``, layout 0, constant weights.
Any other LSTM, and GRU, stays the one module (the rule methods refuse it by name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workers.models.onnx_nodes import attributes
from workers.models.onnx_shapes import infer_shapes_light

__all__ = ["MAX_STEPS", "unroll_lstms"]

MAX_STEPS = 256  # time steps times directions
_ZERO_SOURCES = {"ConstantOfShape", "Expand", "Slice", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Cast"}


def unroll_lstms(model: onnx.ModelProto) -> int:
    """Write every LSTM node of ``model``'s main graph that can be (module docstring) out as its
    equations, in place; returns how many were."""
    graph = model.graph
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version < 13 or not any(node.op_type == "LSTM" for node in graph.node):
        return 0  # (Slice and Unsqueeze take their axes as inputs from opset 13)
    infer_shapes_light(model, data_prop=True)  # (the time axis through Reshapes of computed shapes)
    lengths = _time_lengths(graph)
    weights = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        steps = _steps(node, lengths, weights)
        if steps is None:
            nodes.append(node)
            continue
        nodes.extend(_written_out(node, steps, weights, producers, graph))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.value_info[:]  # the conversion infers the shapes again
    return count


def _time_lengths(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> the length of its first axis, where shape inference found it fixed."""
    found = {}
    for info in (*graph.input, *graph.value_info):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
        if dims and dims[0].HasField("dim_value"):
            found[info.name] = dims[0].dim_value
    return found


def _steps(node: onnx.NodeProto, lengths: dict[str, int], weights: dict[str, onnx.TensorProto]) -> int | None:
    """The number of time steps of an LSTM node that can be written out, else None."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
        return None
    attrs = attributes(node)
    inputs = [*node.input, *[""] * 8]
    plain = (
        attrs.get("layout", 0) == 0
        and "clip" not in attrs
        and "activations" not in attrs
        and attrs.get("input_forget", 0) == 0
        and not inputs[4]  # sequence_lens
        and not inputs[7]  # peepholes
        and all(inputs[k] in weights for k in (1, 2))
        and (not inputs[3] or inputs[3] in weights)
    )
    steps = lengths.get(node.input[0])
    directions = 2 if attrs.get("direction", b"forward") in ("bidirectional", b"bidirectional") else 1
    if not plain or not steps or steps * directions > MAX_STEPS:
        return None
    return steps


def _is_zero(name: str, producers: dict[str, onnx.NodeProto], weights: dict[str, onnx.TensorProto]) -> bool:
    """Whether ``name`` is all zeros whatever the input: an initial state torch's exporters make of
    the batch size (ConstantOfShape, or Expand of a zero, sliced)."""
    if name in weights:
        return not numpy_helper.to_array(weights[name]).any()
    node = producers.get(name)
    if node is None or node.op_type not in _ZERO_SOURCES | {"Constant"}:
        return False
    if node.op_type in ("ConstantOfShape", "Constant"):
        value = attributes(node).get("value")
        return value is None or not numpy_helper.to_array(value).any()
    return _is_zero(node.input[0], producers, weights)


def _written_out(
    node: onnx.NodeProto,
    steps: int,
    weights: dict[str, onnx.TensorProto],
    producers: dict[str, onnx.NodeProto],
    graph: onnx.GraphProto,
) -> list[onnx.NodeProto]:
    """The nodes of ``node``'s equations, writing its outputs under their names."""
    attrs = attributes(node)
    inputs = [*node.input, *[""] * 8]
    hidden = int(attrs["hidden_size"])
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    w, r = (numpy_helper.to_array(weights[inputs[k]]) for k in (1, 2))
    b = (
        numpy_helper.to_array(weights[inputs[3]])
        if inputs[3]
        else np.zeros((w.shape[0], 8 * hidden), w.dtype)
    )
    prefix = node.name or node.output[0]
    made: list[onnx.NodeProto] = []
    counter = iter(range(1 << 30))

    def emit(op: str, ins: list[str], **kw: Any) -> str:
        out = f"{prefix}/unrolled_{next(counter)}"
        made.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def constant(values: np.ndarray) -> str:
        name = f"{prefix}/unrolled_const_{next(counter)}"
        graph.initializer.append(numpy_helper.from_array(values, name))
        return name

    axis0, axis1 = constant(np.array([0], np.int64)), constant(np.array([1], np.int64))
    bounds = [constant(np.array([k * hidden], np.int64)) for k in range(5)]
    states = [inputs[k] if inputs[k] and not _is_zero(inputs[k], producers, weights) else "" for k in (5, 6)]
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    ys, finals_h, finals_c = [], [], []
    for d, backwards in enumerate(reverse):
        gate = _gates(emit, bounds, axis1)
        w_d, r_d = constant(w[d]), constant(r[d])
        bias = constant(b[d, : 4 * hidden] + b[d, 4 * hidden :])
        index = constant(np.array(d, np.int64))
        h, c = (emit("Gather", [s, index], axis=0) if s else "" for s in states)
        outputs: dict[int, str] = {}
        for t in reversed(range(steps)) if backwards else range(steps):
            x_t = emit("Gather", [node.input[0], constant(np.array(t, np.int64))], axis=0)
            z = emit("Gemm", [x_t, w_d, bias], transB=1)
            if h:
                z = emit("Add", [z, emit("Gemm", [h, r_d], transB=1)])
            i, o, f, g = gate(z, 0, "Sigmoid"), gate(z, 1, "Sigmoid"), None, gate(z, 3, "Tanh")
            c_new = emit("Mul", [i, g])
            if c:
                f = gate(z, 2, "Sigmoid")
                c_new = emit("Add", [emit("Mul", [f, c]), c_new])
            c = c_new
            h = emit("Mul", [o, emit("Tanh", [c])])
            outputs[t] = h
        ys.append(emit("Concat", [emit("Unsqueeze", [outputs[t], axis0]) for t in range(steps)], axis=0))
        finals_h.append(emit("Unsqueeze", [h, axis0]))
        finals_c.append(emit("Unsqueeze", [c, axis0]))
    results = [
        [emit("Unsqueeze", [y, axis1]) for y in ys],  # Y (steps, directions, batch, hidden)
        finals_h,  # Y_h (directions, batch, hidden)
        finals_c,  # Y_c
    ]
    for name, parts, axis in zip(node.output, results, (1, 0, 0), strict=False):
        if name:
            made.append(helper.make_node("Concat", parts, [name], f"{prefix}/unrolled_out_{name}", axis=axis))
    return made


def _gates(emit: Callable[..., str], bounds: list[str], axis: str) -> Callable[[str, int, str], str]:
    """``gate(z, k, op)``: the activation ``op`` of the k-th block of ``z``'s columns (ONNX's order:
    i, o, f, c)."""

    def gate(z: str, k: int, op: str) -> str:
        return emit(op, [emit("Slice", [z, bounds[k], bounds[k + 1], axis])])

    return gate
