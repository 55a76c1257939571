"""Normalisations written out in several operators, as one operator in the torch graph the methods run on.

- **RMS norms.** Llama, Mistral, Qwen, Gemma and T5 normalise each token by its root mean square,
  ``x / sqrt(mean(x^2) + eps)`` over the last axis, then scale it (no centring, no shift: RMSNorm).
  ONNX has no operator for it before opset 23, so both of torch's exporters write it out:
  ``Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2)), eps))))`` (dynamo) or with ``Div(1, Sqrt(...))``
  (legacy), the weight a separate ``Mul``.
- **Layer norms written by hand.** The original ConvNeXt's channels-first layer norm, transformers'
  ViTDet, DeBERTa and Cohere write ``d = x - mean(x); d / sqrt(mean(d^2) + eps)`` over one axis (the
  channels of an NCHW tensor, or the last), then scale and shift it; the exporters keep every step
  (``d`` once, or two twin ``Sub``). Written with ``x.var()`` or ``torch.var_mean``, the legacy
  exporter centres the variance on a mean of its own (a twin ``ReduceMean``) and squares by ``Mul``.
- **Global response norms' scales.** ConvNeXt V2's GRN (timm, transformers) scales each channel by
  ``s / (mean(s over the channels) + eps)`` with ``s = ||x||`` over the spatial axes, then adds
  ``gamma * x * scale + beta`` to ``x``; the exporters write ReduceL2, ReduceMean, Add and Div.

Converted one by one, the rule methods stopped at the ``Pow`` or the ``ReduceL2`` ("no LRP rule").
Fused, the graph calls one ``RMSNorm``, ``Standardize`` or ``ResponseScale`` module (workers.models.onnx_converters), whose
scale LRP holds constant as it holds a layer norm's (docs/science.md 5.8), and whose gradient is the
same function's.
The game runs the original model on onnxruntime; only the methods' graph is rewritten.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from workers.models.fused_nodes import DOMAIN, PatternReader, write_fused
from workers.models.onnx_nodes import attributes, declared_ranks, default_opset, reduced_axes

__all__ = ["fuse_norms"]


def fuse_norms(model: onnx.ModelProto) -> int:
    """Replace every ``x / sqrt(mean(x^2, last axis) + eps)`` (an RMS norm) and every
    ``d / sqrt(mean(d^2, axis) + eps)`` with ``d = x - mean(x, axis)`` (a layer norm over one axis,
    without its affine) that ``model`` (constants lifted to initializers) writes out by one
    ``xaudit.RMSNorm`` or ``xaudit.Standardize`` node, and every GRN scale ``s / (mean(s, channel) +
    eps)`` with ``s = ReduceL2(x, spatial)`` by one ``xaudit.ResponseScale``; returns how many were
    fused."""
    version = default_opset(model)
    if version < 13:  # the fused nodes' function bodies are written in opset 13 or later
        return 0
    graph = model.graph
    reader = PatternReader(graph)
    only_use, scalar = reader.only_use, reader.scalar
    ranks = declared_ranks(graph)
    producers = {name: node for node in graph.node for name in node.output}

    def axis_of(mean: onnx.NodeProto, x: str) -> int | None:
        """The one axis ``mean`` reduces with keepdims (counted from 0 where ``x``'s rank is known)."""
        axes = reduced_axes(mean, reader.initializers)
        if axes is None or len(axes) != 1 or attributes(mean).get("keepdims", 1) != 1:
            return None
        rank = ranks.get(x)
        return axes[0] % rank if rank is not None else axes[0]

    def same(name: str, base: str) -> bool:
        """``name`` is ``base``, or the output of a twin of ``base``'s Sub: the same two inputs, or the
        same minuend less a twin mean (``x.var()`` centres ``x`` on a mean of its own)."""
        if name == base:
            return True
        a, b = producers.get(name), producers.get(base)
        if a is None or b is None or not a.op_type == b.op_type == "Sub" or a.domain or b.domain:
            return False
        return a.input == b.input or (a.input[0] == b.input[0] and twin_means(a.input[1], b.input[1]))

    def twin_means(first: str, second: str) -> bool:
        """``first`` and ``second`` are means of one tensor over the same axes."""
        a, b = producers.get(first), producers.get(second)
        if a is None or b is None or not a.op_type == b.op_type == "ReduceMean" or a.domain or b.domain:
            return False
        same_axes = reduced_axes(a, reader.initializers) == reduced_axes(b, reader.initializers)
        keep = attributes(a).get("keepdims", 1) == attributes(b).get("keepdims", 1)
        return a.input[0] == b.input[0] and same_axes and keep

    def epsilon(add: onnx.NodeProto, mean: onnx.NodeProto) -> float | None:
        """The constant ``add`` adds to ``mean``'s output, where it is one number >= 0."""
        shift = [name for name in add.input if name != mean.output[0]]
        eps = scalar(shift[0]) if len(shift) == 1 else None
        return None if eps is None or eps < 0 else eps

    def tail(power: onnx.NodeProto) -> tuple[str, int, float, list[onnx.NodeProto]] | None:
        """base, axis, eps and the nodes of ``base / sqrt(mean(base^2) + eps)`` from ``power`` on (the
        square a ``Pow`` by 2, or ``base * base``, as the legacy exporter writes ``x.var()``)."""
        base = power.input[0]
        squared = power.input[1] == base if power.op_type == "Mul" else scalar(power.input[1]) == 2.0
        if not squared:
            return None
        mean = only_use(power.output[0], "ReduceMean")
        axis = None if mean is None else axis_of(mean, base)
        add = None if mean is None else only_use(mean.output[0], "Add")
        if axis is None or mean is None or add is None:
            return None
        eps, sqrt = epsilon(add, mean), only_use(add.output[0], "Sqrt")
        if eps is None or sqrt is None:
            return None
        root = sqrt.output[0]
        step = only_use(root, "Reciprocal", "Div")
        if step is None:
            return None
        if step.op_type == "Div" and step.input[1] == root and same(step.input[0], base):
            return base, axis, eps, [power, mean, add, sqrt, step]  # base / sqrt(...)
        if step.op_type == "Div" and (step.input[1] != root or scalar(step.input[0]) != 1.0):
            return None
        scale = only_use(step.output[0], "Mul")  # base * (1 / sqrt(...))
        other = None if scale is None else [n for n in scale.input if n != step.output[0]]
        if scale is None or other is None or len(other) != 1 or not same(other[0], base):
            return None
        return base, axis, eps, [power, mean, add, sqrt, step, scale]

    def centring(
        base: str, axis: int, nodes: list[onnx.NodeProto]
    ) -> tuple[str, list[onnx.NodeProto]] | None:
        """x and the nodes of ``base = x - mean(x, axis)`` (with a twin Sub the division reads), when
        nothing outside the pattern reads them."""
        sub = producers.get(base)
        if sub is None or sub.op_type != "Sub" or sub.domain or len(sub.input) != 2:
            return None
        x, centre = sub.input
        mean = producers.get(centre)
        if mean is None or mean.op_type != "ReduceMean" or mean.domain or list(mean.input[:1]) != [x]:
            return None
        rank = ranks.get(x)  # the square's axis may be counted from the end where x's is not
        if axis_of(mean, x) != (axis % rank if rank is not None else axis):
            return None
        twins = [producers[n] for n in nodes[-1].input if n != base and n in producers and same(n, base)]
        pattern = [mean, sub, *twins, *nodes]
        inside = {id(n) for n in pattern}
        for node in pattern[:-1]:
            for name in node.output:
                users = reader.uses.get(name, [])
                if name in reader.outputs or any(id(u) not in inside for u in users):
                    return None
        return x, pattern

    def response_scale(l2: onnx.NodeProto) -> tuple[str, list[int], int, float, list[onnx.NodeProto]] | None:
        """x, the spatial axes, the channel axis, eps and the nodes of GRN's
        ``s / (mean(s, channel) + eps)`` with ``s = ReduceL2(x, spatial)``, from ``l2`` on."""
        x, s = l2.input[0], l2.output[0]
        spatial = reduced_axes(l2, reader.initializers)
        users = reader.uses.get(s, [])
        if not spatial or attributes(l2).get("keepdims", 1) != 1 or s in reader.outputs or len(users) != 2:
            return None
        mean = next((u for u in users if u.op_type == "ReduceMean" and not u.domain), None)
        divide = next((u for u in users if u.op_type == "Div" and not u.domain), None)
        if mean is None or divide is None or divide.input[0] != s:
            return None
        channel, add = axis_of(mean, x), only_use(mean.output[0], "Add")
        if channel is None or add is None:
            return None
        eps = epsilon(add, mean)
        if eps is None or only_use(add.output[0], "Div") is not divide:
            return None
        return x, spatial, channel, eps, [l2, mean, add, divide]

    fused: dict[int, onnx.NodeProto] = {}  # id of a pattern's last node -> the node replacing it
    dropped: set[int] = set()
    functions: list[onnx.FunctionProto] = []
    for node in graph.node:
        square = node.op_type in ("Pow", "Mul") and not node.domain and len(node.input) == 2
        found = tail(node) if square else None
        if found is None:
            continue
        base, axis, eps, nodes = found
        centred = centring(base, axis, nodes)
        last = nodes[-1]
        name = last.name or last.output[0]
        if centred is not None:
            x, nodes = centred
            op = "Standardize"
        else:
            rank = ranks.get(base)
            if base not in last.input or not (axis == -1 or (rank is not None and axis == rank - 1)):
                continue  # an RMS over another axis (the tokens'): not an RMS norm
            x, op = base, "RMSNorm"
        node = onnx.helper.make_node(op, [x], list(last.output), name=name, domain=DOMAIN, epsilon=eps)
        if op == "Standardize":
            node.attribute.append(onnx.helper.make_attribute("axes", [axis]))
        fused[id(last)] = node
        dropped.update(id(n) for n in nodes[:-1])
        if all(f.name != op for f in functions):
            functions.append(_norm_function(op, version))
    for node in graph.node:
        found_scale = response_scale(node) if node.op_type == "ReduceL2" and not node.domain else None
        if found_scale is None:
            continue
        x, spatial, channel, eps, nodes = found_scale
        last = nodes[-1]
        scale = onnx.helper.make_node(
            "ResponseScale",
            [x],
            list(last.output),
            name=last.name or last.output[0],
            domain=DOMAIN,
            epsilon=eps,
        )
        scale.attribute.extend(
            [
                onnx.helper.make_attribute("axes", spatial),
                onnx.helper.make_attribute("channel_axes", [channel]),
            ]
        )
        fused[id(last)] = scale
        dropped.update(id(n) for n in nodes[:-1])
        if all(f.name != "ResponseScale" for f in functions):
            functions.append(_response_scale_function(version))
    return write_fused(model, fused, dropped, *functions)


def _norm_function(op: str, version: int) -> onnx.FunctionProto:
    """xaudit.RMSNorm's or xaudit.Standardize's body, in the model's own opset: ``epsilon`` (and
    Standardize's ``axes``) attributes."""
    make = onnx.helper.make_node
    axes: str | list[int] = "axes" if op == "Standardize" else [-1]
    body = [_epsilon()]
    if op == "Standardize":
        body += [*_reduced("ReduceMean", "x", "centre", axes, version), make("Sub", ["x", "centre"], ["d"])]
    base = "d" if op == "Standardize" else "x"
    body += [
        make("Mul", [base, base], ["square"]),
        *_reduced("ReduceMean", "square", "mean", axes, version),
        make("Add", ["mean", "eps"], ["shifted"]),
        make("Sqrt", ["shifted"], ["rms"]),
        make("Div", [base, "rms"], ["y"]),
    ]
    names = ["epsilon", "axes"] if op == "Standardize" else ["epsilon"]
    return onnx.helper.make_function(
        DOMAIN, op, ["x"], ["y"], body, [onnx.helper.make_opsetid("", version)], attributes=names
    )


def _response_scale_function(version: int) -> onnx.FunctionProto:
    """xaudit.ResponseScale's body, in the model's own opset: ``axes`` (spatial), ``channel_axes`` and
    ``epsilon`` attributes."""
    make = onnx.helper.make_node
    body = [
        _epsilon(),
        *_reduced("ReduceL2", "x", "norm", "axes", version),
        *_reduced("ReduceMean", "norm", "mean", "channel_axes", version),
        make("Add", ["mean", "eps"], ["shifted"]),
        make("Div", ["norm", "shifted"], ["y"]),
    ]
    return onnx.helper.make_function(
        DOMAIN,
        "ResponseScale",
        ["x"],
        ["y"],
        body,
        [onnx.helper.make_opsetid("", version)],
        attributes=["axes", "channel_axes", "epsilon"],
    )


def _epsilon() -> onnx.NodeProto:
    """A function body's ``eps``: the fused node's ``epsilon`` attribute."""
    eps = onnx.helper.make_node("Constant", [], ["eps"])
    eps.attribute.append(
        onnx.helper.make_attribute_ref("value_float", onnx.AttributeProto.FLOAT, ref_attr_name="epsilon")
    )
    return eps


def _reduced(op: str, source: str, target: str, axes: str | list[int], version: int) -> list[onnx.NodeProto]:
    """A function body's ``op`` of ``source`` with keepdims over ``axes``: fixed, or the fused node's
    attribute of that name; an input from opset 18, an attribute before."""
    make = onnx.helper.make_node
    if version >= 18:
        if isinstance(axes, str):
            constant = make("Constant", [], [f"{target}_axes"])
            constant.attribute.append(
                onnx.helper.make_attribute_ref("value_ints", onnx.AttributeProto.INTS, ref_attr_name=axes)
            )
        else:
            value = numpy_helper.from_array(np.array(axes, np.int64), f"{target}_axes")
            constant = make("Constant", [], [f"{target}_axes"], value=value)
        return [constant, make(op, [source, f"{target}_axes"], [target], keepdims=1)]
    node = make(op, [source], [target], keepdims=1)
    if isinstance(axes, str):
        node.attribute.append(
            onnx.helper.make_attribute_ref("axes", onnx.AttributeProto.INTS, ref_attr_name=axes)
        )
    else:
        node.attribute.append(onnx.helper.make_attribute("axes", axes))
    return [node]
