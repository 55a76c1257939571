"""ONNX's LSTM and GRU operators written out step by step, for the methods' graph (docs/science.md 5.8).

torch's exporters write ``nn.LSTM`` and ``nn.GRU`` as one ``LSTM`` or ``GRU`` node, which the
conversion runs as the torch module (workers.models.onnx_converters.Recurrent): one opaque module, so
LRP, alpha-beta and Deep Taylor refused it by name. Written out as its equations (ONNX's gate orders:
LSTM i, o, f, c; GRU z, r, h),

    LSTM: z = x_t W^T + h R^T + b,  c = sigmoid(z_f) c + sigmoid(z_i) tanh(z_c),  h = sigmoid(z_o) tanh(c)
    GRU:  z, r = sigmoid(...),  n = tanh(x_t W_h^T + b_h + r (h R_h^T + b_rh)),  h = (1 - z) n + z h

it is Gemms, Slices, Sigmoids, Tanhs, Muls and Adds, each of which the LRP pass has a rule for: the
sigmoid gates are held constant (Arras et al. 2017's rule for LSTMs, as Keras' own export of its LSTM
already gets; a GRU's 1 - z is written sigmoid(-z), a gate of its own), tanh passes relevance on, and
a sum splits it by the proportional rule. The values and gradients are the operator's; the gradient
methods run on the same graph (Integrated Gradients on a 100-step, 64-unit LSTM, 64 rows, one thread:
0.65 s written out, 0.74 s on the fused module).

Written out only where every step can be: the time axis known from the shapes and at most
:data:`MAX_STEPS` steps times directions (a longer sequence would make a graph of thousands of nodes),
the default activations, no clip, peepholes, ``sequence_lens`` or ``input_forget``, a GRU's
``linear_before_reset`` (torch's), layout 0, constant weights. Any other stays the one module (the
rule methods refuse it by name).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workers.models.onnx_nodes import attributes, default_opset
from workers.models.onnx_shapes import infer_shapes_light

__all__ = ["MAX_STEPS", "unroll_recurrent"]

MAX_STEPS = 256  # time steps times directions
_GATES = {"LSTM": 4, "GRU": 3}
# An initial state torch's exporters make of the batch size: a constant, expanded, sliced, reshaped.
_ZERO_MAKERS = {"ConstantOfShape", "Constant"}
_ZERO_CARRIERS = {"Expand", "Slice", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Cast"}


def unroll_recurrent(model: onnx.ModelProto) -> int:
    """Write every LSTM and GRU node of ``model``'s main graph that can be (module docstring) out as
    its equations, in place; returns how many were."""
    graph = model.graph
    version = default_opset(model)
    if version < 13 or not any(node.op_type in _GATES for node in graph.node):
        return 0  # (Split, Slice, Squeeze and Unsqueeze take their sizes and axes as inputs from 13)
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
        nodes.extend(_Writer(node, graph).written_out(steps, weights, producers))
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


def _direction(node: onnx.NodeProto) -> str:
    direction = attributes(node).get("direction", b"forward")
    return direction.decode() if isinstance(direction, bytes) else str(direction)


def _steps(node: onnx.NodeProto, lengths: dict[str, int], weights: dict[str, onnx.TensorProto]) -> int | None:
    """The number of time steps of an LSTM or GRU node that can be written out, else None."""
    if node.op_type not in _GATES or node.domain not in ("", "ai.onnx"):
        return None
    attrs = attributes(node)
    inputs = [*node.input, *[""] * 8]
    plain = (
        attrs.get("layout", 0) == 0
        and "clip" not in attrs
        and "activations" not in attrs
        and attrs.get("input_forget", 0) == 0
        and (node.op_type == "LSTM" or attrs.get("linear_before_reset", 0) == 1)
        and not inputs[4]  # sequence_lens
        and not (node.op_type == "LSTM" and inputs[7])  # peepholes
        and all(inputs[k] in weights for k in (1, 2))
        and (not inputs[3] or inputs[3] in weights)
    )
    steps = lengths.get(node.input[0])
    directions = 2 if _direction(node) == "bidirectional" else 1
    if not plain or not steps or steps * directions > MAX_STEPS:
        return None
    return steps


def _is_zero(name: str, producers: dict[str, onnx.NodeProto], weights: dict[str, onnx.TensorProto]) -> bool:
    """Whether ``name`` is all zeros whatever the input: an initial state torch's exporters make of
    the batch size (ConstantOfShape, or Expand of a zero, sliced)."""
    if name in weights:
        return not numpy_helper.to_array(weights[name]).any()
    node = producers.get(name)
    if node is None or node.op_type not in _ZERO_MAKERS | _ZERO_CARRIERS:
        return False
    if node.op_type in _ZERO_MAKERS:
        value = attributes(node).get("value")
        return value is None or not numpy_helper.to_array(value).any()
    return _is_zero(node.input[0], producers, weights)


class _Writer:
    """The nodes and constants of one recurrent node's equations, named after it."""

    def __init__(self, node: onnx.NodeProto, graph: onnx.GraphProto) -> None:
        self.node, self.graph = node, graph
        self.prefix = node.name or node.output[0]
        self.made: list[onnx.NodeProto] = []
        self.count = 0
        self.hidden = int(attributes(node)["hidden_size"])
        self.axis0, self.axis1 = (
            self.constant(np.array([0], np.int64)),
            self.constant(np.array([1], np.int64)),
        )
        self.bounds = [self.constant(np.array([k * self.hidden], np.int64)) for k in range(5)]

    def name(self) -> str:
        self.count += 1
        return f"{self.prefix}/unrolled_{self.count}"

    def emit(self, op: str, ins: list[str], **kw: Any) -> str:
        out = self.name()
        self.made.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def constant(self, values: np.ndarray) -> str:
        name = self.name()
        self.graph.initializer.append(numpy_helper.from_array(values, name))
        return name

    def block(self, z: str, first: int, last: int) -> str:
        """Columns ``first * hidden`` to ``last * hidden`` of ``z``."""
        return self.emit("Slice", [z, self.bounds[first], self.bounds[last], self.axis1])

    def written_out(
        self, steps: int, weights: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto]
    ) -> list[onnx.NodeProto]:
        """The nodes of the equations, writing the node's outputs under their names."""
        node, hidden, gates = self.node, self.hidden, _GATES[self.node.op_type]
        inputs = [*node.input, *[""] * 8]
        w, r = (numpy_helper.to_array(weights[inputs[k]]) for k in (1, 2))
        b = (
            numpy_helper.to_array(weights[inputs[3]])
            if inputs[3]
            else np.zeros((w.shape[0], 2 * gates * hidden), w.dtype)
        )
        # the steps cut apart once (a Gather per step takes back a gradient of the whole sequence at
        # every step: many times slower for 100 steps)
        pieces = [f"{self.prefix}/unrolled_step_{t}" for t in range(steps)]
        sizes = self.constant(np.ones(steps, np.int64))
        self.made.append(helper.make_node("Split", [node.input[0], sizes], pieces, axis=0))
        x = [self.emit("Squeeze", [piece, self.axis0]) for piece in pieces]
        state_inputs = (5, 6) if node.op_type == "LSTM" else (5,)
        states = [
            inputs[k] if inputs[k] and not _is_zero(inputs[k], producers, weights) else ""
            for k in state_inputs
        ]
        reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[_direction(node)]
        results: list[list[str]] = [[], [], []]  # Y, Y_h, Y_c parts per direction
        for d, backwards in enumerate(reverse):
            index = self.constant(np.array(d, np.int64))
            start = [self.emit("Gather", [s, index], axis=0) if s else "" for s in states]
            order = reversed(range(steps)) if backwards else range(steps)
            if node.op_type == "LSTM":
                outputs, finals = self._lstm(x, order, w[d], r[d], b[d], start)
            else:
                outputs, finals = self._gru(x, order, w[d], r[d], b[d], start)
            results[0].append(
                self.emit(
                    "Concat", [self.emit("Unsqueeze", [outputs[t], self.axis0]) for t in range(steps)], axis=0
                )
            )
            for k, final in enumerate(finals):
                results[1 + k].append(self.emit("Unsqueeze", [final, self.axis0]))
        results[0] = [
            self.emit("Unsqueeze", [y, self.axis1]) for y in results[0]
        ]  # (steps, dirs, batch, hidden)
        for name, parts, axis in zip(node.output, results, (1, 0, 0), strict=False):
            if name:
                self.made.append(helper.make_node("Concat", parts, [name], axis=axis))
        return self.made

    def _lstm(
        self, x: list[str], order: Any, w: np.ndarray, r: np.ndarray, b: np.ndarray, start: list[str]
    ) -> tuple[dict[int, str], list[str]]:
        """ONNX's LSTM (gates i, o, f, c): the outputs by step and the final h and c."""
        hidden = self.hidden
        w_d, r_d = self.constant(w), self.constant(r)
        bias = self.constant(b[: 4 * hidden] + b[4 * hidden :])
        h, c = start
        outputs: dict[int, str] = {}
        for t in order:
            z = self.emit("Gemm", [x[t], w_d, bias], transB=1)
            if h:
                z = self.emit("Add", [z, self.emit("Gemm", [h, r_d], transB=1)])
            i, o = self.emit("Sigmoid", [self.block(z, 0, 1)]), self.emit("Sigmoid", [self.block(z, 1, 2)])
            cell = self.emit("Mul", [i, self.emit("Tanh", [self.block(z, 3, 4)])])
            if c:
                f = self.emit("Sigmoid", [self.block(z, 2, 3)])
                cell = self.emit("Add", [self.emit("Mul", [f, c]), cell])
            c = cell
            h = outputs[t] = self.emit("Mul", [o, self.emit("Tanh", [c])])
        return outputs, [h, c]

    def _gru(
        self, x: list[str], order: Any, w: np.ndarray, r: np.ndarray, b: np.ndarray, start: list[str]
    ) -> tuple[dict[int, str], list[str]]:
        """ONNX's GRU with ``linear_before_reset`` (gates z, r, h): the outputs by step and the final h.
        1 - z is written sigmoid(-z): its own gate, equal to it, whose only use is its product."""
        hidden = self.hidden
        w_d, r_d = self.constant(w), self.constant(r)
        x_bias = b[: 3 * hidden] + np.concatenate([b[3 * hidden : 5 * hidden], np.zeros(hidden, b.dtype)])
        bias = self.constant(x_bias)
        state_bias = self.constant(np.concatenate([np.zeros(2 * hidden, b.dtype), b[5 * hidden :]]))
        (h,) = start
        outputs: dict[int, str] = {}
        for t in order:
            z = self.emit("Gemm", [x[t], w_d, bias], transB=1)
            if h:
                state = self.emit("Gemm", [h, r_d, state_bias], transB=1)
                gates = self.emit("Add", [self.block(z, 0, 2), self.block(state, 0, 2)])
                recurrent = self.block(state, 2, 3)
            else:  # a zero state: its product is its bias alone
                gates, recurrent = self.block(z, 0, 2), self.constant(b[5 * hidden :])
            update = self.block(gates, 0, 1)
            reset = self.emit("Sigmoid", [self.block(gates, 1, 2)])
            new = self.emit(
                "Tanh", [self.emit("Add", [self.block(z, 2, 3), self.emit("Mul", [reset, recurrent])])]
            )
            kept = self.emit("Mul", [self.emit("Sigmoid", [self.emit("Neg", [update])]), new])
            if h:
                kept = self.emit("Add", [kept, self.emit("Mul", [self.emit("Sigmoid", [update]), h])])
            h = outputs[t] = kept
        return outputs, [h]
