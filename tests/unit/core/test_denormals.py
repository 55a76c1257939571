"""Subnormal floats are flushed to zero on every compute thread while a job computes, and only then
(workers/denormals.py): on a BERT, attention products with subnormal operands ran 35-150 times
slower; an onnxruntime session made with its default options turned the flushing off again; and
left on after the job, the register changed the arithmetic of everything else in the process
(Hypothesis refused to run). Each case runs a real job in a fresh process: the register is per
thread, and torch's threads copy it when they start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.models import MLP_FEATURES, relu_mlp, to_onnx, to_torchscript
from workers.threads import THREADS_ENV, available_cpus

_JOB = """
import json, sys
import numpy as np, torch
from workers.denormals import flushes_on_every_thread
from workers.jobs import run_job
from xaudit.contract.spec import JobSpec

path, before, fmt = sys.argv[1:4]
if before == "busy":  # torch ran on all its threads before the job
    torch.set_num_threads(2); torch.randn(512, 512) @ torch.randn(512, 512)
inputs = np.random.default_rng(0).standard_normal((2, int(sys.argv[4])))
spec = JobSpec(players="features", device="cpu", methods=("gradient_x_input",))
result = run_job(spec, open(path, "rb").read(), fmt, {"inputs": inputs.astype(np.float32)})
one = torch.full((1,), 1 << 19, dtype=torch.int32).view(torch.float32)  # 2^-130, written as bits
print(json.dumps({
    "in_the_job": json.loads(result.report)["environment"]["denormals"],
    "after_torch": float(one * 2.0**100),  # 2^-30 where this thread reads subnormals again
    "after_python": 5e-324 * 2.0**100 > 0,  # the smallest subnormal double, as Hypothesis checks
}))
"""


def _job(tmp_path: Path, before: str = "idle", fmt: str = "onnx", **env: str) -> dict[str, object]:
    path = tmp_path / f"mlp.{fmt}"
    export = to_onnx if fmt == "onnx" else to_torchscript
    path.write_bytes(export(relu_mlp(0), torch.zeros(2, MLP_FEATURES)))
    threads = str(min(2, available_cpus()[0]))
    done = subprocess.run(
        [sys.executable, "-c", _JOB, str(path), before, fmt, str(MLP_FEATURES)],
        capture_output=True, text=True, timeout=180, check=True,
        env={**os.environ, THREADS_ENV: threads, **env},
    )  # fmt: skip
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_job_flushes_on_every_thread_and_puts_the_register_back(tmp_path: Path, fmt: str) -> None:
    """ONNX: the job's onnxruntime sessions keep the flushing on (with default options they turned
    it off); both: after the job this thread computes with subnormals again."""
    found = _job(tmp_path, fmt=fmt)
    assert found == {"in_the_job": "flushed to zero", "after_torch": 2.0**-30, "after_python": True}


def test_the_operator_can_keep_subnormals(tmp_path: Path) -> None:
    found = _job(tmp_path, XAUDIT_FLUSH_DENORMALS="0")
    assert found["in_the_job"] == "kept (XAUDIT_FLUSH_DENORMALS=0)"


@pytest.mark.skipif(available_cpus()[0] < 2, reason="torch's own threads need two CPUs")
def test_threads_started_before_the_job_are_reported(tmp_path: Path) -> None:
    found = _job(tmp_path, before="busy")
    assert found["in_the_job"] == "flushed on some threads only"


def test_a_cpu_without_the_mode_is_reported_and_sessions_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnxruntime as ort

    from workers import denormals

    monkeypatch.setattr(denormals, "_no_mode", False)  # put back after the test
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: False)  # as torch answers on such a CPU
    with denormals.flushing():
        assert denormals.current() == "kept (this CPU has no flush-to-zero mode)"
        options = denormals.flush_in_onnxruntime(ort.SessionOptions())
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry(denormals.ORT_OPTION)
