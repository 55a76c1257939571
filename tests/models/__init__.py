"""Small torch models for tests, and their ONNX / TorchScript exports.

Every builder is seeded and returns an ``nn.Module`` in eval mode with float32 parameters; biases are
non-zero on purpose (rules that ignore biases must show it). Exports take one example batch.

The model zoo (third-party-style exports of torchvision and custom models, audited end to end) is
the subpackage ``tests.models.zoo``.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
from torch import nn

__all__ = [
    "CNN_SHAPE",
    "MLP_FEATURES",
    "maxpool_cnn",
    "relu_cnn",
    "relu_mlp",
    "residual_mlp",
    "sigmoid_mlp",
    "to_onnx",
    "to_torchscript",
]

MLP_FEATURES = 6  # input features of relu_mlp
CNN_SHAPE = (1, 8, 8)  # sample shape of relu_cnn and maxpool_cnn


def _randomise(module: nn.Module, seed: int, bias_scale: float = 0.3) -> nn.Module:
    """Deterministic weights (independent of torch's global RNG) with clearly non-zero biases."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(bias_scale * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
    return module.eval().float()


def relu_mlp(
    seed: int = 0, features: int = MLP_FEATURES, hidden: tuple[int, ...] = (8, 5), classes: int = 3
) -> nn.Module:
    """Linear-ReLU stack with biases: features -> hidden... -> classes."""
    layers: list[nn.Module] = []
    width = features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return _randomise(nn.Sequential(*layers), seed)


def relu_cnn(seed: int = 0, classes: int = 3) -> nn.Module:
    """Conv-ReLU-Conv-ReLU-Flatten-Linear-ReLU-Linear on 1x8x8 inputs, biases everywhere, no pooling."""
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(3, 4, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 10),
        nn.ReLU(),
        nn.Linear(10, classes),
    )
    return _randomise(model, seed)


def maxpool_cnn(seed: int = 0, classes: int = 3) -> nn.Module:
    """Conv-ReLU-MaxPool-Conv-ReLU-Flatten-Linear on 1x8x8 inputs."""
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, classes),
    )
    return _randomise(model, seed)


class _Sigmoid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sigmoid(self.a(x)))


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.a(x))


def sigmoid_mlp(seed: int = 0) -> nn.Module:
    """Linear-Sigmoid-Linear on 4 features: an operator that no LRP or DeepLIFT plan covers."""
    return _randomise(_Sigmoid(), seed)


def residual_mlp(seed: int = 0) -> nn.Module:
    """x + relu(Linear(x)) on 4 features: a residual add as the output (RevealCancel refuses any sum,
    LRP one after the last layer)."""
    return _randomise(_Residual(), seed)


def to_onnx(module: nn.Module, example: torch.Tensor, opset: int = 17, dynamo: bool = False) -> bytes:
    """ONNX bytes with a dynamic batch axis (input ``input``, output ``output``)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=dynamo,
            opset_version=opset,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        )
    return buffer.getvalue()


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The first output of ``model`` on ``feeds``, from onnxruntime on the CPU."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def to_torchscript(module: nn.Module, example: torch.Tensor) -> bytes:
    """TorchScript bytes (torch.jit.trace + torch.jit.save)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, example)
        torch.jit.save(traced, buffer)
    return buffer.getvalue()
