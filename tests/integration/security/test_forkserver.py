"""The sandbox's fork server (workers/forkserver.py): each job in its own child forked by one zygote,
which outlives every way a child can end (killed, crashed, out of memory; cancelled: in
tests/security/test_model_attacks.py) and which a confined child can neither signal nor trace. The children are the product's own; only the probe
(tests/integration/security/_fork_probe.py) replaces the job with code that attacks its zygote."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.security import _fork_probe
from tests.integration.security._models import hog_memory_torchscript, spin_forever_torchscript
from tests.models import MLP_FEATURES, relu_mlp, to_onnx
from workers import forkserver, sandbox
from workers.confine import landlock_abi
from workers.sandbox import SandboxLimits, run_sandboxed
from xaudit.contract.errors import Cancelled, InvalidInput, ResourceExhausted, XauditError
from xaudit.contract.spec import JobSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not forkserver.available(), reason="no fork server on this platform"),
]

ROOT = Path(__file__).resolve().parents[3]
SPEC = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
X = {"inputs": np.zeros((2, MLP_FEATURES), np.float32)}
LIMITS = SandboxLimits(memory_bytes=1 << 30, cpu_seconds=600, wall_seconds=600)


@pytest.fixture
def zygote(monkeypatch: pytest.MonkeyPatch) -> int:
    """The pid of this process's zygote, started now and ready (it has forked one honest job)."""
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", "1")
    _honest_job()
    assert sandbox._zygote is not None and sandbox._zygote.alive(), sandbox._zygote_broken
    return sandbox._zygote.process.pid


def _honest_job() -> None:
    result = run_sandboxed(SPEC, to_onnx(relu_mlp(0), torch.zeros(2, MLP_FEATURES)), "onnx", X)
    assert set(result.attributions) == {"gradient_x_input"}


def _children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
        except (OSError, ValueError):
            continue
    return out


def _run_and_meanwhile(
    model: bytes, fmt: str, zygote: int, action: Callable[[int], None] | None = None
) -> tuple[BaseException | None, int]:
    """Run a job; once it reports progress, call ``action`` with its process's pid (a child of the
    zygote). What the job raised, and that pid."""
    seen: list[int] = []

    def progress(fraction: float, message: str) -> None:
        if not seen:
            seen.extend(_children_of(zygote))
            if action is not None and len(seen) == 1:
                action(seen[0])

    try:
        run_sandboxed(SPEC, model, fmt, X, progress, limits=LIMITS)
    except BaseException as exc:
        return exc, seen[0] if seen else 0
    return None, seen[0] if seen else 0


def test_jobs_run_in_distinct_children_of_one_zygote(zygote: int) -> None:
    model = to_onnx(relu_mlp(1), torch.zeros(2, MLP_FEATURES))
    first = _run_and_meanwhile(model, "onnx", zygote)
    second = _run_and_meanwhile(model, "onnx", zygote)
    assert first[0] is None and second[0] is None, (first, second)
    assert first[1] and second[1] and first[1] != second[1]  # each job its own, forked, process
    assert sandbox._zygote is not None and sandbox._zygote.process.pid == zygote


@pytest.mark.parametrize(
    ("how", "expected", "reason"),
    [
        pytest.param(signal.SIGKILL, ResourceExhausted, "SIGKILL", id="sigkill"),
        pytest.param(signal.SIGSEGV, InvalidInput, "SIGSEGV", id="segfault"),
    ],
)
def test_the_zygote_outlives_a_child_killed_or_crashed(
    zygote: int, how: signal.Signals, expected: type[XauditError], reason: str
) -> None:
    # The signal is sent by the test (a model that crashes on purpose is refused by the allow-list);
    # the worker sees the same status from the zygote as from a real crash.
    error, pid = _run_and_meanwhile(
        spin_forever_torchscript(), "torchscript", zygote, lambda p: os.kill(p, how)
    )
    assert pid, "the job never ran"
    assert isinstance(error, expected) and reason in str(error), error
    assert not Path(f"/proc/{pid}").exists()
    assert sandbox._zygote is not None and sandbox._zygote.process.pid == zygote
    _honest_job()
    assert sandbox._zygote.process.pid == zygote and sandbox._zygote.alive()


def test_the_zygote_outlives_a_child_past_its_memory_limit(zygote: int) -> None:
    error, _ = _run_and_meanwhile(hog_memory_torchscript(), "torchscript", zygote)
    assert isinstance(error, (InvalidInput, ResourceExhausted)), error
    assert "internal error" not in str(error)
    _honest_job()
    assert sandbox._zygote is not None and sandbox._zygote.process.pid == zygote


