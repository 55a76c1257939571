"""The engine does not import torchvision (seconds at start-up) through onnx2torch or zennit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from tests.models import relu_cnn, to_onnx


def test_engine_imports_no_torchvision() -> None:
    code = (
        "import sys\n"
        "import workers.audit.runner, workers.methods.lrp, workers.methods.grad_cam, workers.methods.deeplift\n"
        "import workers.models.onnx_to_torch\n"
        "assert not [m for m in sys.modules if m.startswith('torchvision')], 'torchvision imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_converted_graph_still_matches_the_model() -> None:
    from workers.models import load_model

    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    module = relu_cnn(0)
    model = load_model(to_onnx(module, x), "onnx", "cpu")
    graph = model.torch_differentiable()
    np.testing.assert_allclose(graph(x).detach().numpy(), module(x).detach().numpy(), atol=1e-5)
