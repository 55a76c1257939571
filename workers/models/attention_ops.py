"""ONNX's ``Attention`` (opsets 23 to 25) written as the operators it is defined by, for the methods'
graph.

From opset 23, torch's dynamo exporter writes ``scaled_dot_product_attention`` (transformers' BERT,
GPT-2 and Llama, ``nn.TransformerEncoder``, nanoGPT's causal attention, ``enable_gqa``) as one
``Attention`` node. The torch conversion has none, so every gradient and rule method was refused;
and written as one module, the attention's softmax weights would be out of the rule methods' reach.
It is written as the exporters write attention at earlier opsets, in the order of the operator's
definition: ``softmax(mask(softcap(scale Q K^T))) V``, where

- the 3-D form (heads packed in the last axis, ``q_num_heads`` and ``kv_num_heads``) is split into
  heads and joined again;
- grouped heads (fewer key and value heads than query heads) repeat each key and value head for its
  queries, ``[h0, h0, h1, h1, ...]``, as a Gather;
- a boolean mask is 0 where a key takes part and the float type's lowest value where it does not, and
  a float mask is added as it is;
- a causal mask (top-left: query i sees keys j <= i) and opset 25's sliding window
  (``i - left <= j <= i + right``) are one constant boolean matrix over the static sequence lengths,
  applied with Where so that a masked score is the lowest value, never a sum that overflows.

Checked against onnxruntime's kernel and onnx's reference implementation
(tests/unit/models/test_attention_ops.py). Past keys and values, padded key lengths (opset 24), dynamic
sequence lengths under a causal or window mask, a mask over fewer keys than there are, a softmax
precision other than float, a read second output and a constant mask that leaves a query no key stay
as they are; the torch conversion then names the node. The game runs the model as given.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import helper

from workers.models.onnx_nodes import attributes, constant_node, names_read, rewrite_nodes
from workers.models.onnx_shapes import inferred_tensors

__all__ = ["attention_as_onnx", "why_kept"]

_Tensors = dict[str, tuple[list[int | None], int]]


class _Kept(Exception):
    """This Attention stays as it is (the module docstring says which do); the message says why."""


def attention_as_onnx(model: onnx.ModelProto) -> int:
    """Rewrite each ``Attention`` of ``model``'s main graph that the module docstring covers, in
    place; returns how many."""
    graph = model.graph
    if not any(_is_attention(node) for node in graph.node):
        return 0
    tensors, read = inferred_tensors(model), names_read(graph)

    def written(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        try:
            return _written(node, tensors, read) if _is_attention(node) else None
        except _Kept:
            return None

    return rewrite_nodes(graph, written)


def why_kept(model: onnx.ModelProto, node: onnx.NodeProto) -> str:
    """Why :func:`attention_as_onnx` left the ``Attention`` ``node`` of ``model`` as it is, for the
    message that names it ("" where it would be written out, or is no ONNX Attention)."""
    if not _is_attention(node):
        return ""
    try:
        _written(node, inferred_tensors(model), names_read(model.graph))
    except _Kept as kept:
        return str(kept)
    return ""


def _is_attention(node: onnx.NodeProto) -> bool:
    return node.op_type == "Attention" and node.domain in ("", "ai.onnx")


def _written(node: onnx.NodeProto, tensors: _Tensors, read: set[str]) -> list[onnx.NodeProto]:
    options = attributes(node)
    if any(node.input[4:6]):
        raise _Kept("past keys and values")
    if any(node.input[6:]):
        raise _Kept("padded key lengths")
    if any(name in read for name in node.output[1:]):
        raise _Kept("its present keys and values or its scores are read")
    if options.get("softmax_precision", onnx.TensorProto.FLOAT) != onnx.TensorProto.FLOAT:
        raise _Kept("a softmax precision other than float")
    q_shape, k_shape, v_shape = (_dims(name, tensors) for name in node.input[:3])
    if not len(q_shape) == len(k_shape) == len(v_shape) or len(q_shape) not in (3, 4):
        raise _Kept("queries, keys and values of other ranks than 3 or 4")
    packed = len(q_shape) == 3  # (batch, sequence, heads * width)
    if packed:
        heads = (options.get("q_num_heads"), options.get("kv_num_heads"))
        lengths, q_width = (q_shape[1], k_shape[1]), q_shape[2]
        q_width = q_width // heads[0] if q_width and heads[0] else None
    else:
        heads, lengths, q_width = (q_shape[1], k_shape[1]), (q_shape[2], k_shape[2]), q_shape[3]
    if heads[0] is None or heads[1] is None or heads[0] % heads[1]:
        raise _Kept("head counts unknown, or query heads not a multiple of the key heads")
    allowed = _allowed(options, lengths)
    mask = node.input[3] if len(node.input) > 3 else ""
    mask_keys = tensors[mask][0][-1] if mask in tensors and tensors[mask][0] else None
    if mask_keys is not None and lengths[1] is not None and mask_keys != lengths[1]:
        raise _Kept("a mask over fewer keys than there are")  # the operator pads it with masked keys
    scale = options.get("scale")
    if scale is None:
        if q_width is None:
            raise _Kept("no scale, and the queries' width unknown")
        scale = 1.0 / math.sqrt(q_width)

    out, name = node.output[0], node.name or node.output[0]
    p = f"{out}/written"
    make = helper.make_node
    nodes: list[onnx.NodeProto] = []
    roles = dict(zip("qkv", node.input[:3], strict=True))
    if packed:  # (B, S, H*D) -> (B, H, S, D)
        for role, count in (("q", heads[0]), ("k", heads[1]), ("v", heads[1])):
            nodes += [
                constant_node(f"{p}/{role}_heads", [0, 0, count, -1]),
                make("Reshape", [roles[role], f"{p}/{role}_heads"], [f"{p}/{role}_split"], name=f"{name}/{role}_split"),
                make("Transpose", [f"{p}/{role}_split"], [f"{p}/{role}_4d"], name=f"{name}/{role}_4d", perm=[0, 2, 1, 3]),
            ]  # fmt: skip
            roles[role] = f"{p}/{role}_4d"
    if heads[0] != heads[1]:  # grouped heads: each key and value head serves heads[0] // heads[1] queries
        group = heads[0] // heads[1]
        nodes.append(constant_node(f"{p}/groups", [h // group for h in range(heads[0])]))
        for role in "kv":
            nodes.append(make("Gather", [roles[role], f"{p}/groups"], [f"{p}/{role}_grouped"], name=f"{name}/{role}_grouped", axis=1))  # fmt: skip
            roles[role] = f"{p}/{role}_grouped"
    nodes += [
        make("Transpose", [roles["k"]], [f"{p}/k_t"], name=f"{name}/k_t", perm=[0, 1, 3, 2]),
        make("MatMul", [roles["q"], f"{p}/k_t"], [f"{p}/scores"], name=f"{name}/scores"),
        constant_node(f"{p}/scale", scale, np.float32),
        make("Mul", [f"{p}/scores", f"{p}/scale"], [f"{p}/scaled"], name=f"{name}/scale"),
    ]
    scores = f"{p}/scaled"
    softcap = options.get("softcap", 0.0)
    if softcap > 0:  # softcap * tanh(scores / softcap), before the mask as the operator defines
        nodes += [
            constant_node(f"{p}/softcap_in", 1.0 / softcap, np.float32),
            make("Mul", [scores, f"{p}/softcap_in"], [f"{p}/capped_in"], name=f"{name}/softcap_in"),
            make("Tanh", [f"{p}/capped_in"], [f"{p}/capped_tanh"], name=f"{name}/softcap_tanh"),
            constant_node(f"{p}/softcap", softcap, np.float32),
            make("Mul", [f"{p}/capped_tanh", f"{p}/softcap"], [f"{p}/capped"], name=f"{name}/softcap"),
        ]
        scores = f"{p}/capped"
    lowest = np.finfo(np.float32).min  # finite, as workers.models.onnx_to_torch writes -inf
    if mask:
        bias = mask
        if mask in tensors and tensors[mask][1] == onnx.TensorProto.BOOL:
            nodes += [
                constant_node(f"{p}/kept", 0.0, np.float32),
                constant_node(f"{p}/dropped", lowest, np.float32),
                make("Where", [mask, f"{p}/kept", f"{p}/dropped"], [f"{p}/bias"], name=f"{name}/mask"),
            ]
            bias = f"{p}/bias"
        nodes.append(make("Add", [scores, bias], [f"{p}/masked"], name=f"{name}/masked"))
        scores = f"{p}/masked"
    if allowed is not None:
        nodes += [
            constant_node(f"{p}/allowed", allowed, np.bool_),
            constant_node(f"{p}/lowest", lowest, np.float32),
            make("Where", [f"{p}/allowed", scores, f"{p}/lowest"], [f"{p}/causal"], name=f"{name}/causal"),
        ]
        scores = f"{p}/causal"
    context = f"{p}/context" if packed else out
    nodes += [
        make("Softmax", [scores], [f"{p}/weights"], name=f"{name}/softmax", axis=-1),
        make("MatMul", [f"{p}/weights", roles["v"]], [context], name=f"{name}/context"),
    ]
    if packed:  # (B, H, S, D) -> (B, S, H*D)
        nodes += [
            make("Transpose", [context], [f"{p}/context_t"], name=f"{name}/context_t", perm=[0, 2, 1, 3]),
            constant_node(f"{p}/joined", [0, 0, -1]),
            make("Reshape", [f"{p}/context_t", f"{p}/joined"], [out], name=f"{name}/joined"),
        ]
    return nodes


def _dims(name: str, tensors: _Tensors) -> list[int | None]:
    if name not in tensors:
        raise _Kept(f"the shape of '{name}' unknown")
    return tensors[name][0]


def _allowed(options: dict[str, Any], lengths: tuple[int | None, int | None]) -> np.ndarray | None:
    """The causal and sliding-window mask as a (queries, keys) boolean matrix; None where the node has
    neither. Kept: dynamic lengths, or a query left with no key, which the operator answers with zeros
    and a softmax cannot."""
    left, right = options.get("left_window_size", -1), options.get("right_window_size", -1)
    causal = bool(options.get("is_causal", 0))
    if not causal and left < 0 and right < 0:
        return None
    if lengths[0] is None or lengths[1] is None:
        raise _Kept("a causal or window mask over sequence lengths known only at run time")
    offset = np.arange(lengths[0])[:, None] - np.arange(lengths[1])[None, :]  # i - j
    allowed = np.ones(offset.shape, dtype=bool)
    if causal:
        allowed &= offset >= 0
    if left >= 0:
        allowed &= offset <= left
    if right >= 0:
        allowed &= -offset <= right
    if not allowed.any(axis=1).all():
        raise _Kept("a causal or window mask that leaves a query no key")
    return allowed
