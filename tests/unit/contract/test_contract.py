"""The contract layer: one error tree, one job spec checked once, a table of method parameters,
and nothing of the project (nor torch) imported by it."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest

from xaudit.contract import errors
from xaudit.contract.errors import (
    EXIT_ERROR,
    EXIT_UNVERIFIED,
    EXIT_VIOLATION,
    InvalidInput,
    VerificationError,
    XauditError,
    error_for_code,
)
from xaudit.contract.names import ALL_METHODS, VERDICTS
from xaudit.contract.params import METHOD_PARAMETERS, parameter_defaults
from xaudit.contract.spec import JobSpec


def _error_classes() -> list[type[XauditError]]:
    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, XauditError)]


def test_every_error_has_a_status_a_reason_and_an_exit_status() -> None:
    classes = _error_classes()
    assert len(classes) >= 12
    reasons = [c.reason_code for c in classes]
    assert len(set(reasons)) == len(reasons), "reason codes are unique"
    for cls in classes:
        assert hasattr(grpc.StatusCode, cls.code), cls
        assert cls.exit_status in (EXIT_ERROR, EXIT_UNVERIFIED)
    assert EXIT_VIOLATION == 1 and EXIT_ERROR == 2 and EXIT_UNVERIFIED == 3


def test_verification_error_is_told_apart_from_invalid_input() -> None:
    assert not issubclass(VerificationError, InvalidInput)
    assert VerificationError.exit_status == 3 and InvalidInput.exit_status == 2
    # The same status code, but the reason the service sends rebuilds the very class.
    rebuilt = error_for_code("INVALID_ARGUMENT", "bad signature", "VERIFICATION_FAILED")
    assert type(rebuilt) is VerificationError and str(rebuilt) == "bad signature"
    assert type(error_for_code("INVALID_ARGUMENT", "x")) is InvalidInput
    assert type(error_for_code("NOT_FOUND", "x", "NO_SUCH_REASON")).__name__ == "NotFound"


def test_inconclusive_is_a_verdict() -> None:
    assert VERDICTS == ("reliable", "unreliable", "inconclusive", "not_applicable")


def test_default_spec_is_valid_and_device_auto() -> None:
    spec = JobSpec()
    assert spec.device == "auto"
    assert spec.player_spec.kind == "auto" and spec.baseline_spec.kind == "zeros"
    assert spec.target_spec.fixed_class is None
    assert set(spec.tolerances) == {"coverage", "unrelated_allocation", "complete_allocation"}


def test_spec_normalises_once_and_round_trips() -> None:
    spec = JobSpec(
        players=" grid:2x4 ",
        device="CUDA:1",
        methods=("integrated_gradients", "occlusion_patch"),
        method_params={"integrated_gradients": {"steps": 8.0}, "occlusion_patch": {"window": 3}},
        tolerances={"coverage": 0.1},
    )
    assert spec.players == "grid:2x4" and spec.player_spec.rows == 2 and spec.player_spec.cols == 4
    assert spec.device == "cuda:1"
    assert spec.method_params == {"integrated_gradients": {"steps": 8}, "occlusion_patch": {"window": "3x3"}}
    assert spec.tolerances["coverage"] == 0.1 and spec.tolerances["complete_allocation"] == 0.05
    assert spec.params_for("integrated_gradients") == {"steps": 8, "quadrature": "gausslegendre"}
    again = JobSpec.from_json(spec.to_json())
    assert again == spec and again.to_json() == spec.to_json()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"players": "grid:0x2"}, "each side must be between 1 and 1024"),
        ({"players": "windows:many"}, "expected windows:K"),
        ({"players": "tokens:skip=a"}, "expected tokens or tokens:skip=P,P"),
        ({"baseline": "constant:inf"}, "the constant must be a finite number"),
        ({"baseline": "token:-1"}, "expected token:ID"),
        ({"baseline": "blur:-2"}, "sigma must be in (0, 10000]"),
        ({"target": "output:"}, "expected output:NAME"),
        ({"tolerances": {"coverage": True}}, "must be a number"),
        ({"seed": -1}, "seed -1"),
        ({"seed": 2**70}, "must be an integer between 0"),
        ({"audit_order": 2.5}, "audit order 2.5"),
        ({"kind": "train"}, "unknown job kind"),
        (
            {"methods": ("saliency",), "method_params": {"smoothgrad": {"samples": 2}}},
            "not requested: smoothgrad",
        ),
        ({"method_params": {"grad_cam": {"relu": "yes"}}}, "grad_cam.relu='yes': expected true or false"),
        ({"method_params": {"lrp_epsilon": {"epsilon": -1}}}, "expected a number between 0 and 1000"),
        ({"method_params": {"occlusion_patch": {"window": "0x2"}}}, "occlusion_patch.window='0x2'"),
        ({"methods": ("nonsense",)}, "unknown method 'nonsense'"),
    ],
)
def test_spec_refuses_with_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        JobSpec(**fields)  # type: ignore[arg-type]
    assert message in str(info.value) and "\n" not in str(info.value)


def test_parameter_table_is_what_the_methods_use() -> None:
    from workers.methods import get_method

    assert set(METHOD_PARAMETERS) <= set(ALL_METHODS)
    for name in ALL_METHODS:
        method = get_method(name)
        assert dict(method.defaults) == parameter_defaults(name), name
        # Every declared default passes its own bounds.
        JobSpec(methods=(name,), method_params={name: parameter_defaults(name)})


def test_contract_imports_nothing_of_the_project() -> None:
    code = (
        "import sys, json\n"
        "import xaudit.contract, xaudit.contract.spec, xaudit.contract.tensors, xaudit.contract.dsse\n"
        "import xaudit.contract.params, xaudit.contract.subspecs, xaudit.contract.names\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    roots = set(json.loads(out.stdout))
    assert not roots & {"workers", "service", "clients", "torch", "onnxruntime", "celery", "sqlalchemy"}


def test_importing_the_contract_package_is_light() -> None:
    code = "import sys, xaudit.contract; print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'google', 'grpc', 'cryptography'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
