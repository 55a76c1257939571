"""Row indices written as the constant ``arange(1)`` (workers/models/row_indices.py): which constants
are read so. The models it serves (GPT-2 from each exporter's defaults) are in
tests/unit/multi_input/test_fixed_batch_inputs.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from workers.models.row_indices import count_rows_in_indices


def _model(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x (B, 4, 3) float, last (B,) int64 -> y (B, 3): the entry of ``last`` in each row, as the
    legacy exporter writes ``x[arange(B), last]``: a gather of the flattened (B*4, 3) rows."""
    graph = oh.make_graph(
        nodes,
        "g",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 3]),
            oh.make_tensor_value_info("last", TensorProto.INT64, ["b"]),
        ],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[nh.from_array(v, k) for k, v in constants.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


ROWS_GATHERED = [
    oh.make_node("Reshape", ["x", "flat"], ["rows"]),
    oh.make_node("Mul", ["arange", "four"], ["starts"]),
    oh.make_node("Add", ["starts", "last"], ["at"]),
    oh.make_node("Gather", ["rows", "at"], ["y"], axis=0),
]
CONSTANTS = {
    "flat": np.array([-1, 3], np.int64),
    "arange": np.array([0], np.int64),
    "four": np.array(4, np.int64),
}


def test_a_constant_arange_of_one_row_becomes_the_rows_count() -> None:
    model = _model(list(ROWS_GATHERED), CONSTANTS)
    x = np.random.default_rng(0).standard_normal((3, 4, 3)).astype(np.float32)
    last = np.array([3, 1, 2], np.int64)
    exported = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "last": last})[0]
    np.testing.assert_array_equal(exported, x[0, last])  # every row reads row 0's entries
    assert count_rows_in_indices(model, "x") == 1
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "last": last})[0]
    np.testing.assert_array_equal(got, x[np.arange(3), last])
    assert "arange" not in {t.name for t in model.graph.initializer}  # nothing reads it any more


def test_a_zero_that_picks_a_size_a_constants_row_or_another_axis_is_left() -> None:
    nodes = [
        oh.make_node("Shape", ["x"], ["dims"]),
        oh.make_node("Gather", ["dims", "arange"], ["rows"], axis=0),  # a size: Shape(x)[0]
        oh.make_node("Gather", ["x", "arange"], ["first"], axis=1),  # the first position of each row
        oh.make_node("Gather", ["table", "arange"], ["row"], axis=0),  # a constant's first row
        oh.make_node("Unsqueeze", ["rows", "arange"], ["y"]),  # axes, not a value
    ]
    model = _model(nodes, {"arange": np.array([0], np.int64), "table": np.ones((2, 3), np.float32)})
    assert count_rows_in_indices(model, "x") == 0
