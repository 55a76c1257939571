"""The audit's verdicts on analytic and small ReLU models with biases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.models import relu_cnn, relu_mlp, to_onnx, to_torchscript
from tests.unit.core.analytic import Polynomial
from tests.unit.core.conftest import POLY_X, prepared
from workers.audit import run_audit

METHODS = (
    "gradient_x_input",
    "occlusion_1",
    "occlusion_patch",
    "integrated_gradients",
    "shapley_value",
    "deeplift_rescale",
)


def _failing(report: dict[str, Any]) -> dict[str, set[str]]:
    return {
        m["name"]: {c for c, v in m["criteria"].items() if not v["passed"]}
        for m in report["methods"]
        if m["verdict"] != "not_applicable"
    }


def _relu_cases() -> list[tuple[str, bytes, np.ndarray, str]]:
    gen = torch.Generator().manual_seed(1)
    x_mlp = torch.randn(3, 6, generator=gen)
    x_cnn = torch.randn(2, 1, 8, 8, generator=gen)
    return [
        ("mlp-onnx", to_onnx(relu_mlp(0), x_mlp), x_mlp.numpy(), "features"),
        ("mlp-torchscript", to_torchscript(relu_mlp(0), x_mlp), x_mlp.numpy(), "features"),
        ("cnn-onnx", to_onnx(relu_cnn(0), x_cnn), x_cnn.numpy(), "grid:2x4"),
    ]


@pytest.fixture(scope="module")
def relu_reports() -> dict[str, dict[str, Any]]:
    return {
        name: run_audit(prepared(model, x, players=players, methods=METHODS)).report
        for name, model, x, players in _relu_cases()
    }


@pytest.mark.parametrize("case", ["mlp-onnx", "mlp-torchscript", "cnn-onnx"])
def test_relu_nets_separate_the_methods(relu_reports: dict[str, dict[str, Any]], case: str) -> None:
    failing = _failing(relu_reports[case])
    for exact in ("integrated_gradients", "deeplift_rescale", "shapley_value"):
        assert failing[exact] == set(), (exact, failing[exact])
    assert failing["occlusion_1"] == {"complete_allocation"}
    assert failing["occlusion_patch"] == {"unrelated_allocation", "complete_allocation"}
    assert failing["gradient_x_input"], "gradient x input must fail on a nonlinear model with biases"


def test_onnx_and_torchscript_give_the_same_verdicts(relu_reports: dict[str, dict[str, Any]]) -> None:
    onnx = {m["name"]: m["verdict"] for m in relu_reports["mlp-onnx"]["methods"]}
    script = {m["name"]: m["verdict"] for m in relu_reports["mlp-torchscript"]["methods"]}
    assert onnx == script


def test_polynomial_verdicts() -> None:
    model = to_onnx(Polynomial(), torch.from_numpy(POLY_X))
    report = run_audit(prepared(model, POLY_X, methods=METHODS)).report
    failing = _failing(report)
    assert failing["integrated_gradients"] == set()
    assert failing["shapley_value"] == set()
    assert failing["occlusion_1"] == {"complete_allocation"}
    assert failing["occlusion_patch"] == {"unrelated_allocation", "complete_allocation"}
    # Occlusion-1 hands out |S| times each effect: excess over 3 sets of orders 1, 2, 3 is known exactly.
    occlusion = next(m for m in report["methods"] if m["name"] == "occlusion_1")
    effects = [(2 * x[0], 3 * x[0] * x[1], -x[1] * x[2] * x[3]) for x in POLY_X]
    excess = sum(abs(e2) * 1 + abs(e3) * 2 for _, e2, e3 in effects)
    mass = sum(abs(e1) + abs(e2) + abs(e3) for e1, e2, e3 in effects)
    assert occlusion["criteria"]["complete_allocation"]["score"] == pytest.approx(excess / mass, rel=1e-5)


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in ("created", "seconds")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_same_seed_same_report() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, generator=gen)
    model = to_onnx(relu_mlp(1), x)
    background = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    methods = ("expected_gradients", "smoothgrad", "occlusion_1")

    def audit(seed: int) -> dict[str, Any]:
        from workers.prepare import prepare
        from xaudit.contract.spec import JobSpec

        spec = JobSpec(players="features", device="cpu", methods=methods, seed=seed)
        return run_audit(prepare(spec, model, None, {"inputs": x.numpy(), "background": background})).report

    first, second, other = audit(7), audit(7), audit(8)
    assert _without_timings(first) == _without_timings(second)
    assert _without_timings(first) != _without_timings(other)  # the seed matters for stochastic methods


@pytest.mark.parametrize("case", ["mlp-onnx", "cnn-onnx"])
def test_reports_follow_the_json_schema(relu_reports: dict[str, dict[str, Any]], case: str) -> None:
    import jsonschema

    from workers.audit.schema import validate_report

    validate_report(relu_reports[case])
    broken = dict(relu_reports[case], methods=[dict(relu_reports[case]["methods"][0], verdict="maybe")])
    with pytest.raises(jsonschema.ValidationError):
        validate_report(broken)


def test_report_records_what_it_needs(relu_reports: dict[str, dict[str, Any]]) -> None:
    report = relu_reports["cnn-onnx"]
    assert report["schema"] == "xaudit.report/v2"
    assert report["inputs"]["count"] == 2 and report["inputs"]["shape"] == [2, 1, 8, 8]
    assert sorted(report["summary"]["reliable"]) == [
        "deeplift_rescale",
        "integrated_gradients",
        "shapley_value",
    ]
    for method in report["methods"]:
        assert method["seconds"] > 0
        assert "not used for the verdict" in method["paper_context"]["label"]
        for criterion in method["criteria"].values():
            assert criterion["passed"] == (criterion["score"] <= criterion["tolerance"])
    occlusion = next(m for m in report["methods"] if m["name"] == "occlusion_1")
    assert occlusion["evidence"] and "complete_allocation" in occlusion["evidence"][0]["breaks"]
    assert occlusion["evidence"][0]["ratio"] == pytest.approx(occlusion["evidence"][0]["order"], rel=1e-4)


def test_cancellation_is_checked_while_a_method_runs() -> None:
    from workers.jobs import run_job
    from xaudit.contract.errors import Cancelled
    from xaudit.contract.spec import JobSpec

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 1, 8, 8, generator=gen)
    model = to_onnx(relu_cnn(0), x)
    calls: list[str] = []
    checks_inside: list[int] = []

    def stop_inside_integrated_gradients() -> bool:
        if calls and calls[-1] == "auditing integrated_gradients":
            checks_inside.append(1)
            return len(checks_inside) > 1  # the first check starts the method; the second is inside it
        return False

    def progress(fraction: float, message: str) -> None:
        calls.append(message)

    # The check after the method's first batch of sub-inputs stops it before its half-resolution run.
    spec = JobSpec(players="grid:4x4", audit_order=2, device="cpu", methods=("integrated_gradients",))
    with pytest.raises(Cancelled):
        run_job(spec, model, "onnx", {"inputs": x.numpy()}, progress, stop_inside_integrated_gradients)
    assert calls[-1] == "auditing integrated_gradients" and len(checks_inside) == 2


def test_a_background_equal_to_the_input_gives_no_vacuous_verdict() -> None:
    """Expected Gradients and DeepSHAP with the input as their only background play a constant
    game: every criterion is 0 of 0. They are inconclusive and say why; the baseline methods,
    judged on the zero baseline's game, are not affected."""
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    x = torch.randn(1, 6, generator=torch.Generator().manual_seed(4))
    model = to_onnx(relu_mlp(1), x)
    methods = ("expected_gradients", "deepshap", "integrated_gradients")
    spec = JobSpec(players="features", device="cpu", methods=methods)
    tensors = {"inputs": x.numpy(), "background": x.numpy()}
    report = run_audit(prepare(spec, model, None, tensors)).report
    verdicts = {m["name"]: (m["verdict"], m["reason"]) for m in report["methods"]}
    for name in ("expected_gradients", "deepshap"):
        assert verdicts[name][0] == "inconclusive" and "no effect to allocate" in verdicts[name][1], verdicts
    assert verdicts["integrated_gradients"][0] == "reliable", verdicts


