"""onnxruntime's fused operators written back as ONNX's own, for the methods' torch graph.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``), which CPU deployments
run on a BERT before serving it, fuses each residual sum with the layer norm after it into
``com.microsoft.SkipLayerNormalization`` and each bias with the exact GELU after it into
``com.microsoft.BiasGelu``; from a BERT with eager attention exported by the legacy exporter it also
makes ``EmbedLayerNormalization`` (the three lookups, their sum and its layer norm) and ``Attention``
(the packed query, key and value projection, the scaled scores, the padding mask, the softmax and
the weighted values). Only onnxruntime runs them: the torch conversion has no converter, so every
gradient and rule method was not applicable. Written back as ONNX's own operators, in the pattern
the exporters write (the GELU as five operators, which workers.models.gelu_fusion then fuses into one
``gelu``), the methods' graph is the unfused model's: its lookups where the gradient methods take
them, its layer norms and attention where LRP's transformer rules find them. Each rewrite computes
what onnxruntime's kernel computes (tests/unit/models/test_ort_unfusion.py); an operator used in a
way not written back here stays fused, and the methods name it. The game runs the model as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workers.models.onnx_nodes import (
    attributes,
    constant_node,
    declared_ranks,
    default_opset,
    names_read,
    rewrite_nodes,
)

__all__ = ["unfuse_onnxruntime_ops"]

_DOMAIN = "com.microsoft"
_NORM_EPSILON = 1e-12  # onnxruntime's default for SkipLayerNormalization and EmbedLayerNormalization
# The ONNX opset each rewrite needs: LayerNormalization joined at 17; the attention's Unsqueeze and
# ReduceSum take their axes as inputs from 13; Clip its bounds from 11.
_MIN_OPSET = {"SkipLayerNormalization": 17, "EmbedLayerNormalization": 17, "Attention": 13}
_DEFAULT_MIN_OPSET = 11
# The GELU's constants, as workers.models.gelu_fusion looks for them.
_SCALARS = {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}


@dataclass(frozen=True)
class _Graph:
    """What a rewrite reads of the whole graph."""

    read: set[str]  # tensors some node or the graph's output reads
    scalars: dict[str, str]  # the GELU's constants: key -> initializer name
    ranks: dict[str, int]  # tensor -> rank, where known
    dims: dict[str, list[int]]  # initializer -> its dims
    opset: int  # the model's ONNX opset


def unfuse_onnxruntime_ops(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s main graph in place: EmbedLayerNormalization, Attention,
    SkipLayerNormalization, BiasGelu, onnxruntime's Gelu, FusedConv, FusedGemm and FusedMatMul as
    ONNX's own operators; returns how many were rewritten. An operator whose rewrite the model's opset
    cannot express (``_MIN_OPSET``), or used in a way not written back here (each rewrite says which),
    is left as it is: the methods then name the operator they cannot convert."""
    version = default_opset(model)
    graph = model.graph
    read = names_read(graph)
    taken = {t.name for t in graph.initializer} | {o for node in graph.node for o in node.output}
    scalars = {key: _fresh(f"xaudit_unfused_{key}", taken) for key in _SCALARS}
    known = _Graph(read, scalars, _ranks(graph), {t.name: list(t.dims) for t in graph.initializer}, version)
    rewritten = rewrite_nodes(graph, lambda node: _guarded(node, known) if node.domain == _DOMAIN else None)
    if rewritten:
        used = {name for node in graph.node for name in node.input}
        graph.initializer.extend(
            numpy_helper.from_array(np.array(_SCALARS[key], np.float32), name)
            for key, name in scalars.items()
            if name in used
        )
    return rewritten


def _guarded(node: onnx.NodeProto, known: _Graph) -> list[onnx.NodeProto] | None:
    """:func:`_written`, or None for a node whose attributes do not fit its operator (a model is
    hostile until proven otherwise): it stays fused, and the methods name it."""
    try:
        return _written(node, known)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
        return None