def test_a_dead_zygote_fails_only_its_job_and_the_next_job_gets_a_new_one(zygote: int) -> None:
    error, _ = _run_and_meanwhile(
        spin_forever_torchscript(), "torchscript", zygote, lambda p: os.kill(zygote, signal.SIGKILL)
    )
    assert type(error) is XauditError and "fork server stopped" in str(error), error  # INTERNAL
    _honest_job()
    assert sandbox._zygote is not None and sandbox._zygote.process.pid != zygote
    assert sandbox._zygote_broken is None


def test_a_job_cancelled_while_a_new_zygote_imports_ends_at_once_and_the_next_job_gets_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A zygote that takes a minute to import (a loaded machine, a cold disk): the cancellation is
    # seen while the job waits for its fork, not after the imports.
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", "1")
    with sandbox._zygote_lock:
        sandbox._stop_zygote()
    monkeypatch.setattr(sandbox, "_ZYGOTE_BOOT", "import time; time.sleep(60); " + sandbox._ZYGOTE_BOOT)
    started = time.monotonic()
    with pytest.raises(Cancelled):
        run_sandboxed(SPEC, b"unused", "onnx", X, should_stop=lambda: time.monotonic() - started > 1.0)
    assert time.monotonic() - started < 10
    assert sandbox._zygote is not None and not sandbox._zygote.alive()  # stopped, not left importing
    slow = sandbox._zygote.process.pid
    monkeypatch.undo()
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", "1")
    _honest_job()
    assert sandbox._zygote is not None and sandbox._zygote.process.pid != slow
    assert sandbox._zygote_broken is None


def test_without_the_switch_each_job_spawns_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", "0")
    monkeypatch.setenv("XAUDIT_SANDBOX_PREWARM", "0")
    process = sandbox._take_process()
    try:
        assert not isinstance(process.proc, forkserver.ForkedChild)
    finally:
        process.close()


@pytest.fixture
def probe_zygote() -> Iterator[forkserver.ForkServer]:
    with tempfile.TemporaryDirectory() as cwd:
        env = sandbox._zygote_env()
        server = forkserver.ForkServer(_fork_probe.BOOT, [str(ROOT), str(ROOT / "proto")], env, cwd)
        try:
            yield server
        finally:
            server.close()


def _probe(server: forkserver.ForkServer, key: Path, other_user: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as workdir:
        child = server.fork(workdir, timeout=120)
        assert child is not None and child.stdin is not None and child.stdout is not None, server.refused
        request = {"key": str(key), "worker": os.getpid(), "other_user": other_user}
        child.stdin.write(json.dumps(request).encode())
        child.stdin.close()
        seen = child.stdout.read()
        assert child.wait() == 0, seen
        child.close()
    return dict(json.loads(seen))


@pytest.mark.skipif(not landlock_abi(), reason="this kernel has no Landlock")
@pytest.mark.parametrize("other_user", [True, False], ids=["default", "same-uid"])
def test_a_confined_forked_child_cannot_read_secrets_nor_signal_or_trace_its_zygote(
    probe_zygote: forkserver.ForkServer, tmp_path: Path, other_user: bool
) -> None:
    key = tmp_path / "signing_key.pem"
    key.write_bytes(b"TEST-ONLY")
    key.chmod(0o600)
    seen = _probe(probe_zygote, key, other_user)
    assert seen["zygote"] == probe_zygote.process.pid
    # Control: before confine(), the child can read the key, open the zygote's memory, signal both.
    assert seen["before"] == dict.fromkeys(("key", "zygote_mem", "signal_zygote", "signal_worker"), "done")
    after = dict(seen["after"])  # type: ignore[call-overload]
    assert after["key"] == "PermissionError" and after["zygote_mem"] == "PermissionError", seen
    # With the zygote's uid (not started as root, or kept uid 0), only Landlock's signal scoping
    # (ABI 6+) stands between them.
    if (os.geteuid() != 0 or not other_user) and landlock_abi() < 6:
        pytest.skip("signals between same-uid processes are not scoped before Landlock ABI 6")
    for attack in ("signal_zygote", "signal_worker", "kill_zygote", "ptrace_zygote"):
        assert after[attack] == "PermissionError", (attack, seen)
    assert probe_zygote.alive()
    assert _probe(probe_zygote, key, other_user)["zygote"] == probe_zygote.process.pid  # still forking


def test_a_zygote_with_threads_refuses_to_fork_and_jobs_spawn_instead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Without the settings that keep it single-threaded, the zygote's imports start OpenBLAS's pool
    # and onnxruntime's telemetry thread: a fork would copy their locks, not their threads.
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", "1")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setattr(sandbox, "_zygote_env", sandbox._child_env)
    monkeypatch.setattr(sandbox, "_zygote_broken", None)  # restored for the next tests
    sandbox.prewarm()
    with caplog.at_level("WARNING", logger="workers.sandbox"):
        _honest_job()  # spawned instead
    assert sandbox._zygote is None and sandbox._zygote_broken is not None
    assert "threads in the fork server" in sandbox._zygote_broken, sandbox._zygote_broken
    assert "each job starts its own process now" in caplog.text
