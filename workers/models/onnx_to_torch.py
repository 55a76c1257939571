"""ONNX -> differentiable torch graph, through onnx2torch's public converter registry.

onnx2torch stops at opset 18 for several operators. Where a newer operator version only widens the
accepted tensor types (float8, int4, bfloat16...) or adds an attribute we check for, we register
the older converter for the newer version. That is sound for the float32 graphs audited here; any
other gap surfaces as a clear "unsupported operator" error naming the operator and its node.
Models older than opset 13 whose operator versions onnx2torch lacks are upgraded to opset 13 by
onnx's version converter first (``_upgrade_opset``).

Older exporters (PaddlePaddle, early TF converters) write weights as Constant nodes or list them as
graph inputs too: both are normalised to plain initializers first, which is what onnx2torch's
layer converters (Conv, Gemm...) read their weights from. Infinite constants (the legacy exporter
writes an attention mask's fill as -inf) become the largest finite value of their type.
"""

from __future__ import annotations

import logging
import operator

import numpy as np
import onnx
import torch
from onnx import defs, numpy_helper, version_converter

from workers.light_imports import onnx2torch as _light_onnx2torch
from workers.models.onnx_nodes import default_opset
from xaudit.contract.errors import InvalidModel

_light_onnx2torch()  # before any onnx2torch import: keeps torchvision out
from onnx2torch import convert  # noqa: E402
from onnx2torch import converter as _onnx2torch_converter  # noqa: E402
from onnx2torch.node_converters.registry import (  # noqa: E402
    _CONVERTER_REGISTRY,
    OperationDescription,
    add_converter,
    get_converter,
)
from onnx2torch.onnx_graph import OnnxGraph as _Onnx2TorchGraph  # noqa: E402

from workers.models.attention_ops import attention_as_onnx, why_kept  # noqa: E402
from workers.models.ceil_mode_pools import ceil_mode_pools, has_far_end_pads  # noqa: E402
from workers.models.constant_batch_norms import fold_constant_batch_norms  # noqa: E402
from workers.models.dense_conv import dense_gradients  # noqa: E402
from workers.models.dense_layers import fuse_dense_layers  # noqa: E402
from workers.models.einsum_ops import einsums_as_matmul  # noqa: E402
from workers.models.experimental_ops import image_scalers_as_onnx  # noqa: E402
from workers.models.fake_quantization import simulate_quantization  # noqa: E402
from workers.models.gelu_fusion import fuse_gelu  # noqa: E402
from workers.models.ml_ops import ml_ops_as_onnx  # noqa: E402
from workers.models.norm_fusion import fuse_norms  # noqa: E402
from workers.models.onnx_converters import registered  # noqa: E402  (importing registers the converters onnx2torch lacks)
from workers.models.onnx_dims import negative_dims_unknown  # noqa: E402
from workers.models.onnx_outputs import only_output  # noqa: E402
from workers.models.onnx_shapes import infer_shapes_light, weightless  # noqa: E402
from workers.models.ort_unfusion import unfuse_onnxruntime_ops  # noqa: E402
from workers.models.pooled_rows import mark_pooled_rows, rows_at_axis_0_pools  # noqa: E402
from workers.models.quantized_operators import as_qdq  # noqa: E402
from workers.models.recurrent_unroll import unroll_recurrent  # noqa: E402

__all__ = ["UPGRADED_FROM", "method_graph", "methods_copy", "onnx_to_torch", "unconvertible_nodes"]

logger = logging.getLogger(__name__)

# convert() reads it at call time: shapes inferred without the weights' bytes (onnx_shapes.py)
_onnx2torch_converter.safe_shape_inference = infer_shapes_light

