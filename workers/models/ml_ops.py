"""ONNX-ML's linear operators written as ONNX's own, for the methods' torch graph.

scikit-learn pipelines exported by skl2onnx compute a standardisation, an imputation and a logistic
regression (or the first layers of an MLP) with ``ai.onnx.ml`` operators, which only onnxruntime
runs: the torch conversion has none, so every gradient and rule method was not applicable on
models a gradient explains exactly. Written as ONNX operators that compute what onnxruntime's
kernels compute (tests/unit/models/test_ml_ops.py):

- ``Scaler``: (X - offset) * scale, as one affine layer (a Gemm with a diagonal matrix);
- ``Imputer``: X where X differs from the replaced value, the imputed value where it equals it;
  one that replaces NaN is the identity here, because every input the methods see is finite (the
  inputs are checked, and baselines and paths between finite points are finite);
- ``LinearRegressor`` (no post transform): X W^T + b;
- ``Normalizer``: X over its rows' L1 or L2 norm or largest value;
- ``ArrayFeatureExtractor`` with constant column indices: a Gather of those columns;
- ``LinearClassifier``'s scores (its label output unread): X W^T + b, then the post transform as
  onnxruntime applies it: with one coefficient row and two classes the scores are [1 - t, t] for
  t = sigmoid(s) (LOGISTIC) or t = s (every other transform, SOFTMAX included), and with several
  rows the transform itself (NONE, LOGISTIC, SOFTMAX).

Tree ensembles, SVMs and the rest stay as they are: trees are piecewise constant, so a gradient says
nothing of them, and the methods name the operator they cannot convert. The game runs the model
as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workers.models.onnx_nodes import attributes, default_opset, names_read, rewrite_nodes

__all__ = ["ml_ops_as_onnx"]

_DOMAIN = "ai.onnx.ml"
_OPSET = 13  # added where the model imports only ai.onnx.ml: the operators written here exist at it
_MAX_DIAGONAL = 4096  # a Scaler's width up to which its diagonal matrix (4 bytes per entry) is written


def ml_ops_as_onnx(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s main graph in place (module docstring); returns how many nodes were
    rewritten. An operator used in a way not written here is left as it is."""
    graph = model.graph
    known = _Graph(
        read=names_read(graph),
        opset=default_opset(model, _OPSET),
        dims={t.name: list(t.dims) for t in graph.initializer},
    )
    constants: list[onnx.TensorProto] = []

    def written(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        rewrite = _REWRITES.get(node.op_type) if node.domain == _DOMAIN else None
        found = rewrite(node, known) if rewrite is not None else None
        if found is None:
            return None
        constants.extend(found[1])
        return found[0]

    count = rewrite_nodes(graph, written)
    if count:
        graph.initializer.extend(constants)
        if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("", _OPSET))
    return count


@dataclass(frozen=True)
class _Graph:
    """What a rewrite reads of the whole graph."""

    read: set[str]  # tensors some node or the graph's output reads
    opset: int  # the model's ONNX opset
    dims: dict[str, list[int]]  # initializer -> its dims


Written = tuple[list[onnx.NodeProto], list[onnx.TensorProto]]


def _constant(name: str, values: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


def _prefix(node: onnx.NodeProto) -> str:
    return f"xaudit_ml/{node.name or node.output[0]}"


def _scaler(node: onnx.NodeProto, known: _Graph) -> Written | None:
    """A Gemm with the diagonal matrix diag(scale) and bias -offset * scale: one affine layer, which
    every rule method has a rule for (a subtraction of a constant has none)."""
    attrs = attributes(node)
    offset = np.asarray(attrs.get("offset", [0.0]), dtype=np.float32)
    scale = np.asarray(attrs.get("scale", [1.0]), dtype=np.float32)
    features = max(offset.size, scale.size)
    if (
        features == 1
        or features > _MAX_DIAGONAL
        or offset.size not in (1, features)
        or scale.size not in (1, features)
    ):
        return None  # the width is not known from the attributes, or the matrix would be large
    scale = np.broadcast_to(scale, (features,))
    p = _prefix(node)
    weights = _constant(f"{p}/scale", np.diag(scale))
    bias = _constant(f"{p}/shift", -np.broadcast_to(offset, (features,)) * scale)
    gemm = helper.make_node(
        "Gemm", [node.input[0], weights.name, bias.name], [node.output[0]], name=f"{p}/gemm"
    )
    return [gemm], [weights, bias]


def _imputer(node: onnx.NodeProto, known: _Graph) -> Written | None:
    attrs = attributes(node)
    values = list(attrs.get("imputed_value_floats", []))
    if not values:  # integer imputation: integer inputs have no gradient anyway
        return None
    replaced = float(attrs.get("replaced_value_float", 0.0))
    p = _prefix(node)
    if math.isnan(replaced):
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=p)], []
    found = f"{p}/found"
    return (
        [
            helper.make_node("Equal", [node.input[0], f"{p}/replaced"], [found], name=f"{p}/equal"),
            helper.make_node(
                "Where", [found, f"{p}/values", node.input[0]], [node.output[0]], name=f"{p}/where"
            ),
        ],
        [_constant(f"{p}/replaced", replaced), _constant(f"{p}/values", values)],
    )


