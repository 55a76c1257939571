"""ONNX's ``Attention`` (opset 23) written as the operators it is defined by, for the methods' graph.

From opset 23, torch's dynamo exporter writes ``scaled_dot_product_attention`` (transformers' BERT,
``nn.TransformerEncoder``) as one ``Attention`` node. The torch conversion has none, so every
gradient and rule method was refused; and written as one module, the attention's softmax weights
would be out of the rule methods' reach. It is written as the exporters write attention at earlier
opsets: ``softmax(scale Q K^T + mask) V``, a boolean mask as 0 where a key takes part and the
float type's lowest value where it does not (tests/unit/models/test_attention_ops.py, against
onnxruntime's kernel). Past keys and values, causal masks, soft caps, the 3-D packed form and
grouped heads stay as they are and are named. The game runs the model as given.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from workers.models.onnx_nodes import attributes, constant_node
from workers.models.onnx_shapes import inferred_tensors

__all__ = ["attention_as_onnx"]


def attention_as_onnx(model: onnx.ModelProto) -> int:
    """Rewrite each plain ``Attention`` of ``model``'s main graph in place (module docstring);
    returns how many."""
    graph = model.graph
    if not any(_is_attention(node) for node in graph.node):
        return 0
    tensors = inferred_tensors(model)
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        written = _written(node, tensors, read) if _is_attention(node) else None
        if written is None:
            nodes.append(node)
            continue
        nodes.extend(written)
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _is_attention(node: onnx.NodeProto) -> bool:
    return node.op_type == "Attention" and node.domain in ("", "ai.onnx")


def _written(
    node: onnx.NodeProto, tensors: dict[str, tuple[list[int | None], int]], read: set[str]
) -> list[onnx.NodeProto] | None:
    options = attributes(node)
    plain = (
        not options.get("is_causal", 0)
        and not options.get("softcap", 0.0)
        and not options.get("qk_matmul_output_mode", 0)
        and "q_num_heads" not in options  # the 3-D form, heads packed in the last axis
        and not any(node.input[4:])  # past keys and values, padded lengths
        and not any(name in read for name in node.output[1:])
    )
    q, k, v = node.input[:3]
    mask = node.input[3] if len(node.input) > 3 else ""
    shapes = [tensors[name][0] if name in tensors else None for name in (q, k, v)]
    if not plain or any(shape is None or len(shape) != 4 for shape in shapes):
        return None
    heads = {shape[1] for shape in shapes if shape is not None}
    if len(heads) != 1 or None in heads:  # grouped heads: keys and values shared by several queries
        return None
    scale = options.get("scale")
    if scale is None:
        width = shapes[0][-1] if shapes[0] is not None else None
        if width is None:
            return None
        scale = 1.0 / math.sqrt(width)
    out, name = node.output[0], node.name or node.output[0]
    p = f"{out}/written"
    make = helper.make_node
    nodes = [
        make("Transpose", [k], [f"{p}/k_t"], name=f"{name}/k_t", perm=[0, 1, 3, 2]),
        make("MatMul", [q, f"{p}/k_t"], [f"{p}/scores"], name=f"{name}/scores"),
        constant_node(f"{p}/scale", scale, np.float32),
        make("Mul", [f"{p}/scores", f"{p}/scale"], [f"{p}/scaled"], name=f"{name}/scale"),
    ]
    scores = f"{p}/scaled"
    if mask:
        bias = mask
        if mask in tensors and tensors[mask][1] == onnx.TensorProto.BOOL:
            lowest = np.finfo(np.float32).min  # finite, as workers.models.onnx_to_torch writes -inf
            nodes += [
                constant_node(f"{p}/kept", 0.0, np.float32),
                constant_node(f"{p}/dropped", lowest, np.float32),
                make("Where", [mask, f"{p}/kept", f"{p}/dropped"], [f"{p}/bias"], name=f"{name}/mask"),
            ]
            bias = f"{p}/bias"
        nodes.append(make("Add", [scores, bias], [f"{p}/masked"], name=f"{name}/masked"))
        scores = f"{p}/masked"
    nodes += [
        make("Softmax", [scores], [f"{p}/weights"], name=f"{name}/softmax", axis=-1),
        make("MatMul", [f"{p}/weights", v], [out], name=f"{name}/context"),
    ]
    return nodes