# Operators whose later versions (the ones opsets 19 to 25 use) differ from the last converted one only
# in the types they accept (tests/unit/models/test_onnx_support.py compares their schemas): opset 22
# adds bfloat16 to most layers, 23 to 25 new small float and integer types to data movement.
_TYPE_ONLY_UPDATES: dict[str, int] = {
    "Flatten": 13,
    "Equal": 13,  # 19 adds string inputs
    "Identity": 16,
    "Shape": 15,
    "Unsqueeze": 13,
    "Transpose": 13,
    "Constant": 13,
    "ConstantOfShape": 9,
    "Cast": 13,  # 19 adds `saturate` and 24 `round_mode`, which only affect float8 targets.
    "Reshape": 14,  # 19/21 add types; `allowzero`: onnx_converters._reshape_14.
    # transformers' BERT builds its attention mask with GreaterOrEqual-16 and IsNaN-20.
    "GreaterOrEqual": 12,  # 16 adds bfloat16
    "LessOrEqual": 12,
    "IsNaN": 13,  # 20 adds float8
    "IsInf": 10,
    # opset 22: torch.onnx.export(..., opset_version=22 or 23) writes every layer at it
    "Conv": 11,
    "ConvTranspose": 11,
    "MaxPool": 12,
    "AveragePool": 19,
    "GlobalAveragePool": 1,
    "GlobalMaxPool": 1,
    "InstanceNormalization": 6,
    "Dropout": 13,
    "HardSigmoid": 6,
    "HardSwish": 14,
    "Mish": 18,
    "Softplus": 1,
    "Elu": 6,
    "Selu": 6,
    "LSTM": 14,
    "GRU": 14,
    # opsets 23 to 25
    "Pad": 21,
    "Squeeze": 21,
}
_NEWEST_OPSET = 25  # the type-only updates above are checked up to it
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def _register_type_only_updates() -> None:
    for op, old in _TYPE_ONLY_UPDATES.items():
        converter = registered(op, old)
        for opset in range(19, _NEWEST_OPSET + 1):
            since = defs.get_schema(op, opset).since_version
            if OperationDescription(domain="", operation_type=op, version=since) not in _CONVERTER_REGISTRY:
                add_converter(operation_type=op, version=since)(converter)


_register_type_only_updates()


