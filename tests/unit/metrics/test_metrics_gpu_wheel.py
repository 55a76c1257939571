"""onnxruntime-gpu's own wheel (the ``gpu`` extra's pin) on this machine, which has no GPU: a session
that asks for CUDA gets the CPU, computes what the CPU wheel computes, and the worker says why and
counts it. The wheel never sits in the test environment beside the CPU one: .ci/run unpacks it into
a folder of its own and names it in XAUDIT_TEST_ORT_GPU, and a fresh process puts it first on its
path. The other fallback test (test_metrics_worker.py) fakes the session; this one does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models import MLP_FEATURES, relu_mlp, to_onnx
from workers.models.onnx_model import OnnxModel

ROOT = Path(__file__).resolve().parents[3]
SITE_ENV = "XAUDIT_TEST_ORT_GPU"

_CHILD = """
import json, logging, sys
import numpy as np, onnxruntime, torch
from prometheus_client import CollectorRegistry
from workers import metrics as wm
from workers.models.onnx_model import _session

records = []
logging.getLogger("workers.models.onnx_model").addHandler(logging.Handler())
logging.getLogger("workers.models.onnx_model").handlers[-1].emit = records.append
m = wm.WorkerMetrics(CollectorRegistry())
wm.activate(m)
# The session a worker's OnnxModel opens on a GPU (torch, which sees no GPU here, is not asked).
session = _session(open(sys.argv[1], "rb").read(), torch.device("cuda"))
x = np.load(sys.argv[2])
out = session.run(None, {session.get_inputs()[0].name: x})[0]
sample = m.registry.get_sample_value
print(json.dumps({
    "module": onnxruntime.__file__,
    "version": onnxruntime.__version__,
    "available": onnxruntime.get_available_providers(),
    "providers": session.get_providers(),
    "warnings": [r.getMessage() for r in records],
    "fallbacks": sample("xaudit_cpu_fallbacks_total", {"component": "onnxruntime"}),
    "out": out.tolist(),
}))
"""


def _gpu_site() -> Path:
    site = os.environ.get(SITE_ENV)
    if not site:
        pytest.skip(f"{SITE_ENV} is unset: .ci/run unpacks onnxruntime-gpu's wheel and sets it")
    path = Path(site)
    assert (path / "onnxruntime").is_dir(), f"{SITE_ENV}={site} holds no onnxruntime package"
    return path


def _pinned() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [dep for dep in extras["gpu"] if dep.startswith("onnxruntime-gpu==")]
    return pin.split("==")[1]


def test_the_gpu_wheel_without_a_gpu_falls_back_to_the_cpu_and_says_why(tmp_path: Path) -> None:
    site = _gpu_site()
    data = to_onnx(relu_mlp(), torch.randn(1, MLP_FEATURES))
    x = np.random.default_rng(0).standard_normal((5, MLP_FEATURES)).astype(np.float32)
    (tmp_path / "model.onnx").write_bytes(data)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "model.onnx"), str(tmp_path / "x.npy")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert Path(got["module"]).is_relative_to(site) and got["version"] == _pinned()
    assert "CUDAExecutionProvider" in got["available"]  # the CUDA build ...
    assert got["providers"] == ["CPUExecutionProvider"]  # ... whose provider cannot load here
    [warning] = got["warnings"]
    assert f"onnxruntime-gpu {_pinned()}'s CUDA provider did not load" in warning
    assert "no NVIDIA driver library (libcuda.so.1)" in warning
    assert "install xaudit[gpu]" not in warning  # it is installed: that advice would mislead
    assert got["fallbacks"] == 1
    # onnxruntime's own error, which names the library that failed, stays on the process's stderr.
    assert "libcuda.so.1" in done.stderr
    expected = OnnxModel(data, "sha", torch.device("cpu")).predict(x)
    np.testing.assert_allclose(np.asarray(got["out"], dtype=np.float32), expected, rtol=1e-5, atol=1e-6)