def test_the_report_and_inspect_name_the_deeplift_implementation_that_ran() -> None:
    """xaudit's Rescale pass on a ReLU network; on a Sigmoid network Captum's DeepLift, named with
    the operator that sent it there: the verdict judges that implementation."""
    from tests.models import sigmoid_mlp
    from workers.inspect_model import inspect_model
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    spec = JobSpec(players="features", device="cpu", methods=("deeplift_rescale", "shapley_value"))
    for module, expected in ((relu_mlp(2), "xaudit's Rescale pass"), (sigmoid_mlp(2), "Captum's DeepLift")):
        x = torch.randn(
            2, 6 if expected.startswith("xaudit") else 4, generator=torch.Generator().manual_seed(5)
        )
        model = to_onnx(module, x)
        report = run_audit(prepare(spec, model, None, {"inputs": x.numpy()})).report
        entries = {m["name"]: m for m in report["methods"]}
        assert entries["deeplift_rescale"]["implementation"].startswith(expected)
        assert "implementation" not in entries["shapley_value"]
        said = inspect_model(model, "model.onnx").methods["deeplift_rescale"]
        assert expected in said, said
        if expected.startswith("Captum"):
            assert "Sigmoid" in entries["deeplift_rescale"]["implementation"]
        from clients._report import verdict_table

        assert f"deeplift_rescale: ran {expected}" in verdict_table(report)  # under the CLI's table
