"""Models from torch's legacy and dynamo exporters at opsets 17-21 load, run and differentiate alike."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from tests.models import relu_cnn, to_onnx, to_torchscript
from workers.models import load_model
from xaudit.contract.errors import InvalidInput, InvalidModel

X = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(5))
MODEL = relu_cnn(7)
EXPECTED = MODEL(X).detach().numpy()


def _dynamo(opset: int) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            MODEL, (X,), buffer, dynamo=True, opset_version=opset, input_names=["input"],
            dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False,
        )  # fmt: skip
    return buffer.getvalue()


@pytest.mark.parametrize("opset", [17, 18, 19, 20, 21])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_exports_load_and_agree(exporter: str, opset: int) -> None:
    data = to_onnx(MODEL, X, opset=opset) if exporter == "legacy" else _dynamo(opset)
    model = load_model(data, "onnx", "cpu")
    np.testing.assert_allclose(model.predict(X.numpy()), EXPECTED, atol=1e-5)
    graph = model.torch_differentiable()
    np.testing.assert_allclose(graph(X).detach().numpy(), EXPECTED, atol=1e-5)
    x = X.clone().requires_grad_(True)
    graph(x)[:, 0].sum().backward()
    reference = X.clone().requires_grad_(True)
    MODEL(reference)[:, 0].sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), atol=1e-5)
    assert model.execution_providers == ["CPUExecutionProvider"]


def test_torchscript_matches_onnx_and_converts_for_hooks() -> None:
    onnx_model = load_model(to_onnx(MODEL, X), "onnx", "cpu")
    script = load_model(to_torchscript(MODEL, X), None, "cpu")
    assert script.info.format == "torchscript"
    script.check_sample(X.numpy())
    np.testing.assert_allclose(script.predict(X.numpy()), onnx_model.predict(X.numpy()), atol=1e-5)
    hookable = script.torch_hookable("deeplift_rescale")
    assert any(isinstance(m, torch.nn.ReLU) for m in hookable.modules())
    np.testing.assert_allclose(hookable(X).detach().numpy(), EXPECTED, atol=1e-5)


def test_chunked_prediction_is_bounded_and_equal() -> None:
    model = load_model(to_onnx(MODEL, X), "onnx", "cpu", batch_size=2)
    many = np.repeat(X.numpy(), 5, axis=0)  # 15 rows in chunks of 2
    np.testing.assert_allclose(model.predict(many), np.repeat(EXPECTED, 5, axis=0), atol=1e-5)


def test_refusals() -> None:
    with pytest.raises(InvalidModel, match="empty"):
        load_model(b"", None, "cpu")
    with pytest.raises(InvalidModel, match="TorchScript"):
        load_model(b"PK\x03\x04 not really a zip", None, "cpu")
    with pytest.raises(InvalidInput, match="unknown model format"):
        load_model(b"abc", "keras", "cpu")
    with pytest.raises(InvalidInput, match="unknown device"):
        load_model(to_onnx(MODEL, X), "onnx", "tpu")


def test_cuda_request_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from xaudit.contract.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match="CUDA is not available"):
        load_model(to_onnx(MODEL, X), "onnx", "cuda")


def test_an_onnx_model_lets_go_of_its_parsed_graph_once_torch_has_it() -> None:
    """The parsed ONNX model (weights and all) is only the source of the torch graph: held beside it
    for the model's life, VGG's cost another 0.5 GB."""
    x = torch.randn(2, 1, 8, 8)
    model = load_model(to_onnx(relu_cnn(seed=3), x[:1]), "onnx", "cpu")
    assert model._proto is not None  # type: ignore[attr-defined]
    graph = model.torch_differentiable()
    assert model._proto is None  # type: ignore[attr-defined]
    assert model.torch_hookable("gradient_x_input") is graph
    np.testing.assert_allclose(graph(x).detach().numpy(), model.predict(x.numpy()), rtol=1e-5, atol=1e-6)
