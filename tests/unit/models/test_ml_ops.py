"""ONNX-ML's linear operators written as ONNX's own for the methods' torch graph
(workers/models/ml_ops.py): each rewrite is checked against onnxruntime running the ONNX-ML
operator, and what is not written stays as it is and is named."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

from workers.models.ml_ops import ml_ops_as_onnx
from workers.models.onnx_to_torch import onnx_to_torch
from xaudit.contract.errors import InvalidModel

_FEATURES = 3


def _model(
    node: onnx.NodeProto, outputs: list[onnx.ValueInfoProto], ml_only: bool = False
) -> onnx.ModelProto:
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", _FEATURES])], outputs
    )
    opsets = [oh.make_opsetid("ai.onnx.ml", 1)] + ([] if ml_only else [oh.make_opsetid("", 13)])
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _scores(op: str, transform: str, rows: int, labels: int) -> onnx.ModelProto:
    """``op`` (LinearClassifier) whose second output, the scores, is the model's only output."""
    r = np.random.default_rng(rows * 10 + labels)
    node = oh.make_node(
        op, ["x"], ["label", "scores"], domain="ai.onnx.ml", name="clf",
        coefficients=r.standard_normal(rows * _FEATURES).tolist(), intercepts=r.standard_normal(rows).tolist(),
        classlabels_ints=list(range(labels)), post_transform=transform,
    )  # fmt: skip
    return _model(node, [oh.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", None])])


def _rows() -> np.ndarray:
    x = np.random.default_rng(0).normal(scale=2.0, size=(16, _FEATURES)).astype(np.float32)
    x[3, 1] = 0.5  # the imputer's replaced value
    return x


def _written_like_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """The rewritten copy, after checking it (run by onnxruntime and converted to torch) against
    onnxruntime running the ONNX-ML operator."""
    x = _rows()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert ml_ops_as_onnx(copy) == 1
    assert not [n.op_type for n in copy.graph.node if n.domain == "ai.onnx.ml"]
    onnx.checker.check_model(copy)
    rewritten = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(rewritten[-1], want[-1], rtol=1e-5, atol=1e-6)
    got = onnx_to_torch(model)(torch.from_numpy(x))
    np.testing.assert_allclose(got.detach().numpy(), want[-1], rtol=1e-5, atol=1e-6)
    return copy


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_binary_classifier_scores_are_onnxruntimes_two_columns(transform: str) -> None:
    """One coefficient row, two classes: onnxruntime gives [1 - t, t] (t = sigmoid(s) for LOGISTIC, s
    for every other transform, softmax included), which the onnx reference implementation does not."""
    copy = _written_like_onnxruntime(_scores("LinearClassifier", transform, rows=1, labels=2))
    ops = [n.op_type for n in copy.graph.node]
    assert ops == (["Gemm", "Sigmoid"] if transform == "LOGISTIC" else ["Gemm"])  # one affine layer


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_multiclass_classifier_scores_match_onnxruntime(transform: str) -> None:
    _written_like_onnxruntime(_scores("LinearClassifier", transform, rows=3, labels=3))


def test_scaler_is_one_affine_layer() -> None:
    node = oh.make_node(
        "Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=[0.5, -1.0, 2.0], scale=[2.0, 0.25, -3.0]
    )
    copy = _written_like_onnxruntime(
        _model(node, [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    )
    assert [n.op_type for n in copy.graph.node] == ["Gemm"]


@pytest.mark.parametrize("replaced", [0.5, float("nan")])
def test_imputer_replaces_what_onnxruntime_replaces(replaced: float) -> None:
    """A number is replaced where it occurs (row 3 holds it); NaN never occurs in what the methods see."""
    node = oh.make_node(
        "Imputer", ["x"], ["y"], domain="ai.onnx.ml",
        imputed_value_floats=[7.0, 8.0, 9.0], replaced_value_float=replaced,
    )  # fmt: skip
    _written_like_onnxruntime(_model(node, [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])]))


def test_regressor_with_several_targets_in_a_model_that_imports_only_onnx_ml() -> None:
    r = np.random.default_rng(2)
    node = oh.make_node(
        "LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml",
        coefficients=r.standard_normal(2 * _FEATURES).tolist(), intercepts=[0.5, -0.5], targets=2,
    )  # fmt: skip
    model = _model(node, [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], ml_only=True)
    copy = _written_like_onnxruntime(model)
    assert any(o.domain == "" for o in copy.opset_import)  # Gemm needs ONNX's own opset


def test_what_is_not_written_stays_and_is_named() -> None:
    """SOFTMAX_ZERO over several classes (its zeros differ from a softmax), and a classifier whose
    label is the model's output too, stay ONNX-ML operators: the conversion names them."""
    model = _scores("LinearClassifier", "SOFTMAX_ZERO", rows=3, labels=3)
    assert ml_ops_as_onnx(model) == 0
    labelled = _scores("LinearClassifier", "LOGISTIC", rows=3, labels=3)
    labelled.graph.output.append(oh.make_tensor_value_info("label", TensorProto.INT64, ["N"]))
    assert ml_ops_as_onnx(labelled) == 0
    with pytest.raises(InvalidModel, match=r"ai\.onnx\.ml\.LinearClassifier"):
        onnx_to_torch(model)


@pytest.mark.parametrize("opset", [13, 18])  # the reductions' axes: an attribute, then an input
@pytest.mark.parametrize("norm", ["L1", "L2", "MAX"])
def test_normalizer_divides_as_onnxruntime_does(norm: str, opset: int) -> None:
    node = oh.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm=norm)
    model = _model(node, [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model.opset_import[1].version = opset
    _written_like_onnxruntime(model)


@pytest.mark.parametrize("columns", [[2], [0, 2], [1, 1]])
def test_feature_extractor_with_constant_columns_gathers_them(columns: list[int]) -> None:
    """scikit-learn's PolynomialFeatures picks each product's factors so."""
    node = oh.make_node("ArrayFeatureExtractor", ["x", "columns"], ["y"], domain="ai.onnx.ml")
    model = _model(node, [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", len(columns)])])
    model.graph.initializer.append(oh.make_tensor("columns", TensorProto.INT64, [len(columns)], columns))
    _written_like_onnxruntime(model)