def _lift_constants(model: onnx.ModelProto) -> None:
    """Constant nodes holding a tensor, and Identity nodes of a weight, become initializers; graph
    inputs that only restate an initializer (IR < 4 style) are dropped, so the model has one input
    per real input."""
    graph = model.graph
    kept = []
    weights = {i.name: i for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.input[0] in weights:
            # The legacy exporter aliases weights shared between layers through Identity nodes.
            alias = onnx.TensorProto()
            alias.CopyFrom(weights[node.input[0]])
            alias.name = node.output[0]
            graph.initializer.append(alias)
            weights[alias.name] = alias
            continue
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            attr = node.attribute[0]
            value = onnx.helper.get_attribute_value(attr)
            if attr.name == "value":
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
            elif attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                tensor = numpy_helper.from_array(
                    np.asarray(value, np.float32 if "float" in attr.name else np.int64)
                )
            else:
                kept.append(node)
                continue
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            weights[tensor.name] = tensor
            continue
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(inputs)


def _finite_constants(model: onnx.ModelProto) -> None:
    """Float initializers holding +-inf take their type's largest finite magnitude instead.

    torch.onnx's legacy exporter writes ``masked_fill(mask, -inf)`` (transformers' BERT attention)
    as a -inf constant. DeepLIFT's rules (Captum's, where xaudit's own passes do not apply) divide
    output by input differences, and at masked positions both input and reference hold -inf:
    inf - inf is NaN and every attribution became NaN. With the finite fill the difference is 0
    and the rule takes the gradient there, as it does for the dynamo export (which writes the
    type's minimum, as transformers' eager attention does). The softmax is unchanged wherever a row
    keeps one position: exp(min - max) is 0 in float32 as exp(-inf) is. The game runs the
    original model on onnxruntime; this graph only carries the methods."""
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.data_type not in _FLOAT_TYPES:
            continue
        values = numpy_helper.to_array(tensor)
        if not np.isinf(values).any():
            continue
        info = np.finfo(values.dtype)
        model.graph.initializer[index].CopyFrom(
            numpy_helper.from_array(np.clip(values, info.min, info.max), tensor.name)
        )


_FLOAT_CASTS = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def _casts_to_float32(model: onnx.ModelProto) -> None:
    """Casts to float16, bfloat16 or float64 cast to float32: the methods' graph computes in float32
    (``onnx_to_torch`` makes its weights so). onnxconverter-common's float16 conversion with
    ``keep_io_types`` (onnxruntime's recipe for GPUs) casts the float32 input to float16 first, and
    torch then met a float16 activation with float32 weights in every gradient method. The game
    runs the model in its own precision; the conversion check allows for float16's rounding."""
    for node in model.graph.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i in _FLOAT_CASTS:
                attribute.i = onnx.TensorProto.FLOAT


def unconvertible_nodes(model: onnx.ModelProto) -> list[str]:
    """``'OP' (node 'NAME')`` for every node with no torch converter, in graph order, one per op."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    found: dict[str, str] = {}
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if node.op_type in found:
            continue
        try:
            get_converter(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
        except NotImplementedError:
            prefix = f"{domain}." if domain else ""
            kept = why_kept(model, node) if node.op_type == "Attention" else ""
            why = f", which stays as it is: {kept}" if kept else ""
            found[node.op_type] = f"'{prefix}{node.op_type}' (node '{node.name or node.output[0]}'{why})"
    return list(found.values())


# The oldest opset whose operator versions onnx2torch converts throughout (Upsample as Resize).
_UPGRADE_TO = 13
# The converted module's attribute that holds the opset a model was upgraded from (for the report).
UPGRADED_FROM = "xaudit_upgraded_from"


def _upgrade_opset(model: onnx.ModelProto) -> int | None:
    """Upgrade ``model`` in place to opset 13 where that converts more of its operators, and return the
    opset it was upgraded from (None: kept as it is). The ONNX Model Zoo's classic models are opset 7
    to 9, whose BatchNormalization-7, Gemm-7, Flatten-1, MaxPool-1, Dropout-7, Slice-1, Cast-6 and
    Upsample onnx2torch has no converter for, and every gradient and rule method was refused. onnx's
    version converter writes each in its opset-13 form (Upsample as Resize); the conversion check
    then compares the graph with the model as sent, which the game runs unchanged. So is a model
    before opset 10 with a max pool padded at its far ends, which can then be the ceil-mode pool it
    stands for (workers/models/ceil_mode_pools.py). A model the upgrade does not help (or that it
    fails on) is kept as it is. The converter is given the model without its large weights (as
    shapes; its adapters read attributes and small constants only): it copies what it is given
    twice over (VGG16: 1.6 GB more at the peak)."""
    opset = default_opset(model, _UPGRADE_TO)
    if opset >= _UPGRADE_TO:
        return None
    before = unconvertible_nodes(model)
    pools = opset < 10 and has_far_end_pads(model)  # ceil mode needs MaxPool-10 (ceil_mode_pools.py)
    if not before and not pools:
        return None
    light, weights = weightless(model)
    try:
        upgraded = version_converter.convert_version(light, _UPGRADE_TO)
    except Exception:  # onnx's converter raises anything on an operator it has no adapter for
        logger.info("opset %d -> %d failed", opset, _UPGRADE_TO, exc_info=True)
        return None
    after = len(unconvertible_nodes(upgraded))
    if not (after < len(before) or (pools and after <= len(before))):
        return None
    graph, new = model.graph, upgraded.graph
    light_names = {tensor.name for tensor in light.graph.initializer}
    kept = [tensor for tensor in graph.initializer if tensor.name not in light_names]  # the weights
    for field in ("node", "input", "output", "value_info", "initializer"):
        del getattr(graph, field)[:]
    graph.node.extend(new.node)
    graph.input.extend(value for value in new.input if value.name not in weights)
    graph.output.extend(new.output)
    graph.value_info.extend(new.value_info)
    graph.initializer.extend(new.initializer)  # the small ones, as the converter left them
    graph.initializer.extend(kept)
    del model.opset_import[:]
    model.opset_import.extend(upgraded.opset_import)
    model.ir_version = max(model.ir_version, upgraded.ir_version)
    return opset


def methods_copy(model: onnx.ModelProto, output: str | None = None) -> onnx.ModelProto:
    """A copy of ``model`` that the methods' graph is built from and onnx's shape inference may read:
    ``output`` alone where one is named (workers/models/onnx_outputs.py), negative declared dimensions
    read as unknown (workers/models/onnx_dims.py: shape inference aborts the process on them),
    onnxruntime's fused operators written back as ONNX's own (workers/models/ort_unfusion.py) and so
    are ONNX-ML's linear operators (workers/models/ml_ops.py), the former experimental ImageScaler
    (workers/models/experimental_ops.py), opset 23's Attention (workers/models/attention_ops.py) and
    batched matrix products written as Einsum (workers/models/einsum_ops.py). onnxruntime still runs it
    (the token models' embedding cut does). The game runs ``model`` itself."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if output is not None:
        only_output(copy, output)
    negative_dims_unknown(copy)
    unfuse_onnxruntime_ops(copy)
    ml_ops_as_onnx(copy)
    image_scalers_as_onnx(copy)
    attention_as_onnx(copy)
    einsums_as_matmul(copy)
    return copy


def onnx_to_torch(model: onnx.ModelProto, output: str | None = None) -> torch.nn.Module:
    """A torch.fx GraphModule equivalent to ``model`` (to its ``output`` alone where one is named), in
    eval mode, float32."""
    # the fused operators written back, and an old opset upgraded, before the converters are looked up
    copy = methods_copy(model, output)
    upgraded_from = _upgrade_opset(copy)
    # a statically quantized model: its operators as QDQ, its weights dequantized, each activation's
    # quantize-dequantize pair one fake quantization (torch only: xaudit's domain, which onnxruntime
    # is not given)
    try:
        as_qdq(copy)
        simulate_quantization(copy)
    except Exception as exc:  # onnx's reference evaluator raises anything on a type it lacks
        raise _failed("the quantized ONNX graph could not be rewritten for torch", exc) from None
    missing = unconvertible_nodes(copy)
    if missing:
        raise InvalidModel(f"no torch conversion for operator {', '.join(missing)}")
    try:
        _lift_constants(copy)
        _finite_constants(copy)
        _casts_to_float32(copy)
        ceil_mode_pools(copy)
        fold_constant_batch_norms(copy)
        pooled = rows_at_axis_0_pools(copy)  # before the fusions: their ONNX functions stop the walk
        fuse_gelu(copy)
        fuse_norms(copy)
        fuse_dense_layers(copy)
        unroll_recurrent(copy)
        _distinct_node_names(copy)
        module = _one_getitem_per_part(_unnested(convert(copy, attach_onnx_mapping=bool(pooled))))
        mark_pooled_rows(module, pooled)
        if upgraded_from is not None:
            setattr(module, UPGRADED_FROM, upgraded_from)
    except InvalidModel:
        raise
    except Exception as exc:  # onnx2torch raises anything from deep inside its converters
        logger.info("onnx2torch failed", exc_info=True)
        raise _failed("the ONNX graph could not be converted to torch", exc) from None
    return module.eval().float()


def _failed(what: str, exc: Exception) -> InvalidModel:
    """``what``, with the exception's type and the first line of its message."""
    message = str(exc).splitlines()[0][:160] if str(exc) else "no message"
    return InvalidModel(f"{what} ({type(exc).__name__}: {message})")


def _distinct_node_names(model: onnx.ModelProto) -> None:
    """onnx2torch names each node's module by the node's name ('.' read as '/', a leading '/'
    dropped), an unnamed node by its type, and counts repeats ('Add', 'Add_1'). A counted name can
    be another node's own: an unnamed Add that a rewrite put before the legacy exporter's '/Add' and
    '/Add_1' makes two 'Add_1', and the conversion failed. A node whose name is taken is renamed."""
    taken: set[str] = set()
    for k, node in enumerate(model.graph.node):
        name = _Onnx2TorchGraph.generate_node_name(node)
        if name in taken:
            node.name = f"{node.name or node.op_type}_xaudit_{k}"
            name = _Onnx2TorchGraph.generate_node_name(node)
        taken.add(name)


def _unnested(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Each ``nn.Sequential`` onnx2torch made of one node called as its parts in turn. It writes a
    Conv or pooling with asymmetric pads as a zero Pad, then the layer (torch's dynamo exporter folds
    timm's TF-style "same" padding into the Conv), and the rule methods refused the Sequential."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        parts = module.get_submodule(str(node.target))
        if not isinstance(parts, torch.nn.Sequential):
            continue
        value = node.args[0]
        with graph.inserting_before(node):
            for index in range(len(parts)):
                value = graph.call_module(f"{node.target}.{index}", (value,))
        node.replace_all_uses_with(value)
        graph.erase_node(node)
    module.recompile()
    return module


def _one_getitem_per_part(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """One ``getitem`` node for each part of a node's several outputs. onnx2torch writes one for each
    node that reads the part, so a part read twice was two nodes, and a rule that asks whether two
    arguments are the same value saw two values: timm's EVA-02 writes its SwiGLU's SiLU as
    ``x * sigmoid(x)`` of a Split's first part, and LRP found no gated unit there and refused it."""
    graph = module.graph
    first: dict[tuple[object, ...], torch.fx.Node] = {}
    for node in list(graph.nodes):
        plain = node.op == "call_function" and node.target is operator.getitem and not node.kwargs
        if not plain or not all(isinstance(a, (int, torch.fx.Node)) for a in node.args):
            continue
        if node.args in first:
            node.replace_all_uses_with(first[node.args])
            graph.erase_node(node)
        else:
            first[node.args] = node
    module.recompile()
    return module


def method_graph(model: onnx.ModelProto, device: torch.device, output: str | None = None) -> torch.nn.Module:
    """The graph the gradient and rule methods run on, for every model adapter: ``model`` converted
    (its ``output`` alone where one is named), on ``device``, its parameters frozen, and small
    convolutions' input gradients as dense products (workers.models.dense_conv)."""
    graph = dense_gradients(onnx_to_torch(model, output)).to(device)
    for p in graph.parameters():
        p.requires_grad_(False)
    return graph
