"""Which nodes of an onnx2torch fx graph a rule-based method can handle, and a plain evaluator.

Rule-based methods (LRP, Deep Taylor, DeepLIFT RevealCancel) have rules for a few layer kinds
only. Libraries such as Zennit silently fall back to the gradient for any other operator, which
would give a wrong answer without a word; :func:`plan_graph` refuses such graphs instead, naming
the operator. Node kinds on the input's path ("activations"):

- ``affine``: Linear, Conv1d/2d/3d;  ``avgpool``: average pooling, or a mean over non-batch axes
  (a linear map with W >= 0);
- ``relu``;  ``shape``: Flatten, Reshape, (Un)Squeeze, Identity, eval-mode Dropout;  ``maxpool``;
- ``input``: the one placeholder;
- ``merge`` (only where the caller asks): a sum or concatenation of activations, such as a
  residual connection; see :func:`plan_graph`;
- ``move`` (only where the caller asks): Transpose, Slice, Split and taking one of its parts:
  data movement, whose gradient routes relevance or multipliers to where each value came from;
- ``scale`` (only where the caller asks, DeepLIFT): an eval-mode batch norm, a per-channel
  ``s x + b`` that no exporter could fold into a convolution (DenseNet's, after its
  concatenations);
- ``clip`` (only where the caller asks): an activation clamped to [0, c], ReLU6
  (MobileNetV2's; onnx2torch writes ``Clip(0, 6)`` as ``nn.ReLU6``); see ``clips`` in
  :func:`plan_graph` for each family's rule;
- ``quantize`` (only where the caller asks): a quantize-dequantize pair of a statically quantized
  model (workers.models.fake_quantization); see ``quantized`` in :func:`plan_graph`;
- ``gate`` and ``gated`` (only where the caller asks): a sigmoid or hard sigmoid whose every
  use is to multiply another activation (``gate``: EfficientNet's SiLU, ``x * sigmoid(x)``, and the
  squeeze-and-excitation blocks of EfficientNet and MobileNetV3), the product (``gated``, its source
  the multiplied activation), and SiLU and Hardswish modules, each ``x`` times a gate of ``x``
  (``gated``); see ``gates`` (LRP: every gate) and ``self_gates`` (DeepLIFT: ``x`` times a gate of
  ``x`` only, an elementwise activation) in :func:`plan_graph`.

- ``head`` (only where the caller asks): a Softmax, LogSoftmax or Sigmoid whose only use is the
  model's output (a classifier exported with its probabilities); see ``heads`` in :func:`plan_graph`.
- ``norm`` (only where the caller asks): a layer normalisation, whose scale LRP holds constant;
  see ``norms`` in :func:`plan_graph`.
- ``factor``, ``bias`` and ``folded`` (only where the caller asks): an activation times or divided
  by a constant; plus or concatenated with constants; and the Add of a constant bias to a product
  with a constant matrix (that product an ``affine`` step, a Linear layer as exporters write it on
  3-d inputs, into which the bias is folded); see ``constants`` in :func:`plan_graph`.
- ``branch`` (with ``gates``): a node whose every use leads only into gates (the query-key scores
  of an attention head, GELU's ``erf``): evaluated, never explained, so any operator will do.

Nodes that do not depend on the input (constants, shape arithmetic after ``Shape``) are ``static``.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import fx, nn

from workers.methods._transposed import TRANSPOSED_TYPES, output_axis
from workers.models.pooled_rows import ROWS_AXIS
from xaudit.contract.errors import NotApplicable

__all__ = [
    "ACTIVATIONS",
    "AFFINE_TYPES",
    "AVGPOOL_TYPES",
    "SUPPORTED",
    "BoundPReLU",
    "ConstantMatMul",
    "Plan",
    "Step",
    "above_top",
    "below_output",
    "crossed_head",
    "elementwise",
    "evaluate",
    "family_plan",
    "folded_layer",
    "folds_into",
    "held_constant",
    "is_difference",
    "is_elementwise",
    "is_self_gated",
    "layer_norm_parts",
    "merge_parts",
    "norm_centres",
    "plan_graph",
    "relayed_factor",
    "run_node",
    "scale_and_shift",
    "without_head",
]

Kind = Literal[
    "input",
    "affine",
    "avgpool",
    "relu",
    "shape",
    "maxpool",
    "merge",
    "move",
    "scale",
    "clip",
    "quantize",
    "gate",
    "gated",
    "head",
    "norm",
    "factor",
    "bias",
    "folded",
    "branch",
    "static",
]

AFFINE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, *TRANSPOSED_TYPES)
AVGPOOL_TYPES: tuple[type[nn.Module], ...] = (
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
)
_AVG_NAMES = {"OnnxGlobalAveragePool", "OnnxGlobalAveragePoolWithKnownInputShape"}
_SHAPE_NAMES = {
    "Flatten", "OnnxFlatten", "FlattenAt", "OnnxReshape", "ReshapeAllowZero", "Identity", "OnnxCopyIdentity",
    "Dropout", "OnnxSqueezeStaticAxes", "OnnxSqueezeDynamicAxes", "OnnxUnsqueezeStaticAxes",
    "OnnxUnsqueezeDynamicAxes",
}  # fmt: skip
# torch's dynamo exporter writes adaptive average pooling as Unsqueeze -> ReduceMean -> Squeeze.
_MEAN = "OnnxReduceStaticAxes[mean]"
_ROW_POOLS = {_MEAN: "axes", "OnnxReduceSumStaticAxes": "_axes"}  # operator -> its module's axes
_SHAPE_READERS = {"OnnxShape"}  # activation in, shape out: static
_MAXPOOL = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
# Sums and concatenations of activations (onnx2torch's Add and Concat; torch's own in traced graphs).
_CONCAT_NAMES = {"OnnxConcat", "cat", "concat"}
_MERGE_NAMES = {"OnnxBinaryMathOperation[add]", "add", *_CONCAT_NAMES}
# Data movement: a permutation, a slice, the parts of a split (ShuffleNet's channel shuffle and split),
# and a gather at constant indices (_moves_data).
_MOVE_NAMES = {"OnnxTranspose", "OnnxSlice", "OnnxSliceV9", "OnnxSplit", "OnnxSplit13", "Split", "getitem"}
# Copies of the activation (grouped-query attention's keys and values repeated for each query head,
# Llama's repeat_kv; V-Net's input repeated over its first block's channels, a Tile): each output a
# copy of one input value, as a tensor read by several layers is; the gradient sums the copies'
# relevance back. Its second argument is a shape (Expand) or the repeats (Tile).
_COPY_NAMES = {"OnnxExpand", "OnnxTile"}
SUPPORTED = "Linear, Conv, ConvTranspose, ReLU, Flatten, Reshape, (Un)Squeeze, MaxPool, AvgPool, ReduceMean, ReduceSum"
MERGES = "Add and Concat of activations"
DIFFERENCES = "Sub of activations"
MOVES = (
    "Transpose, Slice, Split, Gather and GatherND at constant indices, Expand, Tile, zero Pad, nearest "
    "and linear Resize"
)
SCALES = "BatchNorm"
CLIPS = "ReLU6"
QUANTIZED = "QuantizeLinear -> DequantizeLinear pairs"
# A quantize-dequantize pair as workers.models.fake_quantization fuses it (onnx_converters' module).
_QUANTIZE_NAMES = {"FakeQuantize"}
GATES = (
    "SiLU, Hardswish, Mish, ELU, SELU, CELU, LeakyReLU, PReLU, GELU, tanh, sigmoid gates "
    "(squeeze-and-excitation), attention weights, SwiGLU and GeGLU gates, global response norms' scales"
)
SELF_GATES = "SiLU, Hardswish, Mish, ELU, SELU, CELU, LeakyReLU, PReLU"
HEADS = "Softmax, LogSoftmax or Sigmoid as the output"
NORMS = "LayerNorm (or written out), RMSNorm, InstanceNorm, LRN (their scale held constant)"
CONSTANTS = "MatMul, Mul, Div, Add, Sub and Concat with constants"
ELEMENTWISE_CONSTANTS = "Mul, Div, Add and Sub with constants"
_HEAD_TYPES: tuple[type[nn.Module], ...] = (nn.Softmax, nn.LogSoftmax, nn.Sigmoid)
_HEAD_NAMES = {"OnnxSoftmaxV1V11"}
# A gate's value is in [0, 1]; onnx2torch writes HardSigmoid as its own module.
_GATE_TYPES: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Hardsigmoid)
_GATE_NAMES = {"OnnxHardSigmoid"}
_MUL_NAMES = {"OnnxBinaryMathOperation[mul]", "mul"}
_MATMUL_NAMES = {"OnnxMatMul", "matmul"}
# LRP's gates beside sigmoids (docs/science.md 5.8): an attention head's softmax weights, and GELU's
# 1 + erf(x / sqrt 2) (1 + tanh(...) approximated), as the legacy exporter writes GELU.
_SOFTMAX_TYPES: tuple[type[nn.Module], ...] = (nn.Softmax,)
_SOFTMAX_NAMES = {"OnnxSoftmaxV1V11"}
_SQUASH_NAMES = {"OnnxErf", "Tanh", "OnnxFunction[tanh]"}
_WHERE_NAMES = {"OnnxWhere"}
_ADD_NAMES = {"OnnxBinaryMathOperation[add]", "add"}
_SUB_NAMES = {"OnnxBinaryMathOperation[sub]", "sub"}
_DIV_NAMES = {"OnnxBinaryMathOperation[_onnx_div]", "truediv"}
# torch's dynamo exporter writes an adaptive average pooling whose output size does not divide its
# input's (VGG's 7x7 pool on a small image's 1x1 map) as Transpose -> GatherND -> Transpose -> ReduceMean.
_GATHER_NAMES = {"OnnxGather", "OnnxGatherND"}
_PAD_NAMES = {"OnnxPadDynamic", "OnnxPadStatic", "PadAxes"}
_COPYING_PAD_MODES = {"replicate", "reflect", "circular"}  # torch's names of ONNX's edge, reflect, wrap
# Upsampling (U-Nets' decoders, segmentation heads): nearest copies values, linear interpolation takes
# a mean of neighbours with weights >= 0; cubic's weights can be negative, and it is not a move.
_RESIZE_NAMES = {"OnnxResize", "OnnxResizeV10"}
_MOVING_RESIZE_MODES = {"nearest", "linear"}
# nn.LayerNorm, and workers.models.onnx_converters' LayerNorm of the same name (sizes at run time), and
# its Standardize (a layer norm over one axis that workers.models.norm_fusion writes for one written out);
# instance norms on their inputs' own statistics (MONAI's U-Nets; GroupNorm as exporters write it, an
# instance norm over the reshaped groups followed by a constant scale and shift).
_STANDARDIZE = "Standardize"
_NORM_NAMES = {"LayerNorm", _STANDARDIZE}
# RMS normalisation (Llama, Mistral, Qwen, T5): torch's nn.RMSNorm, and the module of the same name
# that workers.models.norm_fusion writes for the exporters' Pow, ReduceMean, Add, Sqrt, Div.
_RMS_NORM_NAMES = {"RMSNorm"}
# ConvNeXt V2's global response normalisation scale, which workers.models.norm_fusion writes as one node.
_RESPONSE_SCALE_NAMES = {"ResponseScale"}
_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
# GELU modules (nn.GELU; ONNX Gelu, opset 20; workers.models.gelu_fusion's): x times a gate of x in
# [0, 1], for every rule family (FastViT's, RepViT's and InceptionNeXt's activation); tanh (BERT's
# pooler, tanh(x) / x in (0, 1]) for LRP only.
_GELU_NAMES = {"GELU", "Gelu"}
_LRP_SELF_GATED_NAMES = {*_GELU_NAMES, "Tanh", "OnnxFunction[tanh]"}
# Activations that are their input times a gate of it: SiLU = x sigmoid(x), Hardswish = x hardsigmoid(x),
# Mish = x tanh(softplus(x)) (YOLOv4's, CSPNet's), LeakyReLU and PReLU x times 1 or their slope (MONAI's
# U-Nets' defaults), the exponential linear units x times 1 or a positive (e^x - 1) / x (MONAI's V-Net's
# ELU; SELU and CELU scale and stretch it).
_SIGMOID_SELF_GATED = (nn.SiLU, nn.Hardswish)
_SMOOTH_SELF_GATED = (nn.Mish, nn.ELU, nn.SELU, nn.CELU)  # their factor named by their class
_SELF_GATED = (*_SIGMOID_SELF_GATED, *_SMOOTH_SELF_GATED, nn.LeakyReLU, nn.PReLU)
_PRELU_NAMES = {"OnnxPReLU"}  # onnx2torch's, its slope a second (constant) argument: :class:`BoundPReLU`
# The elementwise activations the rule passes have rules for: a ReLU, and a ReLU clamped at c (clip).
ACTIVATIONS = ("relu", "clip")
_SCALE_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(frozen=True)
class Admits:
    """What a rule family's pass admits beyond the layers in SUPPORTED (see :func:`plan_graph`)."""

    merges: bool = False
    differences: bool = False
    moves: bool = False
    scales: bool = False
    clips: bool = False
    quantized: bool = False
    gates: bool = False
    self_gates: bool = False
    heads: bool = False
    norms: bool = False
    constants: bool = False
    elementwise_constants: bool = False


