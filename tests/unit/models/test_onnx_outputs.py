"""Which output is explained (workers/models/onnx_outputs.py) on hand-written graphs: an undeclared
type may be scores, an integer output never is, and a model with no scores says so."""

from __future__ import annotations

import pytest
from onnx import TensorProto
from onnx import helper as oh

from workers.models.onnx_outputs import explained_output, needs_output_choice
from xaudit.contract.errors import InvalidInput, InvalidModel


def _outputs(*types: int):
    nodes = [oh.make_node("Identity", ["x"], [f"y{i}"]) for i in range(len(types))]
    outputs = [oh.make_tensor_value_info(f"y{i}", t, ["N", 2]) for i, t in enumerate(types)]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])], outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_an_undeclared_type_may_be_scores_and_a_label_never_is() -> None:
    single = _outputs(TensorProto.UNDEFINED)
    assert not needs_output_choice(single)
    assert explained_output(single) == "y0"
    labelled = _outputs(TensorProto.INT64, TensorProto.UNDEFINED, TensorProto.FLOAT)
    assert needs_output_choice(labelled)
    assert explained_output(labelled) == "y1"
    assert explained_output(labelled, "y2") == "y2"
    with pytest.raises(InvalidInput, match=r"'y0' \(int64\) holds no scores.*'y1', 'y2'"):
        explained_output(labelled, "y0")
    with pytest.raises(InvalidInput, match="has no output 'z'"):
        explained_output(labelled, "z")


def test_a_model_without_scores_says_what_its_outputs_are() -> None:
    with pytest.raises(
        InvalidModel, match=r"no output with floating-point scores.*'y0' \(int64\), 'y1' \(string\)"
    ):
        explained_output(_outputs(TensorProto.INT64, TensorProto.STRING))


def test_only_the_explained_output_and_what_it_reads_stay_subgraphs_included() -> None:
    """An If's branch reads ``scale`` from the outer graph: its producer stays; the label's ArgMax goes."""
    from workers.models.onnx_outputs import only_output

    branch = oh.make_graph(
        [oh.make_node("Mul", ["x", "scale"], ["b"])], "branch", [],
        [oh.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 2])],
    )  # fmt: skip
    nodes = [
        oh.make_node("Abs", ["x"], ["scale"]),
        oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        oh.make_node("Greater", ["total", "zero"], ["positive"]),
        oh.make_node("If", ["positive"], ["y"], then_branch=branch, else_branch=branch),
        oh.make_node("ArgMax", ["y"], ["label"], axis=1),
    ]
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [oh.make_tensor_value_info("label", TensorProto.INT64, ["N"]), oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [oh.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 12)])
    only_output(model, explained_output(model))
    assert [n.op_type for n in model.graph.node] == ["Abs", "ReduceSum", "Greater", "If"]
    assert [o.name for o in model.graph.output] == ["y"]
