"""The sandbox's wire format and its reasons, without starting a process."""

from __future__ import annotations

import io
import os
import signal

import numpy as np
import pytest

from workers.jobs import JobResult
from workers.sandbox import SandboxLimits, _child_env, _death_reason
from workers.sandbox_wire import decode_result, encode_result
from xaudit.contract.errors import InvalidModel, ResourceExhausted


def test_result_round_trip() -> None:
    result = JobResult(
        "audit",
        b'{"report": 1}',
        {"gradient_x_input": np.arange(6, dtype=np.float32).reshape(2, 3)},
        {"grad_cam": "no conv layer"},
        np.array([0.5, 0.25], np.float32),
        np.array([1, 2], np.int64),
    )
    back = decode_result(encode_result(result))
    assert back.kind == "audit" and back.report == result.report
    assert back.not_applicable == result.not_applicable
    np.testing.assert_array_equal(
        back.attributions["gradient_x_input"], result.attributions["gradient_x_input"]
    )
    np.testing.assert_array_equal(back.target_classes, result.target_classes)


def test_a_child_cannot_send_pickles() -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        __meta__=np.frombuffer(b'{"kind": "audit"}', np.uint8),
        **{"attr/evil": np.array([object()], dtype=object)},
    )
    with pytest.raises(ValueError, match="allow_pickle"):  # the worker turns this into a failed job
        decode_result(buffer.getvalue())


def test_death_reasons() -> None:
    limits = SandboxLimits(cpu_seconds=7)
    assert isinstance(_death_reason(-signal.SIGXCPU, limits), ResourceExhausted)
    assert "7 s" in str(_death_reason(-signal.SIGXCPU, limits))
    assert isinstance(_death_reason(-signal.SIGKILL, limits), ResourceExhausted)
    crashed = _death_reason(-signal.SIGSEGV, limits)
    assert isinstance(crashed, InvalidModel) and "SIGSEGV" in str(crashed)
    assert "status 3" in str(_death_reason(3, limits))


def test_only_compute_settings_reach_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XAUDIT_WORKER_TOKEN", "XAUDIT_TOKEN", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH", "XAUDIT_HOME"):
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("XAUDIT_WORKER_CONCURRENCY", "2")  # the child shares the CPUs by it
    monkeypatch.setenv("XAUDIT_THREADS", "1")  # --threads
    monkeypatch.setenv("XAUDIT_FLUSH_DENORMALS", "0")  # the model process keeps subnormals too
    env = _child_env()
    expected = {
        "OMP_NUM_THREADS": "1", "XAUDIT_WORKER_CONCURRENCY": "2", "XAUDIT_THREADS": "1",
        "XAUDIT_FLUSH_DENORMALS": "0",
    }  # fmt: skip
    assert env == expected | {"PATH": env["PATH"]} | {
        k: v
        for k, v in env.items()
        if k.startswith(("MKL_", "LC_", "LANG", "OPENBLAS_", "CUDA_", "TZ", "OMP_WAIT_POLICY"))
    }
    assert env.get("OMP_WAIT_POLICY") == os.environ.get("OMP_WAIT_POLICY")  # idle threads sleep there too
    assert "secret" not in env.values()


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XAUDIT_SANDBOX_MEMORY_MB", "512")
    monkeypatch.setenv("XAUDIT_SANDBOX_CPU_SECONDS", "0")  # 0: no limit
    monkeypatch.setenv("XAUDIT_SANDBOX_WALL_SECONDS", "30")
    assert SandboxLimits.from_env() == SandboxLimits(512 << 20, None, 30.0)


def test_torchscript_is_refused_where_files_cannot_be_confined(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import sandbox
    from xaudit.contract.errors import FailedPrecondition
    from xaudit.contract.spec import JobSpec

    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)  # a kernel without Landlock
    started: list[object] = []
    monkeypatch.setattr(sandbox, "_Child", lambda limits: started.append(limits))
    spec = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
    x = {"inputs": np.zeros((1, 3), np.float32)}
    with pytest.raises(FailedPrecondition, match="XAUDIT_SANDBOX_ALLOW_UNCONFINED=1"):
        sandbox.run_sandboxed(spec, b"PK\x03\x04", "torchscript", x)
    assert not started  # refused before any process starts
    monkeypatch.setenv("XAUDIT_SANDBOX_ALLOW_UNCONFINED", "1")  # the operator's explicit consent
    with pytest.raises(AttributeError):  # got as far as starting the child (replaced by the list here)
        sandbox.run_sandboxed(spec, b"PK\x03\x04", "torchscript", x)
    assert len(started) == 1