# The passes and `xaudit inspect` read these here, so they cannot disagree.
_FAMILY_ADMITS: dict[str, Admits] = {
    "LRP": Admits(  # ._modified_backward
        merges=True,
        differences=True,
        moves=True,
        clips=True,
        quantized=True,
        gates=True,
        heads=True,
        scales=True,
        norms=True,
        constants=True,
    ),
    "DeepLIFT": Admits(
        merges=True,
        moves=True,
        scales=True,
        clips=True,
        quantized=True,
        self_gates=True,
        heads=True,
        constants=True,
    ),  # ._rescale_graph
    "RevealCancel": Admits(  # ._revealcancel_graph
        merges=True,
        moves=True,
        scales=True,
        clips=True,
        quantized=True,
        self_gates=True,
        heads=True,
        elementwise_constants=True,
    ),
}


@dataclass(frozen=True)
class Step:
    node: fx.Node
    kind: Kind
    module: nn.Module | None
    source: fx.Node | None  # the (first) activation argument (None for input and static nodes)
    sources: tuple[fx.Node, ...] = ()  # a merge's activation arguments, all of them
    gate: nn.Module | None = None  # a gated product's gate (the sigmoid's module)
    signed: bool = False  # a gate that can be negative (a GLU's), or a product with one
    # a step that mixes a gate's values (CaiT's talking heads), or a product with the mixed values
    mixed: bool = False


@dataclass(frozen=True)
class Plan:
    graph: fx.GraphModule
    steps: tuple[Step, ...]
    output: fx.Node  # the (first) model output