def _affine(node: onnx.NodeProto, weights: np.ndarray, intercepts: np.ndarray, out: str) -> Written:
    """X W^T + b written to ``out``."""
    p = _prefix(node)
    w, b = _constant(f"{p}/coefficients", weights), _constant(f"{p}/intercepts", intercepts)
    return [helper.make_node("Gemm", [node.input[0], w.name, b.name], [out], name=f"{p}/gemm", transB=1)], [
        w,
        b,
    ]


def _coefficients(attrs: dict[str, object], rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The (rows, features) coefficients and (rows,) intercepts, None where they do not fit."""
    coefficients = np.asarray(attrs.get("coefficients", []), dtype=np.float32)
    intercepts = np.asarray(attrs.get("intercepts", []), dtype=np.float32)
    if rows < 1 or not coefficients.size or coefficients.size % rows or intercepts.size not in (0, rows):
        return None
    return coefficients.reshape(rows, -1), intercepts if intercepts.size else np.zeros(rows, np.float32)


def _text(value: object) -> str:
    """A string attribute's value (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _transform(attrs: dict[str, object]) -> str:
    return _text(attrs.get("post_transform", b"NONE"))


def _linear_regressor(node: onnx.NodeProto, known: _Graph) -> Written | None:
    attrs = attributes(node)
    fitted = _coefficients(attrs, int(attrs.get("targets", 1)))
    if _transform(attrs) != "NONE" or fitted is None:
        return None
    return _affine(node, *fitted, node.output[0])


def _linear_classifier(node: onnx.NodeProto, known: _Graph) -> Written | None:
    attrs = attributes(node)
    if len(node.output) < 2 or node.output[0] in known.read:  # the label is read: left to onnxruntime
        return None
    transform = _transform(attrs)
    labels = len(attrs.get("classlabels_ints", []) or attrs.get("classlabels_strings", []))
    rows = len(attrs.get("intercepts", [])) or labels
    fitted = _coefficients(attrs, rows)
    if fitted is None:
        return None
    weights, intercepts = fitted
    p, out = _prefix(node), node.output[1]
    if rows == 1 and labels == 2:
        # onnxruntime's two classes from one row: [1 - t, t], t = sigmoid(s) (LOGISTIC) or s (any
        # other transform). Both are affine in s: sigmoid(-s) and sigmoid(s), or 1 - s and s.
        weights = np.concatenate([-weights, weights])
        logistic = transform == "LOGISTIC"
        intercepts = np.concatenate([-intercepts if logistic else 1 - intercepts, intercepts])
        transform = "LOGISTIC" if logistic else "NONE"
    elif transform not in _TRANSFORMS:  # SOFTMAX_ZERO, PROBIT
        return None
    op = _TRANSFORMS[transform]
    nodes, constants = _affine(node, weights, intercepts, f"{p}/scores" if op else out)
    if op == "Softmax":
        nodes.append(helper.make_node(op, [f"{p}/scores"], [out], name=f"{p}/softmax", axis=1))
    elif op:
        nodes.append(helper.make_node(op, [f"{p}/scores"], [out], name=f"{p}/sigmoid"))
    return nodes, constants


_TRANSFORMS = {"NONE": "", "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}


def _normalizer(node: onnx.NodeProto, known: _Graph) -> Written | None:
    """X divided by its rows' L1 or L2 norm or, for MAX, their largest value: onnxruntime's kernel
    takes the signed maximum, where the onnx reference takes the largest magnitude (scikit-learn's
    one-vs-rest classifiers normalise their probabilities, which are positive, with L1)."""
    norm = _text(attributes(node).get("norm", b"MAX"))
    reduce = {"L1": "ReduceL1", "L2": "ReduceL2", "MAX": "ReduceMax"}.get(norm)
    if reduce is None:
        return None
    p = _prefix(node)
    source, nodes, constants = node.input[0], [], []
    if known.opset >= 18:  # the reductions take their axes as an input from opset 18
        axes = numpy_helper.from_array(np.array([1], dtype=np.int64), f"{p}/axes")
        constants.append(axes)
        nodes.append(
            helper.make_node(reduce, [source, axes.name], [f"{p}/norm"], name=f"{p}/reduce", keepdims=1)
        )
    else:
        nodes.append(
            helper.make_node(reduce, [source], [f"{p}/norm"], name=f"{p}/reduce", axes=[1], keepdims=1)
        )
    nodes.append(helper.make_node("Div", [node.input[0], f"{p}/norm"], [node.output[0]], name=f"{p}/div"))
    return nodes, constants


def _feature_extractor(node: onnx.NodeProto, known: _Graph) -> Written | None:
    """``ArrayFeatureExtractor(X, indices)`` with constant one-dimensional indices: the columns of the
    last axis they name, a Gather (scikit-learn's PolynomialFeatures picks its factors so). Indices
    computed at run time (a label's lookup), or not one list of columns, stay."""
    if len(known.dims.get(node.input[-1], [])) != 1:
        return None
    return [
        helper.make_node(
            "Gather", [node.input[0], node.input[1]], [node.output[0]], name=_prefix(node), axis=-1
        )
    ], []


_REWRITES = {
    "ArrayFeatureExtractor": _feature_extractor,
    "Normalizer": _normalizer,
    "Scaler": _scaler,
    "Imputer": _imputer,
    "LinearRegressor": _linear_regressor,
    "LinearClassifier": _linear_classifier,
}