def _written(node: onnx.NodeProto, known: _Graph) -> list[onnx.NodeProto] | None:
    if known.opset < _MIN_OPSET.get(node.op_type, _DEFAULT_MIN_OPSET):
        return None
    if node.op_type == "FusedConv":
        return _fused(node, "Conv", ("activation", "activation_params"))
    if node.op_type == "FusedGemm":
        return _fused(node, "Gemm", ("activation", "activation_alpha", "activation_beta", "activation_gamma"))
    if node.op_type == "FusedMatMul":
        return _fused_matmul(node)
    if node.op_type == "SkipLayerNormalization":
        return _skip_layer_norm(node, known.read)
    if node.op_type == "EmbedLayerNormalization":
        return _embed_layer_norm(node, known.read)
    if node.op_type == "Attention":
        return _attention(node, known)
    if node.op_type == "BiasGelu":
        total = f"{node.output[0]}/biased"
        add = helper.make_node("Add", list(node.input[:2]), [total], name=f"{_name(node)}/bias")
        return [add, *_gelu(total, node.output[0], _name(node), known.scalars)]
    if node.op_type == "Gelu":
        return _gelu(node.input[0], node.output[0], _name(node), known.scalars)
    return None


def _skip_layer_norm(node: onnx.NodeProto, read: set[str]) -> list[onnx.NodeProto] | None:
    """LayerNorm(input + skip (+ bias)) * gamma (+ beta), its sum also as output 3 where asked."""
    inputs = list(node.input) + [""] * (5 - len(node.input))
    data, skip, gamma, beta, bias = inputs[:5]
    outputs = list(node.output) + [""] * (4 - len(node.output))
    if any(name and name in read for name in outputs[1:3]):  # the mean or inverse deviation is read
        return None
    name = _name(node)
    total = outputs[3] or f"{outputs[0]}/skip_sum"
    summed = f"{total}/unbiased" if bias else total
    nodes = [helper.make_node("Add", [data, skip], [summed], name=f"{name}/skip")]
    if bias:
        nodes.append(helper.make_node("Add", [summed, bias], [total], name=f"{name}/bias"))
    nodes.append(_layer_norm(node, total, gamma, beta, outputs[0]))
    return nodes


def _fused(node: onnx.NodeProto, op: str, own: tuple[str, ...]) -> list[onnx.NodeProto] | None:
    """FusedConv (Conv, then a sum with its optional fourth input Z) and FusedGemm, which onnxruntime's
    extended optimization writes (a saved ``optimized_model_filepath``): the operator with its own
    attributes, then the activation it absorbed."""
    attrs = attributes(node)
    kind = attrs.get("activation", b"")
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    params = list(attrs.get("activation_params", []))
    if op == "Gemm":
        params = [attrs[k] for k in ("activation_alpha", "activation_beta") if k in attrs]
    name = _name(node)
    out = node.output[0]
    inputs = list(node.input)
    extra = inputs[3] if op == "Conv" and len(inputs) > 3 and inputs[3] else ""
    kept = [a for a in node.attribute if a.name not in own]
    core = helper.make_node(op, inputs[:3], [f"{out}/{op.lower()}"], name=f"{name}/{op.lower()}")
    core.attribute.extend(kept)
    nodes = [core]
    last = core.output[0]
    if extra:
        nodes.append(helper.make_node("Add", [last, extra], [f"{out}/sum"], name=f"{name}/sum"))
        last = f"{out}/sum"
    activation = _activation(kind, params, last, out, name)
    return None if activation is None else [*nodes, *activation]


def _activation(kind: str, params: list[float], x: str, y: str, name: str) -> list[onnx.NodeProto] | None:
    """The activation onnxruntime fused, with its parameters; None for one not known here."""
    make = helper.make_node
    if kind in ("Relu", "Tanh", "Sigmoid"):
        return [make(kind, [x], [y], name=f"{name}/{kind.lower()}")]
    if kind == "LeakyRelu":
        return [make(kind, [x], [y], name=f"{name}/leaky_relu", alpha=params[0] if params else 0.01)]
    if kind == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params) :])[:2]
        return [make(kind, [x], [y], name=f"{name}/hard_sigmoid", alpha=alpha, beta=beta)]
    if kind == "Clip" and len(params) == 2:
        low, high = f"{y}/clip_min", f"{y}/clip_max"
        return [
            constant_node(low, params[0], np.float32),
            constant_node(high, params[1], np.float32),
            make("Clip", [x, low, high], [y], name=f"{name}/clip"),
        ]
    return None


