"""A gradient or rule method whose torch graph computes other outputs than the model is not applicable
and says so (workers/methods/_conversion_check.py), instead of being judged on another function.
The attack: onnx2torch's own CumSum converter, which reads a missing ``reverse`` as 1, put back."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from onnx2torch.node_converters import cumsum as onnx2torch_cumsum
from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription

from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

_METHODS = ("gradient_x_input", "integrated_gradients", "shapley_value")


def _running_count_model() -> bytes:
    """x (N, 6) -> CumSum over the features (no attributes: ONNX's defaults) -> Gemm -> (N, 3)."""
    r = np.random.default_rng(0)
    inits = [
        oh.make_tensor("axis", TensorProto.INT64, [], [1]),
        nh.from_array(r.standard_normal((3, 6)).astype(np.float32), "w"),
        nh.from_array(r.standard_normal(3).astype(np.float32), "b"),
    ]
    nodes = [
        oh.make_node("CumSum", ["x", "axis"], ["c"]),
        oh.make_node("Gemm", ["c", "w", "b"], ["y"], transB=1),
    ]
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits,
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def _verdicts() -> dict[str, dict]:
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    spec = JobSpec(players="features", methods=_METHODS, device="cpu")
    report = run_audit(prepare(spec, _running_count_model(), "onnx", {"inputs": x})).report
    return {m["name"]: m for m in report["methods"]}


def test_methods_on_a_correct_conversion_are_judged() -> None:
    verdicts = _verdicts()
    assert all(m["verdict"] != "not_applicable" for m in verdicts.values()), verdicts


@pytest.fixture
def onnx2torch_cumsum_bug():
    description = OperationDescription(domain="", operation_type="CumSum", version=14)
    ours = _CONVERTER_REGISTRY[description]
    _CONVERTER_REGISTRY[description] = onnx2torch_cumsum._  # counts from the end without `reverse`
    yield
    _CONVERTER_REGISTRY[description] = ours


@pytest.mark.usefixtures("onnx2torch_cumsum_bug")
def test_a_conversion_that_computes_another_function_makes_the_methods_not_applicable() -> None:
    verdicts = _verdicts()
    for name in ("gradient_x_input", "integrated_gradients"):
        assert verdicts[name]["verdict"] == "not_applicable", (name, verdicts[name])
        assert "computes other outputs than the model" in verdicts[name]["reason"]
    assert verdicts["shapley_value"]["verdict"] != "not_applicable"  # the game runs the model itself
    assert onnx.load_from_string(_running_count_model()).graph.node[0].attribute == []


@pytest.mark.usefixtures("onnx2torch_cumsum_bug")
def test_rows_are_compared_once_per_model_and_the_finding_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """An audit's methods explain the same sub-inputs: the second method with the same rows runs
    neither graph again, and is refused with the same finding under its own name; other rows are
    compared anew."""
    from workers.methods._conversion_check import check_graph_matches_model
    from workers.models import load_model
    from xaudit.contract.errors import NotApplicable

    model = load_model(_running_count_model(), "onnx", "cpu")
    calls: list[int] = []
    predict = model.predict
    monkeypatch.setattr(model, "predict", lambda x: calls.append(len(x)) or predict(x))
    rows = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    reasons, counts = [], []
    for method in ("gradient_x_input", "integrated_gradients"):
        with pytest.raises(NotApplicable) as refused:
            check_graph_matches_model(method, model, rows)
        assert refused.value.method == method
        reasons.append(refused.value.reason)
        counts.append(len(calls))
    # the comparison, and the two nudged evaluations that tell a value from noise (workers/nudge.py;
    # the model's outputs at the rows themselves are the comparison's)
    assert calls == [2] * 3 and counts == [3, 3]
    assert reasons[0] == reasons[1] and "computes other outputs" in reasons[0]
    with pytest.raises(NotApplicable):
        check_graph_matches_model("gradient_x_input", model, rows[2:])
    assert calls == [2] * 6
