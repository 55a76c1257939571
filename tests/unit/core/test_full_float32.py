"""GPUs compute in full float32: TF32 moved the digits audit's scores by up to 1e-2 on an H200, full
float32 by 1e-6 (bench/suite.py, gpu section; docs/science.md 5.4). No GPU here: these check that
each of the three switches is set, which is what the bench measured."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from workers.models.devices import resolve_device
from workers.models.onnx_model import session_providers
from workers.precision import TF32_ENV


@pytest.mark.parametrize("before", [None, "1"])
def test_importing_the_engine_turns_tf32_off_for_nvidia_libraries(before: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != TF32_ENV}
    if before is not None:
        env[TF32_ENV] = before
    done = subprocess.run(
        [sys.executable, "-c", f"import os, workers; print(os.environ['{TF32_ENV}'])"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "0"


def test_a_cuda_device_sets_torch_to_ieee_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mocked: this machine has no GPU. torch's cuDNN default for float32 convolutions is TF32.
    leaves = (torch.backends.cudnn.conv, torch.backends.cudnn.rnn, torch.backends.cuda.matmul)
    previous = [leaf.fp32_precision for leaf in leaves]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    try:
        for device in ("cuda", "auto"):
            for leaf in leaves:  # as a library's legacy allow_tf32 = True leaves them
                leaf.fp32_precision = "tf32"
            assert resolve_device(device).type == "cuda"
            assert [leaf.fp32_precision for leaf in leaves] == ["ieee"] * 3
    finally:
        for leaf, value in zip(leaves, previous, strict=True):
            leaf.fp32_precision = value


def test_onnxruntime_sessions_on_cuda_ask_for_full_float32_and_algorithms_not_chosen_by_timing() -> None:
    providers = session_providers(torch.device("cuda"))
    assert providers[0] == ("CUDAExecutionProvider", {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"})
    assert providers[-1] == "CPUExecutionProvider"
    assert session_providers(torch.device("cpu")) == ["CPUExecutionProvider"]