def _fused_matmul(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """FusedMatMul without batch transposes and without transposed operands: MatMul, then the scale
    ``alpha`` (the attention scores' 1/sqrt(d), as exporters write it)."""
    attrs = attributes(node)
    if any(attrs.get(k, 0) for k in ("transA", "transB", "transBatchA", "transBatchB")):
        return None
    alpha = float(attrs.get("alpha", 1.0))
    out, name = node.output[0], _name(node)
    if alpha == 1.0:
        return [helper.make_node("MatMul", list(node.input[:2]), [out], name=f"{name}/matmul")]
    return [
        helper.make_node("MatMul", list(node.input[:2]), [f"{out}/product"], name=f"{name}/matmul"),
        constant_node(f"{out}/alpha", [alpha], np.float32),
        helper.make_node("Mul", [f"{out}/product", f"{out}/alpha"], [out], name=f"{name}/alpha"),
    ]


def _gelu(x: str, y: str, name: str, scalars: dict[str, str]) -> list[onnx.NodeProto]:
    """``y = x * (erf(x / sqrt 2) + 1) * 0.5``, the exact GELU as the legacy exporter writes it."""
    make = helper.make_node
    return [
        make("Div", [x, scalars["sqrt2"]], [f"{y}/scaled"], name=f"{name}/div"),
        make("Erf", [f"{y}/scaled"], [f"{y}/erf"], name=f"{name}/erf"),
        make("Add", [f"{y}/erf", scalars["one"]], [f"{y}/gate"], name=f"{name}/add"),
        make("Mul", [x, f"{y}/gate"], [f"{y}/gated"], name=f"{name}/mul"),
        make("Mul", [f"{y}/gated", scalars["half"]], [y], name=f"{name}/half"),
    ]


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> rank, where the graph declares it, and 1 for EmbedLayerNormalization's mask index
    (its lengths, one per row)."""
    ranks = declared_ranks(graph)
    for node in graph.node:
        if node.domain == _DOMAIN and node.op_type == "EmbedLayerNormalization" and len(node.output) > 1:
            ranks[node.output[1]] = 1
    return ranks


def _embed_layer_norm(node: onnx.NodeProto, read: set[str]) -> list[onnx.NodeProto] | None:
    """LayerNorm(word[ids] + position[position_ids or 0..S-1] (+ segment[segment_ids])), the mask
    index as the count of ones in each row of the mask (zeros without one), the sum where asked."""
    inputs = list(node.input) + [""] * (9 - len(node.input))
    ids, segments, words, positions, segment_table, gamma, beta, mask, position_ids = inputs[:9]
    outputs = list(node.output) + [""] * (3 - len(node.output))
    out, mask_index, total = outputs[:3]
    name = _name(node)
    make = helper.make_node
    p = f"{out}/unfused"
    nodes = [
        make("Cast", [ids], [f"{p}/ids"], name=f"{name}/ids", to=onnx.TensorProto.INT64),
        make("Gather", [words, f"{p}/ids"], [f"{p}/words"], name=f"{name}/words"),
    ]
    if position_ids:
        nodes.append(
            make("Cast", [position_ids], [f"{p}/pos_ids"], name=f"{name}/pos_ids", to=onnx.TensorProto.INT64)
        )
    else:
        nodes += _positions(f"{p}/ids", f"{p}/pos_ids", name, np.int64)
    nodes += [
        make("Gather", [positions, f"{p}/pos_ids"], [f"{p}/positions"], name=f"{name}/positions"),
        make("Add", [f"{p}/words", f"{p}/positions"], [f"{p}/sum2"], name=f"{name}/add_positions"),
    ]
    summed = f"{p}/sum2"
    if segments and segment_table:
        nodes += [
            make("Cast", [segments], [f"{p}/seg_ids"], name=f"{name}/seg_ids", to=onnx.TensorProto.INT64),
            make("Gather", [segment_table, f"{p}/seg_ids"], [f"{p}/segments"], name=f"{name}/segments"),
            make("Add", [summed, f"{p}/segments"], [f"{p}/sum3"], name=f"{name}/add_segments"),
        ]
        summed = f"{p}/sum3"
    if total and total in read:
        nodes.append(make("Identity", [summed], [total], name=f"{name}/sum"))
    nodes.append(_layer_norm(node, summed, gamma, beta, out))
    if mask_index and mask_index in read:
        if mask:  # onnxruntime counts the ones of each row
            nodes += [
                constant_node(f"{p}/mask_one", [1], np.int32),
                make("Equal", [mask, f"{p}/mask_one"], [f"{p}/is_one"], name=f"{name}/is_one"),
                make("Cast", [f"{p}/is_one"], [f"{p}/ones"], name=f"{name}/ones", to=onnx.TensorProto.INT32),
                constant_node(f"{p}/axis1", [1]),
                make(
                    "ReduceSum",
                    [f"{p}/ones", f"{p}/axis1"],
                    [mask_index],
                    name=f"{name}/mask_index",
                    keepdims=0,
                ),
            ]
        else:
            nodes += [
                make("Shape", [f"{p}/ids"], [f"{p}/shape_b"], name=f"{name}/shape_b"),
                constant_node(f"{p}/zero", [0]),
                constant_node(f"{p}/one_b", [1]),
                make(
                    "Slice", [f"{p}/shape_b", f"{p}/zero", f"{p}/one_b"], [f"{p}/rows"], name=f"{name}/rows"
                ),
                make(
                    "ConstantOfShape",
                    [f"{p}/rows"],
                    [mask_index],
                    name=f"{name}/no_mask",
                    value=numpy_helper.from_array(np.zeros(1, np.int32)),
                ),
            ]
    return nodes


def _attention(node: onnx.NodeProto, known: _Graph) -> list[onnx.NodeProto] | None:
    """softmax(scale Q K^T + mask) V per head, Q, K, V from one packed projection; the mask from a
    mask index of lengths (B: keys from the length on are masked) or a raw 0/1 mask (B, S). Past
    states, causal masks, rotary embeddings and other mask layouts stay fused."""
    attrs = attributes(node)
    if attrs.get("unidirectional", 0) or attrs.get("do_rotary", 0) or "past_present_share_buffer" in attrs:
        return None
    if any(node.input[4:]) or any(name in known.read for name in node.output[1:]):
        return None
    inputs = list(node.input) + [""] * (4 - len(node.input))
    data, weights, bias, mask_index = inputs[:4]
    mask_rank = known.ranks.get(mask_index) if mask_index else 0
    if mask_rank not in (0, 1, 2):
        return None
    heads = int(attrs["num_heads"])
    filler = float(attrs.get("mask_filter_value", -10000.0))
    sizes = [int(v) for v in attrs.get("qkv_hidden_sizes", [])]
    weight = known.dims.get(weights)
    if not sizes:
        if weight is None:
            return None
        sizes = [weight[1] // 3] * 3
    if sizes[0] != sizes[1] or any(size % heads for size in sizes):
        return None
    head = sizes[0] // heads
    scale = float(attrs.get("scale", 1.0 / math.sqrt(head)))
    out = node.output[0]
    name = _name(node)
    p = f"{out}/unfused"
    make = helper.make_node
    nodes = [make("MatMul", [data, weights], [f"{p}/qkv"], name=f"{name}/qkv")]
    packed = f"{p}/qkv"
    if bias:
        nodes.append(make("Add", [packed, bias], [f"{p}/qkv_biased"], name=f"{name}/qkv_bias"))
        packed = f"{p}/qkv_biased"
    bounds = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    nodes.append(constant_node(f"{p}/axis2", [2]))
    for index, part in enumerate(("q", "k", "v")):
        width = sizes[index] // heads
        nodes += [
            constant_node(f"{p}/{part}_start", [bounds[index]]),
            constant_node(f"{p}/{part}_end", [bounds[index + 1]]),
            make(
                "Slice",
                [packed, f"{p}/{part}_start", f"{p}/{part}_end", f"{p}/axis2"],
                [f"{p}/{part}"],
                name=f"{name}/{part}",
            ),
            constant_node(f"{p}/{part}_heads", [0, 0, heads, width]),
            make(
                "Reshape",
                [f"{p}/{part}", f"{p}/{part}_heads"],
                [f"{p}/{part}_split"],
                name=f"{name}/{part}_split",
            ),
            make(
                "Transpose",
                [f"{p}/{part}_split"],
                [f"{p}/{part}_t"],
                name=f"{name}/{part}_t",
                perm=[0, 2, 3, 1] if part == "k" else [0, 2, 1, 3],
            ),
        ]
    nodes += [
        make("MatMul", [f"{p}/q_t", f"{p}/k_t"], [f"{p}/scores"], name=f"{name}/scores"),
        constant_node(f"{p}/scale", [scale], np.float32),
        make("Mul", [f"{p}/scores", f"{p}/scale"], [f"{p}/scaled"], name=f"{name}/scale"),
    ]
    scores = f"{p}/scaled"
    if mask_rank:
        nodes += _mask_bias(mask_index, mask_rank, data, filler, f"{p}/mask", name)
        nodes.append(make("Add", [scores, f"{p}/mask/bias"], [f"{p}/masked"], name=f"{name}/mask"))
        scores = f"{p}/masked"
    nodes += [
        make("Softmax", [scores], [f"{p}/probs"], name=f"{name}/softmax", axis=-1),
        make("MatMul", [f"{p}/probs", f"{p}/v_t"], [f"{p}/context"], name=f"{name}/context"),
        make("Transpose", [f"{p}/context"], [f"{p}/context_t"], name=f"{name}/context_t", perm=[0, 2, 1, 3]),
        constant_node(f"{p}/merged", [0, 0, sizes[2]]),
        make("Reshape", [f"{p}/context_t", f"{p}/merged"], [out], name=f"{name}/merge"),
    ]
    return nodes


def _mask_bias(
    mask_index: str, rank: int, data: str, filler: float, p: str, name: str
) -> list[onnx.NodeProto]:
    """``p``/bias (B, 1, 1, S): 0 where a key is attended, ``filler`` where masked, as onnxruntime's
    kernel adds it: a lengths index masks the keys from each row's length on; a raw mask its zeros."""
    make = helper.make_node
    nodes: list[onnx.NodeProto] = []
    if rank == 1:  # key positions in int32, the index's type
        nodes += [
            *_positions(data, f"{p}/positions", f"{name}/mask", np.int32),
            constant_node(f"{p}/one", [1]),
            make("Unsqueeze", [mask_index, f"{p}/one"], [f"{p}/lengths"], name=f"{name}/mask_lengths"),
            make("Less", [f"{p}/positions", f"{p}/lengths"], [f"{p}/attended"], name=f"{name}/mask_attended"),
        ]
    else:
        nodes += [
            constant_node(f"{p}/zero_int", [0], np.int32),
            make("Greater", [mask_index, f"{p}/zero_int"], [f"{p}/attended"], name=f"{name}/mask_attended"),
        ]
    nodes += [
        constant_node(f"{p}/open", [0.0], np.float32),
        constant_node(f"{p}/filler", [filler], np.float32),
        make(
            "Where",
            [f"{p}/attended", f"{p}/open", f"{p}/filler"],
            [f"{p}/keys_bias"],
            name=f"{name}/mask_where",
        ),
        constant_node(f"{p}/axes", [1, 2]),
        make("Unsqueeze", [f"{p}/keys_bias", f"{p}/axes"], [f"{p}/bias"], name=f"{name}/mask_bias"),
    ]
    return nodes


def _positions(of: str, out: str, name: str, dtype: type) -> list[onnx.NodeProto]:
    """``out`` = 0, 1, ..., S-1 in ``dtype`` (int64 or int32), S the length of ``of``'s second axis
    (the sequence), read at run time."""
    make = helper.make_node
    p = f"{out}/range"
    nodes = [
        make("Shape", [of], [f"{p}/shape"], name=f"{name}/shape"),
        constant_node(f"{p}/one", [1]),
        constant_node(f"{p}/two", [2]),
        make("Slice", [f"{p}/shape", f"{p}/one", f"{p}/two"], [f"{p}/length_1d"], name=f"{name}/length"),
        make("Squeeze", [f"{p}/length_1d"], [f"{p}/length"], name=f"{name}/length_scalar"),
    ]
    length = f"{p}/length"
    if dtype is not np.int64:
        to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        nodes.append(make("Cast", [length], [f"{p}/length_cast"], name=f"{name}/length_cast", to=to))
        length = f"{p}/length_cast"
    return [
        *nodes,
        constant_node(f"{p}/zero", 0, dtype),
        constant_node(f"{p}/step", 1, dtype),
        make("Range", [f"{p}/zero", length, f"{p}/step"], [out], name=f"{name}/range"),
    ]


def _layer_norm(node: onnx.NodeProto, x: str, gamma: str, beta: str, out: str) -> onnx.NodeProto:
    """ONNX's LayerNormalization over the last axis, with the contrib node's epsilon."""
    epsilon = float(attributes(node).get("epsilon", _NORM_EPSILON))
    inputs = [x, gamma, beta] if beta else [x, gamma]
    return helper.make_node(
        "LayerNormalization", inputs, [out], name=f"{_name(node)}/norm", axis=-1, epsilon=epsilon
    )


def _name(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _fresh(name: str, taken: set[str]) -> str:
    found, index = name, 0
    while found in taken:
        index += 1
        found = f"{name}_{index}"
    return found
