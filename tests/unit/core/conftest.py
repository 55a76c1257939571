from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models import to_onnx, to_torchscript
from tests.unit.core.analytic import CubicTerm, Polynomial
from workers.prepare import Prepared, prepare
from xaudit.contract.spec import JobSpec

POLY_X = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 1.5]], dtype=np.float32)


@pytest.fixture(scope="session", params=["onnx", "torchscript"])
def poly_model(request: pytest.FixtureRequest) -> bytes:
    example = torch.from_numpy(POLY_X)
    return (
        to_onnx(Polynomial(), example) if request.param == "onnx" else to_torchscript(Polynomial(), example)
    )


@pytest.fixture(scope="session")
def cubic_onnx() -> bytes:
    return to_onnx(CubicTerm(), torch.ones(2, 3))


def prepared(model: bytes, inputs: np.ndarray, **spec: object) -> Prepared:
    spec.setdefault("players", "features")
    spec.setdefault("device", "cpu")
    return prepare(JobSpec(**spec), model, None, {"inputs": inputs})  # type: ignore[arg-type]