def _leaves(arg: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(arg, found.append)
    return found


def _operator_name(node: fx.Node, module: nn.Module | None) -> str:
    if module is None:
        return str(getattr(node.target, "__name__", node.target))
    return _module_name(module)


def _module_name(module: nn.Module | None) -> str:
    # onnx2torch's Add/Sub/Mul/Div share one class, and its Tanh, Exp, Cos, ... another
    op = getattr(module, "math_op_function", None) or getattr(module, "function", None)
    name = getattr(op, "__name__", None)
    return f"{type(module).__name__}[{name}]" if name else type(module).__name__


def _kind(module: nn.Module | None, name: str) -> Kind | None:
    if isinstance(module, AFFINE_TYPES):
        return "affine"
    if isinstance(module, AVGPOOL_TYPES) or name in _AVG_NAMES or _is_row_pool(module, name):
        return "avgpool"
    if isinstance(module, nn.ReLU):
        return "relu"
    if name in _SHAPE_NAMES or _is_float32_cast(module, name):
        return "shape"
    if isinstance(module, _MAXPOOL):
        return "maxpool"
    return None


def _is_float32_cast(module: nn.Module | None, name: str) -> bool:
    """A Cast to float32 of an activation: the identity in the methods' graph, which computes in
    float32 (workers.models.onnx_to_torch casts float16 and float64 to it): a float16 model's cast back
    before its output (onnxconverter-common's ``keep_io_types``)."""
    return name == "OnnxCast" and getattr(module, "torch_dtype", None) == torch.float32


def _is_scale(module: nn.Module | None) -> bool:
    """A batch norm that normalises by its running statistics: a fixed per-channel s x + b."""
    return (
        isinstance(module, _SCALE_TYPES)
        and not module.training
        and module.running_mean is not None
        and module.running_var is not None
    )


def scale_and_shift(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``scale`` node's per-channel s and b (y = s x + b), shaped (C,)."""
    assert isinstance(module, _SCALE_TYPES)
    mean, var = module.running_mean, module.running_var
    weight, bias = module.weight, module.bias
    assert isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
    s = torch.rsqrt(var + module.eps)
    if isinstance(weight, torch.Tensor):
        s = s * weight
    b = -mean * s
    if isinstance(bias, torch.Tensor):
        b = b + bias
    return s.detach(), b.detach()


def _is_clip(module: nn.Module | None) -> bool:
    """ReLU6, or any Hardtanh clamping to [0, c] with c > 0: zero below 0, the identity up to c."""
    return isinstance(module, nn.Hardtanh) and module.min_val == 0 and module.max_val > 0


def elementwise(step: Step) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise function of a ``clip`` or ``gated`` step (``x`` times a gate of ``x``): its
    module, or ``z * gate(z)`` for a SiLU the exporter wrote as a product."""
    gate = step.gate
    if gate is None:
        assert step.module is not None
        return step.module
    return lambda z: z * gate(z)


def folds_into(plan: Plan, norm: Step) -> bool:
    """The batch norm ``norm`` folds into its source: a Linear/Conv layer whose one use is the norm
    (a grouped transposed convolution's output channels are not one axis of its weight: not
    folded)."""
    source = norm.source
    assert source is not None
    module = _module(plan.graph, source)
    if isinstance(module, TRANSPOSED_TYPES) and module.groups != 1:
        return False
    return isinstance(module, AFFINE_TYPES) and len(source.users) == 1


_FOLDED: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def folded_layer(affine: nn.Module, norm: nn.Module) -> nn.Module:
    """``affine`` with the eval-mode batch norm after it folded in (weights times s, bias times s plus
    the norm's shift): one layer computing the same values, made once per norm so that the rules'
    caches of derived weights keep hitting."""
    if norm not in _FOLDED:
        scale, shift = scale_and_shift(norm)
        weight = affine.weight
        assert isinstance(weight, torch.Tensor)
        folded = copy.deepcopy(affine)
        with torch.no_grad():
            shape = [1] * weight.ndim
            shape[output_axis(affine)] = -1
            folded.weight = nn.Parameter(weight * scale.reshape(shape), requires_grad=False)
            bias = affine.bias if isinstance(affine.bias, torch.Tensor) else torch.zeros_like(scale)
            folded.bias = nn.Parameter(bias * scale + shift, requires_grad=False)
        _FOLDED[norm] = folded
    return _FOLDED[norm]


def is_elementwise(step: Step) -> bool:
    """A batch norm, or a product, quotient, sum or difference of one activation with constants: an
    elementwise scaling or shift (a concatenation with a constant, a class token, is not); or a
    quantize-dequantize pair, which rounds each value to its grid (a quantized model's input)."""
    if step.kind in ("scale", "quantize"):
        return True
    return step.kind in ("factor", "bias") and _operator_name(step.node, step.module) not in _CONCAT_NAMES


def _is_elementwise_self_gated(module: nn.Module | None) -> bool:
    """An activation that is its input times a gate of it, which every rule family has a rule for:
    LRP passes relevance through it, DeepLIFT and RevealCancel take their rules with f the module."""
    return isinstance(module, _SELF_GATED) or _module_name(module) in _GELU_NAMES


def is_self_gated(module: nn.Module | None) -> bool:
    """A ``gated`` step that is one activation module (SiLU, Hardswish, GELU), not a product of two
    nodes."""
    return isinstance(module, _SELF_GATED) or _module_name(module) in _LRP_SELF_GATED_NAMES


def _is_row_pool(module: nn.Module | None, name: str) -> bool:
    """A mean or a sum over given axes other than the batch axis: a linear map with W >= 0 within
    each row (ResNeSt sums its split-attention branches with a ReduceSum). The batch is axis 0 unless
    the conversion found the rows elsewhere (a sequence-first mean(0): workers/models/pooled_rows.py)."""
    axes = _reduced_axes(module, name)
    return bool(axes) and getattr(module, ROWS_AXIS, 0) not in axes


def _reduced_axes(module: nn.Module | None, name: str) -> list[int]:
    """The axes a ReduceMean or ReduceSum module reduces (none given, or another operator: [])."""
    return list(getattr(module, _ROW_POOLS[name], None) or []) if name in _ROW_POOLS else []


def _is_stack_sum(graph: fx.GraphModule, node: fx.Node, module: nn.Module | None, name: str) -> bool:
    """``torch.stack(parts).sum(0)`` (or ``.mean(0)``) as the exporters write it: a sum over axis 0 of a
    Concat on axis 0 of activations each unsqueezed at 0 (segmentation_models_pytorch's FPN merges its
    pyramid so). Axis 0 there is the stacking axis, not the batch: the parts' sum, whose gradient
    hands each part its share as a residual sum's does (a move for the passes: RevealCancel adds the
    parts' positive and negative parts field by field, as at a merge)."""
    if _reduced_axes(module, name) != [0]:
        return False
    if getattr(module, "_keepdims", getattr(module, "keepdims", 1)):
        return False
    stacked = node.args[0] if node.args else None
    if (
        not isinstance(stacked, fx.Node)
        or _operator_name(stacked, _module(graph, stacked)) not in _CONCAT_NAMES
    ):
        return False
    if getattr(_module(graph, stacked), "axis", None) != 0:
        return False
    return all(_unsqueezes_at_0(graph, part) for part in _leaves((stacked.args, stacked.kwargs)))


def _unsqueezes_at_0(graph: fx.GraphModule, node: fx.Node) -> bool:
    """An Unsqueeze of one tensor at axis 0 alone (its axes an attribute or a constant argument)."""
    module = _module(graph, node)
    if _operator_name(node, module) not in ("OnnxUnsqueezeStaticAxes", "OnnxUnsqueezeDynamicAxes"):
        return False
    axes = getattr(module, "_axes", None)
    if axes is None and len(node.args) > 1:
        axes = _constant(graph, node.args[1])
    return axes is not None and torch.as_tensor(axes).reshape(-1).tolist() == [0]


def plan_graph(
    graph: nn.Module,
    method: str,
    family: str,
    merges: bool = False,
    differences: bool = False,
    moves: bool = False,
    scales: bool = False,
    clips: bool = False,
    quantized: bool = False,
    gates: bool = False,
    self_gates: bool = False,
    heads: bool = False,
    norms: bool = False,
    constants: bool = False,
    elementwise_constants: bool = False,
) -> Plan:
    """Classify every node of ``graph``; NotApplicable(method, ...) naming the first operator on the
    input's path that has no ``family`` rule (e.g. "LRP", "RevealCancel").

    ``merges``: admit sums and concatenations whose every tensor argument is an activation, for a
    pass that has a rule for them. LRP's (:mod:`workers.methods._modified_backward`) carries a
    modified gradient (relevance = value x quantity): the plain gradient of a sum hands each summand
    the share a_i / z of the sum's relevance (the proportional rule Zennit's canonizers give residual
    sums), that of a concatenation each part its own slice; a pass that carries relevance itself
    (Zennit's hooks) would hand every summand all of it. RevealCancel's treats a sum as one linear
    layer with the summands' own terms (:mod:`workers.methods._revealcancel_graph`).

    ``differences``: admit a difference of two activations as a merge (PoolFormer's token mixer
    ``pool(x) - x``, FastViT's ``mixer(x) - norm(x)``), for LRP, whose gradient hands ``a - b``'s
    relevance to ``a`` and ``-b`` in the shares ``a / z`` and ``-b / z``: the proportional rule on
    the sum ``a + (-b)``. (RevealCancel would have to swap the subtrahend's parts; it refuses it.)

    ``moves``: admit data movement (Transpose, Slice, Split, a gather at constant indices, zero
    padding: :func:`_moves_data`) for a pass that takes it back by its
    gradient (LRP's and DeepLIFT's: relevance or multipliers follow each value to where it came
    from; a slice's dropped values get none). RevealCancel's moves differences and their parts
    forward and its multipliers back the same way.

    ``scales``: admit eval-mode batch norms (per-channel ``s x + b``) for DeepLIFT, whose reference
    implementation scales a difference's parts and multipliers by ``s`` (swapping them where
    ``s < 0``): what folding the norm into the layers before it gives; and for LRP, whose pass folds
    one that directly follows a Linear/Conv layer feeding nothing else into that layer (Zennit's
    canonizers do the same: :func:`folds_into`, :func:`folded_layer`) and takes any other by its
    gradient: the epsilon rule on it as a diagonal layer (Zennit's Norm rule), its shift absorbing a
    share (DenseNet's, after its concatenations, which no canonizer merges).

    ``clips``: admit ReLU6 (a clamp to [0, c]) for LRP, which passes relevance through it unchanged
    (Zennit's ``Pass``): where the unit saturates its gradient would drop relevance the layer above
    gave it; for DeepLIFT, whose Rescale multiplier is defined for any nonlinearity (Captum, which
    does not list ReLU6, would take its gradient); and for RevealCancel, whose rule is linear in the
    nonlinearity (relu(z) - relu(z - c)).

    ``quantized``: admit a statically quantized model's quantize-dequantize pairs, each an elementwise
    step function (its values rounded to the quantization grid and saturated at its ends), for LRP,
    which passes relevance through it unchanged as through ReLU6 (between the output and the top
    layer too: the output's relevance is its own value), and for DeepLIFT, whose Rescale multiplier is
    defined for any nonlinearity; not for RevealCancel, whose rule is written for clamps
    (docs/science.md 5.9).

    ``gates``: admit multiplicative gates for LRP, which holds the gate constant: the product passes
    its relevance to the activation it gates and none to the gate's branch (the rule of Arras et al.
    2017 for LSTM gates; on SiLU and Hardswish it is Zennit's ``Pass``, relevance unchanged through
    the activation). The gate's branch is evaluated, never explained.

    ``self_gates``: admit only ``x`` times a gate of ``x`` (SiLU, Hardswish, and ``x * sigmoid(x)``
    written as two nodes): an elementwise activation, for DeepLIFT, whose Rescale multiplier is
    defined for any (a squeeze-and-excitation gate, a product of two activations, has none).

    ``heads``: admit a Softmax, LogSoftmax or Sigmoid that is the model's output, for a pass that
    crosses it by its gradient, as it crosses the softmax of a probability or log-odds target (LRP,
    DeepLIFT Rescale): the model then explains its probabilities, and relevance is no longer
    conservative there (:func:`crossed_head` says so for the report).

    ``norms``: admit layer normalisations for LRP, which holds their scale 1 / std constant (the
    LN rule of Ali et al. 2022): the centring is linear and keeps its gradient. With ``gates``, an
    attention head's softmax weights and GELU's erf factor are gates too (their AH rule): the
    product with the values passes them all relevance, the query-key branch none.

    ``constants``: admit what exporters write around those for LRP: a product with a constant
    matrix (a Linear layer on 3-d inputs, MatMul + Add: an ``affine`` step with the bias folded in
    where the Add is its only use), a scaling by a constant (``factor``), a constant added or
    concatenated (``bias``: the class token and position embeddings, whose relevance is absorbed as
    a bias's is). DeepLIFT's Rescale pass takes all of these by their gradient, which is their
    multiplier: they are affine.

    ``elementwise_constants``: admit only the scaling and the shift, for RevealCancel, which scales a
    difference's parts and multipliers by the factor (swapped where it is negative), as for a batch
    norm, and passes them through a shift: Keras writes a batch norm it cannot fold into a
    convolution (after a pooling or a concatenation: DenseNet) and its Normalization and Rescaling
    layers as Sub, Mul, Add and Div with per-channel constants."""
    if not isinstance(graph, fx.GraphModule):
        raise NotApplicable(method, "needs a traced graph (torch.fx) of Linear/Conv/ReLU layers")
    steps: list[Step] = []
    active: set[fx.Node] = set()
    output: fx.Node | None = None
    activations = _activations(graph) if gates else set()  # what the gate walks read: once a plan
    gate_nodes, mixed_gates = _gates(graph, gates, activations) if gates or self_gates else _Gates({}, set())
    glu_nodes = _glu_gates(graph, gate_nodes, activations) if gates else {}
    gate_nodes.update(glu_nodes)
    branch_nodes = _branches(graph, gate_nodes) if gates else set()
    folded_biases: set[fx.Node] = set()
    for node in graph.graph.nodes:
        if node.op == "output":
            leaves = _leaves(node.args[0])
            output = leaves[0] if leaves else None
            continue
        if node.op == "placeholder":
            if active:
                raise NotApplicable(method, "the model has more than one input")
            steps.append(Step(node, "input", None, None))
            active.add(node)
            continue
        inputs = [a for a in _leaves((node.args, node.kwargs)) if a in active]
        module = _module(graph, node)
        name = _operator_name(node, module)
        # x.shape / x.size() / Shape read an activation but give the same value at every input.
        if not inputs or _reads_shape(graph, node):
            steps.append(Step(node, "static", module, None))
            continue
        if node in branch_nodes:
            steps.append(Step(node, "branch", module, inputs[0]))
            active.add(node)
            continue
        if node in folded_biases:
            steps.append(Step(node, "folded", module, inputs[0]))
            active.add(node)
            continue
        merged = merges and name in _MERGE_NAMES
        if (merged or (differences and name in _SUB_NAMES)) and _all_active(node, active, name):
            steps.append(Step(node, "merge", module, inputs[0], tuple(dict.fromkeys(inputs))))
            active.add(node)
            continue
        kind = _kind(module, name) if len(inputs) == 1 else None
        if node in mixed_gates:  # held as the gate it mixes, whatever it would be elsewhere
            kind = "gate"
        if kind is None and moves and len(inputs) == 1 and _moves_data(graph, node, name, inputs[0]):
            kind = "move"
        if kind is None and moves and len(inputs) == 1 and _is_stack_sum(graph, node, module, name):
            kind = "move"  # the parts' sum, taken back by its gradient as a sum of activations is
        if kind is None and scales and len(inputs) == 1 and _is_scale(module):
            kind = "scale"
        if kind is None and clips and len(inputs) == 1 and _is_clip(module):
            kind = "clip"
        if kind is None and quantized and len(inputs) == 1 and name in _QUANTIZE_NAMES:
            kind = "quantize"
        if kind is None and heads and len(inputs) == 1 and _is_head(module, name, node):
            kind = "head"
        if kind is None and node in gate_nodes:  # held constant, whatever its arguments
            kind = "gate"
        if kind is None and (gates or self_gates) and len(inputs) == 1 and _is_elementwise_self_gated(module):
            kind = "gated"
        if kind is None and (gates or self_gates) and len(inputs) == 1 and name in _PRELU_NAMES:
            prelu = _bound_prelu(graph, node, inputs[0])
            if prelu is not None:
                steps.append(Step(node, "gated", prelu, inputs[0]))
                active.add(node)
                continue
        if kind is None and gates and len(inputs) == 1 and name in _LRP_SELF_GATED_NAMES:
            kind = "gated"
        if kind is None and norms and len(inputs) == 1 and _is_norm(module, name):
            kind = "norm"
        if kind is None and elementwise_constants and len(inputs) == 1:
            kind = _with_constants(node, name, inputs[0])
        if kind is None and constants and len(inputs) == 1:
            layer = _constant_layer(graph, node, name, inputs[0])
            if layer is not None:
                linear, bias_node = layer
                steps.append(Step(node, "affine", linear, inputs[0]))
                active.add(node)
                folded_biases.update([bias_node] if bias_node is not None else [])
                continue
            kind = _with_constants(node, name, inputs[0])
        if kind is None and constants and name in _CONCAT_NAMES and inputs:
            steps.append(Step(node, "bias", module, inputs[0], tuple(dict.fromkeys(inputs))))
            active.add(node)
            continue
        if (
            kind is None
            and (gates or self_gates)
            and (name in _MUL_NAMES or (gates and name in _MATMUL_NAMES))
        ):
            gated = _gated_source(node, gate_nodes, active)
            if gated is not None:
                source, gate = gated
                mixed = gate in mixed_gates
                signed = gate in glu_nodes or mixed
                step = Step(node, "gated", module, source, gate=gate_nodes[gate], signed=signed, mixed=mixed)
                steps.append(step)
                active.add(node)
                continue
        if kind is None:
            extra = (
                [MERGES] * merges
                + [DIFFERENCES] * differences
                + [MOVES] * moves
                + [SCALES] * scales
                + [CLIPS] * clips
                + [QUANTIZED] * quantized
            )
            extra += [GATES] * gates + [SELF_GATES] * (self_gates and not gates) + [HEADS] * heads
            extra += [NORMS] * norms + [CONSTANTS] * constants
            extra += [ELEMENTWISE_CONSTANTS] * (elementwise_constants and not constants)
            supported = ", ".join([SUPPORTED, *extra])
            raise NotApplicable(
                method,
                f"operator {name} (node '{node.name}') has no {family} rule here; supported: {supported}",
            )
        signed = kind == "gate" and node in glu_nodes
        steps.append(Step(node, kind, module, inputs[0], signed=signed, mixed=node in mixed_gates))
        active.add(node)
    if output is None or output not in active:
        raise NotApplicable(method, "the model's output does not depend on its input")
    plan = Plan(graph, tuple(steps), output)
    if merges and family == "LRP":
        _refuse_above_top_layer(plan, method)
    return plan


class _Plans(dict[str, Plan]):
    """A graph's plans by family, kept on the graph itself: a plan refers to the graph, so a cache
    keyed by the graph elsewhere would keep every model a worker ever ran alive. A copy or a pickle of
    the graph starts without them (their steps name the original's nodes)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _Plans:
        return _Plans()

    def __reduce__(self) -> tuple[type[_Plans], tuple[()]]:
        return _Plans, ()


_PLANS_ATTRIBUTE = "_xaudit_plans"


def family_plan(graph: nn.Module, method: str, family: str) -> Plan:
    """:func:`plan_graph` with what ``family``'s own pass has rules for (LRP, DeepLIFT, RevealCancel),
    made once per graph and family: planning a transformer's graph (hundreds of nodes, its gates'
    branches traced) took a third of LRP's time on a ViT-Ti audit's sub-inputs (bench/suite.py,
    methods). A graph's nodes and modules do not change under the cache; a refusal is not kept (it
    names the method)."""
    plans = graph.__dict__.get(_PLANS_ATTRIBUTE)
    if not isinstance(plans, _Plans):
        plans = _Plans()
        graph.__dict__[_PLANS_ATTRIBUTE] = plans
    if family not in plans:
        plans[family] = plan_graph(graph, method, family, **dataclasses.asdict(_FAMILY_ADMITS[family]))
    return plans[family]


def below_output(steps: Sequence[Step], output: fx.Node) -> Step:
    """The first layer (affine or pooling), merge or input met walking down from ``output`` through
    single-source steps: for LRP, the layer that receives the output's relevance itself, or the merge
    that splits it."""
    return _down_from(steps, output)[-1]


def _down_from(steps: Sequence[Step], output: fx.Node) -> list[Step]:
    """The steps from ``output`` down through single-source steps to the first layer, merge or input
    (the last of them)."""
    by_node = {step.node: step for step in steps}
    walked = [by_node[output]]
    while walked[-1].kind not in ("affine", "avgpool", "input", "merge"):
        source = walked[-1].source
        assert source is not None
        walked.append(by_node[source])
    return walked


# Between the output and the layer that receives its relevance, these would make the relevance
# that layer receives differ from its own output's share: a constant added (not absorbed), a factor
# other than one positive number (relayed_factor), a norm (a batch norm that is not folded into the
# layer too); and an activation other than ReLU (SiLU, GELU, tanh, a gated product, ReLU6 where it
# clips), whose rule passes relevance on as a share of its value: the output's relevance is no such
# share, and the layer would receive y^2 / z for y (checked: SiLU on logits).
_NOT_ABOVE_TOP = {
    "factor": "the constant factor",
    "bias": "the constant shift",
    "norm": "the norm",
    "gated": "the activation",
    "clip": "the clipped activation",
}


def relayed_factor(plan: Plan, step: Step) -> float | None:
    """The multiplier of a ``factor`` step that multiplies or divides by one positive number (the
    mean of a distilled model's two heads, ``(head(x) + head_dist(x)) / 2``), else None. Above the
    layer or merge that receives the output's relevance such a factor passes it on unchanged: the
    relevance of ``c z`` is that of ``z``, scaled with it."""
    if step.kind != "factor" or len(step.node.args) != 2:
        return None
    name = _operator_name(step.node, step.module)
    other = [a for a in step.node.args if a is not step.source]
    value = _constant(plan.graph, other[0]) if len(other) == 1 else None
    if not _is_positive_scalar(value):
        return None
    number = float(value)  # type: ignore[arg-type]
    return 1.0 / number if name in _DIV_NAMES else number


def above_top(plan: Plan) -> list[Step]:
    """The steps between the output and the layer or merge that receives its relevance (LRP)."""
    return _down_from(plan.steps, plan.output)[:-1]


def _refuse_above_top_layer(plan: Plan, method: str) -> None:
    """LRP: relevance enters at the output and is split by layer rules, or by the proportional rule
    at a merge there (``f(x) + g(x)`` as the model's output: MONAI's residual units); a constant shift
    or factor, a norm or an activation between the output and them would hand them more or less than
    their output's share."""
    for between in above_top(plan):
        unfolded = between.kind == "scale" and not folds_into(plan, between)  # folded: part of the layer
        relayed = relayed_factor(plan, between) is not None
        if (between.kind in _NOT_ABOVE_TOP and not relayed) or unfolded:
            raise NotApplicable(
                method,
                f"{_NOT_ABOVE_TOP.get(between.kind, 'the batch norm')} '{between.node.name}' comes after "
                "the last Linear/Conv layer; relevance at the output has no rule to pass it",
            )


def merge_parts(step: Step) -> tuple[list[fx.Node], int | None]:
    """A merge's activation arguments in order (repeats kept) and its concatenation axis (None: a
    sum)."""
    node = step.node
    parts = _leaves((node.args, node.kwargs))
    if step.module is not None and _operator_name(node, step.module) in _CONCAT_NAMES:
        axis = getattr(step.module, "axis", None)
        assert isinstance(axis, int)
        return parts, axis
    if node.target in (torch.cat, torch.concat):
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
        assert isinstance(dim, int)
        return parts, dim
    return parts, None


class _Gates(NamedTuple):
    nodes: dict[fx.Node, nn.Module]  # each gate, and what it reaches its products through, with its module
    # Of those, what mixes a gate's values on the way (CaiT's talking heads): held too, as gate
    # steps; its products are signed, since mixed weights can be negative.
    mixed: set[fx.Node]


def _gates(graph: fx.GraphModule, every: bool, activations: set[fx.Node]) -> _Gates:
    """Sigmoids and hard sigmoids whose every use is one of the two factors of a product, with their
    modules; ``every=False``: only those whose products multiply the gate's own input (x * gate(x)).
    ``every``: also softmax weights and GELU's 1 + erf factor, and products by matrix (attention),
    reached through the steps :func:`_through_held_maps` follows (``activations``: the graph's)."""
    found: dict[fx.Node, nn.Module] = {}
    mixed: set[fx.Node] = set()
    for node in graph.graph.nodes:
        module = _module(graph, node)
        if not _is_gate_op(graph, node, module, every) or not node.users:
            continue
        own_input = node.args[0] if node.args else None
        users, reshaped, mixing = (
            _through_held_maps(graph, node, activations) if every else (list(node.users), [], [])
        )
        # 1 - g, a gate too (a GRU's h = z h + (1 - z) n, as Keras writes it): its uses are products
        complements = [user for user in users if every and _is_complement(graph, user, node)]
        users = [user for user in users if user not in complements]
        users += [user for complement in complements for user in complement.users]
        products = [
            _leaves((user.args, user.kwargs)) for user in users if _is_product(graph, user, matrix=every)
        ]
        if len(products) != len(users) or any(len(factors) != 2 for factors in products):
            continue
        if every or all(own_input in factors for factors in products):
            assert module is not None
            found[node] = module
            # the weights reshaped or mixed are the same gate (the plan evaluates them from the held weights)
            found.update(dict.fromkeys([*reshaped, *mixing], module))
            found.update(dict.fromkeys(complements, module))
            mixed.update(mixing)
    return _Gates(found, mixed)


def _glu_gates(
    graph: fx.GraphModule, gates: dict[fx.Node, nn.Module], activations: set[fx.Node]
) -> dict[fx.Node, nn.Module]:
    """Gated linear units' gates (SwiGLU in Llama, Mistral and Qwen, GeGLU in T5 v1.1): an activation
    ``act(g)`` (SiLU or GELU as one module, or ``g``, or a constant times ``g``, times a sigmoid or
    GELU factor of ``g``, as exporters write SiLU and GELU out) whose
    every use multiplies another activation ``u``. Held constant like the other gates, the product
    hands ``u`` all of its relevance and the gate's branch none. Unlike a sigmoid's, such a gate can
    be negative (SiLU's minimum is -0.28): the product does not keep ``u``'s sign."""
    found: dict[fx.Node, nn.Module] = {}
    for node in graph.graph.nodes:
        module = _module(graph, node)
        if node in gates or not _is_glu_activation(graph, node, module, gates):
            continue
        users = _value_users(graph, node)
        products = [_leaves((user.args, user.kwargs)) for user in users if _is_product(graph, user)]
        if not users or len(products) != len(users):
            continue
        # the other factor an activation: a GELU times a constant (a layer scale) is no gated unit
        others = [f for factors in products for f in factors if f is not node]
        paired = len(others) == len(products) and all(len(factors) == 2 for factors in products)
        if paired and all(o in activations and o not in gates for o in others):
            assert module is not None  # onnx2torch writes every operator as a module
            found[node] = module
    return found


def _activations(graph: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose values depend on the graph's input (not only through its shape)."""
    found: set[fx.Node] = set()
    for node in graph.graph.nodes:
        if node.op == "placeholder" or (
            not _reads_shape(graph, node) and any(a in found for a in _leaves((node.args, node.kwargs)))
        ):
            found.add(node)
    return found


def _is_glu_activation(
    graph: fx.GraphModule, node: fx.Node, module: nn.Module | None, gates: dict[fx.Node, nn.Module]
) -> bool:
    if isinstance(module, nn.SiLU) or _module_name(module) in _GELU_NAMES:
        return True
    if not _is_product(graph, node) or len(node.args) != 2:
        return False
    first, second = node.args  # x * gate(x), either order: SiLU, or GELU's factor written out
    return any(
        isinstance(g, fx.Node) and g in gates and _reads(g, _unscaled(graph, x), 4)
        for x, g in ((first, second), (second, first))
    )


def _unscaled(graph: fx.GraphModule, node: object) -> object:
    """``y`` where ``node`` is a constant times ``y`` (GELU's ``0.5 * x``, as the legacy exporter
    writes the tanh-approximated GELU of T5 and GPT-2 before its factor), else ``node``."""
    if not isinstance(node, fx.Node) or not _is_product(graph, node) or len(node.args) != 2:
        return node
    values = [a for a in node.args if isinstance(a, fx.Node) and _constant(graph, a) is None]
    return values[0] if len(values) == 1 else node  # the other argument a constant


def _reads(node: fx.Node, value: object, depth: int) -> bool:
    """Whether ``node`` is computed from ``value`` within ``depth`` steps."""
    args = [a for a in _leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)]
    return value in args or (depth > 1 and any(_reads(a, value, depth - 1) for a in args))


def _is_complement(graph: fx.GraphModule, node: fx.Node, gate: fx.Node) -> bool:
    """``node`` is 1 - ``gate``: in [0, 1] where the gate is, as a gate must be."""
    name = _operator_name(node, _module(graph, node))
    if name not in _SUB_NAMES or len(node.args) != 2 or node.args[1] is not gate:
        return False
    one = _constant(graph, node.args[0])
    return one is not None and torch.as_tensor(one).numel() == 1 and float(one) == 1.0


def _through_held_maps(
    graph: fx.GraphModule, node: fx.Node, activations: set[fx.Node]
) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    """The nodes that use ``node``'s values, followed through steps with one such use each: reshapes,
    and moves and constant linear maps of those values alone; those reshapes; and those other steps.
    DeBERTa reshapes its softmax weights to one axis of rows and heads before the product with the
    values (and the legacy exporter reads their shape for it); CaiT's talking heads mix the weights
    across heads (a Linear between two permutes) before theirs, EfficientFormerV2's with a 1x1
    convolution over the heads; GhostNetV2 upsamples its sigmoid gate (nearest) before its product;
    a statically quantized model puts the gate's values on its grid before the product."""
    users: list[fx.Node] = []
    reshaped: list[fx.Node] = []
    mixing: list[fx.Node] = []
    for user in _value_users(graph, node):
        while len(after := _value_users(graph, user)) == 1:
            if _is_reshape(graph, user) or _is_fake_quantize(graph, user):
                reshaped.append(user)
            elif _mixes_held_values(graph, user, node, mixing, activations):
                mixing.append(user)
            else:
                break
            user = after[0]
        users.append(user)
    return users, reshaped, mixing


def _mixes_held_values(
    graph: fx.GraphModule, node: fx.Node, gate: fx.Node, chain: list[fx.Node], activations: set[fx.Node]
) -> bool:
    """``node`` moves the gate's values (a transpose, an upsampling) or maps them linearly by
    constants (a convolution, a MatMul with a constant and its bias), reading no other activation: a
    product with one ends the chain, and so does an elementwise constant factor (GELU's 0.5, which
    the gate rules read)."""
    values = _leaves((node.args, node.kwargs))
    held = {gate, *chain}
    source = next((v for v in values if v in held), None)
    if source is None or any(v in activations and v not in held for v in values):
        return False
    module = _module(graph, node)
    name = _operator_name(node, module)
    after_map = bool(chain) and _operator_name(chain[-1], _module(graph, chain[-1])) in _MATMUL_NAMES
    if name in _MATMUL_NAMES or (name in _ADD_NAMES and after_map):
        return all(v in held or v.op == "get_attr" for v in values)
    return isinstance(module, nn.modules.conv._ConvNd) or _moves_data(graph, node, name, source)


def _value_users(graph: fx.GraphModule, node: fx.Node) -> list[fx.Node]:
    """``node``'s users but those that read only its shape (the same at every input)."""
    return [user for user in node.users if not _reads_shape(graph, user)]


def _reads_shape(graph: fx.GraphModule, node: fx.Node) -> bool:
    name = _operator_name(node, _module(graph, node))
    return name in _SHAPE_READERS or node.target == "size" or node.target is getattr


def _is_reshape(graph: fx.GraphModule, node: fx.Node) -> bool:
    module = _module(graph, node)
    return _kind(module, _operator_name(node, module)) == "shape"


def _unquantized(graph: fx.GraphModule, node: fx.Node) -> fx.Node:
    """``node``, or what its quantize-dequantize pairs quantize."""
    while _is_fake_quantize(graph, node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _is_fake_quantize(graph: fx.GraphModule, node: fx.Node) -> bool:
    """A quantize-dequantize pair (workers.models.fake_quantization): after a gate, the gate's values
    on the quantization grid, held with it (a quantized MobileNetV3's squeeze-and-excitation gates)."""
    return _operator_name(node, _module(graph, node)) in _QUANTIZE_NAMES


def _is_sigmoid_gate(module: nn.Module | None) -> bool:
    return isinstance(module, _GATE_TYPES) or type(module).__name__ in _GATE_NAMES


def _is_gate_op(graph: fx.GraphModule, node: fx.Node, module: nn.Module | None, every: bool) -> bool:
    if _is_sigmoid_gate(module):
        return True
    if not every:
        return False
    if _is_softmax(module) or _is_nan_safe_softmax(graph, node) or _is_response_scale(module):
        return True
    return _is_gelu_factor(graph, node) or _is_written_hard_sigmoid(graph, node)


def _is_response_scale(module: nn.Module | None) -> bool:
    """ConvNeXt V2's GRN scale (workers.models.norm_fusion): a ratio of norms, >= 0, held as a layer
    norm's scale is (docs/science.md 5.8)."""
    return _module_name(module) in _RESPONSE_SCALE_NAMES


def _is_written_hard_sigmoid(graph: fx.GraphModule, node: fx.Node) -> bool:
    """A hard sigmoid written out, ``relu6(z) / 6``: a clamp to [0, c] times, or divided by, a
    positive constant (Keras' MobileNetV3 gates its squeeze-and-excitation blocks so; the ``+ 3`` is
    the convolution's bias): non-negative, as a gate must be for the rules' sign tracking."""
    name = _operator_name(node, _module(graph, node))
    if len(node.args) != 2 or not (name in _MUL_NAMES or name in _DIV_NAMES):
        return False
    clipped = (
        node.args[0]
        if name in _DIV_NAMES
        else next((a for a in node.args if _constant(graph, a) is None), None)
    )
    factor = next((_constant(graph, a) for a in node.args if a is not clipped), None)
    return isinstance(clipped, fx.Node) and _is_clip(_module(graph, clipped)) and _is_positive_scalar(factor)


def _is_softmax(module: nn.Module | None) -> bool:
    """Softmax weights, in [0, 1]; onnx2torch converts opset 11's LogSoftmax to the same module."""
    named = type(module).__name__ in _SOFTMAX_NAMES and not getattr(module, "is_log", False)
    return isinstance(module, _SOFTMAX_TYPES) or named


def _is_nan_safe_softmax(graph: fx.GraphModule, node: fx.Node) -> bool:
    """``where(isnan(w), 0, w)`` of softmax weights ``w``, as torch exports scaled dot-product attention
    (a fully masked row's NaN weights made 0): weights in [0, 1] all the same."""
    if _operator_name(node, _module(graph, node)) not in _WHERE_NAMES or len(node.args) != 3:
        return False
    options = node.args[1:]
    fills = [_constant(graph, a) for a in options]
    weights = [a for a, c in zip(options, fills, strict=True) if c is None and isinstance(a, fx.Node)]
    fill = next((c for c in fills if c is not None), None)
    return (
        len(weights) == 1
        and _is_softmax(_module(graph, weights[0]))
        and fill is not None
        and bool(((torch.as_tensor(fill) >= 0) & (torch.as_tensor(fill) <= 1)).all())
    )


def _is_gelu_factor(graph: fx.GraphModule, node: fx.Node) -> bool:
    """GELU's factor as exporters write it: ``c * (1 + erf(x / sqrt 2))`` (or tanh), any c > 0 (the
    legacy exporter applies its 0.5 after the product, the dynamo exporter before): non-negative,
    as the rules' sign tracking needs of a gate."""
    name = _operator_name(node, _module(graph, node))
    constants = [_constant(graph, a) for a in node.args]
    values = [a for a, c in zip(node.args, constants, strict=True) if isinstance(a, fx.Node) and c is None]
    constants = [c for c in constants if c is not None]
    if len(values) != 1 or len(constants) != 1 or not _is_positive_scalar(constants[0]):
        return False
    inner = _unquantized(graph, values[0])  # a quantized model's erf or sum, put on its grid
    if name in _MUL_NAMES or (name in _DIV_NAMES and node.args[0] is values[0]):
        return _is_gelu_factor(graph, inner)
    inner_name = _operator_name(inner, _module(graph, inner))
    at_least_one = float(constants[0]) >= 1.0  # type: ignore[arg-type]
    return name in _ADD_NAMES and at_least_one and inner_name in _SQUASH_NAMES


def _is_positive_scalar(value: torch.Tensor | float | None) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and bool(value > 0)
    return value is not None and value > 0


def _branches(graph: fx.GraphModule, gate_nodes: dict[fx.Node, nn.Module]) -> set[fx.Node]:
    """Nodes whose every use of their values leads only into gates: a gate's branch, which a pass that
    holds the gates constant evaluates and never explains. A read of a node's shape is no use of its
    values (the legacy exporter with dynamic axes reads the rotated queries' shape in ModernBERT)."""
    found: set[fx.Node] = set()
    for node in reversed(graph.graph.nodes):
        users = _value_users(graph, node)
        if node.op in ("placeholder", "output") or node in gate_nodes or not users:
            continue
        if all(user in gate_nodes or user in found for user in users):
            found.add(node)
    return found


def _constant(graph: fx.GraphModule, arg: Any) -> torch.Tensor | float | None:
    """``arg``'s value where it is a constant: a number, or a parameter or buffer of the graph."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        value = _attribute(graph, arg)
        return value if isinstance(value, torch.Tensor) else None
    return None


def _attribute(graph: nn.Module, node: fx.Node) -> Any:
    """A ``get_attr`` node's value: the graph's parameter, buffer or constant it names."""
    value: Any = graph
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


class ConstantMatMul(nn.Linear):
    """``x @ W (+ b)`` with a constant ``W``, as the Linear layer it is: a rule's view of a MatMul node
    (and of the Add after it), not a module of the graph."""

    def reset_parameters(self) -> None:
        """Nothing to draw: the weights are the graph's. (nn.Linear's initialisation of the empty
        placeholder warned "Initializing zero-element tensors is a no-op" on the user's terminal.)"""


_LINEAR: weakref.WeakKeyDictionary[nn.Module, ConstantMatMul] = weakref.WeakKeyDictionary()


def _constant_layer(
    graph: fx.GraphModule, node: fx.Node, name: str, source: fx.Node
) -> tuple[ConstantMatMul, fx.Node | None] | None:
    """``x @ W`` with a constant matrix ``W`` as the Linear layer it is, with the bias of the Add that
    is its only use folded in (then that Add node too), made once per node; None for anything else."""
    module = _module(graph, node)
    if name not in _MATMUL_NAMES or module is None or len(node.args) != 2 or node.args[0] is not source:
        return None
    weight = _constant(graph, node.args[1])
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        return None
    user = next(iter(node.users)) if len(node.users) == 1 else None
    bias = None
    if user is not None and _operator_name(user, _module(graph, user)) in _ADD_NAMES:
        other = [_constant(graph, a) for a in user.args if a is not node]
        if len(other) == 1 and isinstance(other[0], torch.Tensor) and other[0].shape == weight.shape[1:]:
            bias = other[0]
    if module not in _LINEAR:
        linear = ConstantMatMul(0, 0, bias=False, device="meta")
        # views of the graph's own tensors, no copies: a transformer's Linear weights are most of it
        linear.weight = nn.Parameter(weight.detach().t(), requires_grad=False)
        linear.register_parameter(
            "bias", None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        )
        linear.in_features, linear.out_features = weight.shape
        _LINEAR[module] = linear
    layer = _LINEAR[module]
    return layer, (user if layer.bias is not None else None)


def _with_constants(node: fx.Node, name: str, source: fx.Node) -> Kind | None:
    """The kind of an operation of one activation ``source`` with constants: a scaling (``factor``:
    times, or divided by, a constant) or a shift (``bias``). A gather at constant indices and zero
    padding are moves (:func:`_moves_data`)."""
    first = node.args[0] if node.args else None
    if name in _MUL_NAMES or (name in _DIV_NAMES and first is source):
        return "factor"
    if name in _ADD_NAMES or (name in _SUB_NAMES and first is source):
        return "bias"
    return None


def _moves_data(graph: fx.GraphModule, node: fx.Node, name: str, source: fx.Node) -> bool:
    """Data movement of the activation ``source``: a move by name, a gather of its values at constant
    indices (not an embedding lookup, where the activation is the index), copies of it (Expand, Tile),
    padding that copies values or adds zeros (:func:`_pad_moves`), or an upsampling that copies values
    or takes means of them (:func:`_resizes_by_means`)."""
    if name in _MOVE_NAMES:
        return True
    first = node.args[0] if node.args else None
    if first is not source:
        return False
    if name in _RESIZE_NAMES:
        return _resizes_by_means(_module(graph, node))
    return name in _GATHER_NAMES or name in _COPY_NAMES or (name in _PAD_NAMES and _pad_moves(graph, node))


def _resizes_by_means(module: nn.Module | None) -> bool:
    """A nearest or linear Resize: each output a copy of one input value or a mean of neighbours with
    weights >= 0 that sum to 1, so its gradient takes relevance and multipliers back to where they
    came from, as a pooling's does, and moves a difference's positive and negative parts apart. Its
    size may be computed at run time from the input's shape (the exporters do): the gradient does not
    care."""
    mode = getattr(getattr(module, "_resize", module), "onnx_mode", None)
    return mode in _MOVING_RESIZE_MODES


def _pad_moves(graph: fx.GraphModule, node: fx.Node) -> bool:
    """A Pad that only moves values: one that copies them (edge, reflect and wrap modes: MONAI's
    BasicUNet pads its skip connections with ``replicate`` before each concatenation), or a constant
    one whose value is 0 (the default), since the pads then hold no value."""
    module = _module(graph, node)
    mode = getattr(getattr(module, "pad", module), "mode", None)
    if mode in _COPYING_PAD_MODES:
        return True
    value = node.args[2] if len(node.args) > 2 else getattr(module, "constant_value", 0.0)
    if isinstance(value, fx.Node):
        value = _constant(graph, value)
    return mode == "constant" and value is not None and not bool(torch.as_tensor(value).any())


def _is_norm(module: nn.Module | None, name: str) -> bool:
    """nn.LayerNorm, the converter's LayerNorm with constant scale (not onnx2torch's OnnxLayerNorm,
    whose scale is an input), or an instance norm on its input's own statistics (not one that keeps
    running statistics: in eval mode that is a fixed per-channel scale)."""
    if isinstance(module, _INSTANCE_NORMS):
        return not module.track_running_stats
    if isinstance(module, nn.LocalResponseNorm):
        return True
    if _is_rms_norm(module, name):
        return True
    if name not in _NORM_NAMES:
        return False
    if isinstance(module, nn.LayerNorm):
        return True
    if name == _STANDARDIZE:
        return hasattr(module, "axis") and hasattr(module, "epsilon")
    return hasattr(module, "axis") and hasattr(module, "epsilon") and hasattr(module, "weight")


def is_difference(step: Step) -> bool:
    """A ``merge`` step that subtracts its second activation (admitted for LRP only)."""
    return step.kind == "merge" and _operator_name(step.node, step.module) in _SUB_NAMES


def _is_rms_norm(module: nn.Module | None, name: str) -> bool:
    return isinstance(module, nn.RMSNorm) or (name in _RMS_NORM_NAMES and hasattr(module, "epsilon"))


def norm_centres(module: nn.Module | None) -> bool:
    """Whether a ``norm`` step subtracts its input's mean (all but an RMS normalisation)."""
    return not _is_rms_norm(module, _module_name(module))


def layer_norm_parts(module: nn.Module, ndim: int) -> tuple[tuple[int, ...], float, Any, Any]:
    """A ``norm`` step's normalised axes (for an input of ``ndim`` dimensions), epsilon, and scale and
    shift shaped to broadcast over the input (None where absent): a layer norm's over its trailing
    axes, an RMS norm's over its trailing axes (the converter's over the last; its scale a separate
    step), a Standardize's over its one axis (its affine separate steps), an instance norm's per
    channel (axis 1) over the axes after it."""
    if isinstance(module, nn.RMSNorm):
        eps = torch.finfo(torch.float32).eps if module.eps is None else module.eps
        return tuple(range(ndim - len(module.normalized_shape), ndim)), eps, module.weight, None
    if _is_rms_norm(module, _module_name(module)):
        return (ndim - 1,), float(getattr(module, "epsilon")), None, None  # noqa: B009
    if isinstance(module, _INSTANCE_NORMS):
        per_channel = (-1, *[1] * (ndim - 2))
        weight = None if module.weight is None else module.weight.reshape(per_channel)
        bias = None if module.bias is None else module.bias.reshape(per_channel)
        return tuple(range(2, ndim)), module.eps, weight, bias
    if isinstance(module, nn.LayerNorm):
        return tuple(range(ndim - len(module.normalized_shape), ndim)), module.eps, module.weight, module.bias
    axis, epsilon = module.axis, module.epsilon
    if _module_name(module) == _STANDARDIZE:  # over its one axis, its affine separate steps
        assert isinstance(axis, int) and isinstance(epsilon, float)
        return (axis % ndim,), epsilon, None, None
    assert isinstance(axis, int) and isinstance(epsilon, float)
    return tuple(range(axis % ndim, ndim)), epsilon, module.weight, module.bias


class BoundPReLU(nn.Module):
    """onnx2torch's PReLU with its constant slope bound: the one-argument activation a ``gated`` step's
    rules call (in the dtype of their input: RevealCancel's plans run in float64). It computes what
    onnx2torch's module computes (x where x >= 0, else x times the slope, broadcast as ONNX's PRelu
    broadcasts it) and holds no reference to that module, the key of the cache that keeps it."""

    def __init__(self, slope: torch.Tensor) -> None:
        super().__init__()
        self.slope = slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= 0, x, x * self.slope.to(x.dtype))


_PRELUS: weakref.WeakKeyDictionary[nn.Module, BoundPReLU] = weakref.WeakKeyDictionary()


def _bound_prelu(graph: fx.GraphModule, node: fx.Node, source: fx.Node) -> BoundPReLU | None:
    """The PReLU of ``source`` with a constant slope, made once per module; None for anything else."""
    module = _module(graph, node)
    if module is None or len(node.args) != 2 or node.args[0] is not source:
        return None
    slope = _constant(graph, node.args[1])
    if not isinstance(slope, torch.Tensor):
        return None
    if module not in _PRELUS:
        _PRELUS[module] = BoundPReLU(slope.detach())
    return _PRELUS[module]


def _is_head(module: nn.Module | None, name: str, node: fx.Node) -> bool:
    """A probability-like output op (Softmax, LogSoftmax, Sigmoid) whose only use is the output."""
    is_head_op = isinstance(module, _HEAD_TYPES) or name in _HEAD_NAMES
    return is_head_op and bool(node.users) and all(user.op == "output" for user in node.users)


def without_head(plan: Plan) -> tuple[Plan, nn.Module | None]:
    """The plan ending before its ``head`` step (its output the head's input), and the head's module;
    the plan itself and None where it has none."""
    head = _head_step(plan)
    if head is None:
        return plan, None
    assert head.source is not None and head.module is not None
    steps = tuple(step for step in plan.steps if step is not head)
    return Plan(plan.graph, steps, head.source), head.module


def _head_step(plan: Plan) -> Step | None:
    return next((step for step in plan.steps if step.kind == "head"), None)


def crossed_head(graph: nn.Module, method: str, family: str) -> str:
    """For the report: that ``family``'s pass crosses the model's output head by its gradient, or ""."""
    try:
        head = _head_step(family_plan(graph, method, family))
    except NotApplicable:
        return ""
    if head is None:
        return ""
    return (
        f"; the model's output {_operator_name(head.node, head.module)} is crossed by its gradient, "
        "as a probability target is (no rule covers it), so the attributions do not add up to the "
        "output change there"
    )


def held_constant(graph: nn.Module, method: str) -> str:
    """For the report: what LRP's pass holds constant in ``graph`` (layer norms' scales, attention
    weights, sigmoid gates, GELU's factor: docs/science.md 5.8), or ""."""
    try:
        plan = family_plan(graph, method, "LRP")
    except NotApplicable:
        return ""
    norms = [step.module for step in plan.steps if step.kind == "norm"]
    scaled = [norm for norm in norms if not isinstance(norm, nn.LocalResponseNorm)]  # LRN: a divisor
    held = {
        "layer norms' scales": any(not _instance(norm) and norm_centres(norm) for norm in scaled),
        "RMS norms' scales": any(not norm_centres(norm) for norm in scaled),
        "instance norms' scales": any(_instance(norm) for norm in scaled),
        "local response norms' divisors": len(scaled) < len(norms),
    }
    glu = {step.node for step in plan.steps if step.signed and step.kind == "gate"}
    for step in plan.steps:
        if step.mixed:
            continue  # weights mixed on their way to their product: the gate they came from says what
        if step.signed:
            held["GLU gates"] = True
            continue
        if step.kind == "gate" and step.node.users and all(user in glu for user in step.node.users):
            continue  # the sigmoid inside a GLU's SiLU, held with it
        if step.kind == "gated" and step.gate is None:  # x times a gate of x as one module
            gelu = _module_name(step.module) in _GELU_NAMES
            # (LeakyReLU and PReLU pass relevance as their gradient does: piecewise linear, nothing held)
            if gelu or isinstance(step.module, _SIGMOID_SELF_GATED):
                held["GELU's factor" if gelu else "sigmoid gates"] = True
            elif isinstance(step.module, _SMOOTH_SELF_GATED):
                held[f"{type(step.module).__name__}'s factor"] = True
        if step.kind == "gate":
            name = _operator_name(step.node, step.module)
            if _is_softmax(step.module) or name in _WHERE_NAMES:
                held["attention weights"] = True
            elif _is_response_scale(step.module):
                held["response norms' scales"] = True
            elif (  # a sigmoid, a hard sigmoid written out, or 1 - a sigmoid gate
                _is_sigmoid_gate(step.module)
                or _is_written_hard_sigmoid(plan.graph, step.node)
                or name in _SUB_NAMES
            ):
                held["sigmoid gates"] = True
            else:
                held["GELU's factor"] = True
    kept = [what for what, present in held.items() if present]
    return f"; held constant (Ali et al. 2022, Arras et al. 2017): {', '.join(kept)}" if kept else ""


def _instance(module: nn.Module | None) -> bool:
    return isinstance(module, _INSTANCE_NORMS)


def _module(graph: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return graph.get_submodule(str(node.target)) if node.op == "call_module" else None


def _is_product(graph: fx.GraphModule, node: fx.Node, matrix: bool = False) -> bool:
    name = _operator_name(node, _module(graph, node))
    return name in _MUL_NAMES or (matrix and name in _MATMUL_NAMES)


def _gated_source(
    node: fx.Node, gate_nodes: dict[fx.Node, nn.Module], active: set[fx.Node]
) -> tuple[fx.Node, fx.Node] | None:
    """The activation a product gates and the gate: one factor a gate, the other an activation."""
    factors = _leaves((node.args, node.kwargs))
    if len(factors) != 2:
        return None
    gate = [f for f in factors if f in gate_nodes]
    other = [f for f in factors if f not in gate_nodes and f in active]
    return (other[0], gate[0]) if len(gate) == 1 and len(other) == 1 else None


def _all_active(node: fx.Node, active: set[fx.Node], name: str) -> bool:
    """Every argument of ``node`` that is a graph value is an activation: a constant summand or slice
    would take relevance that never reaches the input. (A sum needs two; a concatenation of one
    tensor, as DenseNet's first layers write it, is the identity.)"""
    values = _leaves((node.args, node.kwargs))
    least = 1 if name in _CONCAT_NAMES else 2
    return len(values) >= least and all(v in active for v in values)


def evaluate(
    plan: Plan,
    x: torch.Tensor,
    affine: dict[fx.Node, Any] | None = None,
    held: Collection[fx.Node] = (),
    until: fx.Node | None = None,
) -> dict[fx.Node, Any]:
    """Every node's value for input ``x`` (up to ``until``, where given); ``affine`` may replace a
    node's module by a callable of its activation argument (e.g. a float64 copy of the layer);
    ``held`` nodes' values are taken without their gradient (gates held constant)."""
    env: dict[fx.Node, Any] = {}
    for step in plan.steps:
        if until is not None and until in env:
            break
        node = step.node
        if step.kind == "input":
            env[node] = x
        elif affine is not None and node in affine:
            assert step.source is not None
            env[node] = affine[node](env[step.source])
        else:
            env[node] = run_node(plan, step, env.__getitem__)
        if node in held:
            env[node] = env[node].detach()
    return env


def run_node(plan: Plan, step: Step, value_of: Callable[[fx.Node], Any]) -> Any:
    """One node's value, its arguments given by ``value_of`` (a parameter or buffer of the graph for a
    ``get_attr`` node): :func:`evaluate` on values, RevealCancel on differences."""
    node = step.node
    if node.op == "get_attr":
        return _attribute(plan.graph, node)
    args = fx.node.map_arg(node.args, value_of)
    kwargs = fx.node.map_arg(node.kwargs, value_of)
    if node.op == "call_module":  # the graph's module (a step's may be the layer it stands for)
        return plan.graph.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    return getattr(args[0], str(node.target))(*args[1:], **kwargs)  # call_method
