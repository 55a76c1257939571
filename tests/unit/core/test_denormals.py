"""Subnormal floats are flushed to zero on every compute thread (workers/denormals.py): on a BERT,
attention products with subnormal operands ran 35-150 times slower, and an onnxruntime session made
with its default options turned the flushing off again. Each case runs in a fresh process, as a job
does: the register is per thread, and torch's threads copy it when they start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.models import relu_mlp, to_onnx, to_torchscript
from workers.threads import THREADS_ENV, available_cpus

_JOB = """
import json, sys
import numpy as np, torch
from workers.denormals import current, flushes_on_every_thread
from workers.models import load_model

if sys.argv[2] == "busy":  # torch ran on all its threads before the first model
    torch.set_num_threads(2); torch.randn(512, 512) @ torch.randn(512, 512)
data, fmt = open(sys.argv[1], "rb").read(), sys.argv[3]
model = load_model(data, fmt, "cpu")
model.predict(np.zeros((4, 6), np.float32))
load_model(data, fmt, "cpu").predict(np.zeros((2, 6), np.float32))  # an ONNX model: a second session
torch.randn(256, 256) @ torch.randn(256, 256)  # torch's threads at work, as in a method's pass
subnormal = torch.full((1 << 17,), 1 << 19, dtype=torch.int32).view(torch.float32)  # 2^-130, as bits
found = {
    "every_thread": flushes_on_every_thread(),
    "product": float((subnormal * 2.0**100).abs().max()),
    "threads": torch.get_num_threads(),
}
print(json.dumps({**found, "state": current()}))  # current() last: it would flush where none did
"""


def _job(tmp_path: Path, before: str = "idle", fmt: str = "onnx", **env: str) -> dict[str, object]:
    path = tmp_path / f"mlp.{fmt}"
    export = to_onnx if fmt == "onnx" else to_torchscript
    path.write_bytes(export(relu_mlp(0), torch.zeros(2, 6)))
    threads = str(min(2, available_cpus()[0]))
    done = subprocess.run(
        [sys.executable, "-c", _JOB, str(path), before, fmt],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, THREADS_ENV: threads, **env},
    )  # fmt: skip
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_every_thread_flushes_after_the_models_sessions(tmp_path: Path, fmt: str) -> None:
    """ONNX: onnxruntime's sessions keep it (with default options they turned it off); TorchScript:
    load_model sets it before torch's threads start."""
    found = _job(tmp_path, fmt=fmt)
    assert found == {
        "state": "flushed to zero", "every_thread": True, "product": 0.0, "threads": found["threads"],
    }  # fmt: skip


def test_the_operator_can_keep_subnormals(tmp_path: Path) -> None:
    found = _job(tmp_path, XAUDIT_FLUSH_DENORMALS="0")
    assert found["state"] == "kept (XAUDIT_FLUSH_DENORMALS=0)"
    assert found["every_thread"] is False and found["product"] == 2.0**-30


@pytest.mark.skipif(available_cpus()[0] < 2, reason="torch's own threads need two CPUs")
def test_threads_started_before_the_first_model_are_reported(tmp_path: Path) -> None:
    found = _job(tmp_path, before="busy")
    assert found["threads"] == 2
    assert found["state"] == "flushed on some threads only" and found["every_thread"] is False
