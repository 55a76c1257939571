"""Run an untrusted model's job in an isolated child process (ONNX and TorchScript alike).

The worker never loads a model in its own process. Each job runs in a child process of its own,
never reused, which confines itself (:mod:`workers.confine`: another user or no capabilities, a
private network namespace, not dumpable, no new privileges, and Landlock: read-only code, no other
file, no TCP, no signal out), limits its address space (RLIMIT_AS: its size before the model plus
``memory_bytes``) and CPU time (RLIMIT_CPU), and only then loads the model, once, and runs the whole
job (:func:`workers.jobs.run_job`: every evaluation in batches, in that one process). TorchScript is
refused where the file system cannot be confined, unless the operator allows it
(XAUDIT_SANDBOX_ALLOW_UNCONFINED=1). Progress, metrics and the result come back as framed JSON and
``.npz`` data (read with ``allow_pickle=False``: nothing the child sends can run code in the worker).
The parent kills the child on cancellation, on the wall-clock limit, or when the Celery task is
stopped; a child that dies (out of memory, SIGXCPU, segfault, exit) fails its job with a reason and
the worker carries on. This module is the worker's side; the model process's side is
:mod:`workers.sandbox_child`, and what they say to each other :mod:`workers.sandbox_wire`.

How the child starts. By default each worker process keeps a *zygote* (:mod:`workers.forkserver`):
``python -I`` (no PYTHONPATH, no user site, no working directory on ``sys.path``: a ``json.py``
lying anywhere cannot shadow a module) in an empty private directory with a clean environment
(thread settings only: no token, no key, no broker URL), which imports the compute core once and
then forks one child per job; it never sees a job's data, never runs a model or an operator, and
forks only while single-threaded. The child receives its job's pipes and a fresh private working
directory, closes every other descriptor, and runs the same per-job code as a spawned child: read
the job, confine, limit, run. Forking is safe here because everything a tenant could use is applied
after the fork, exactly as after a spawn, and the zygote holds nothing a child may not see: no
tenant data, no secret, the same clean environment. A zygote that dies fails only its jobs in
flight and is restarted once; after that, or when it cannot fork safely, each job starts its own
``python -I`` child as with XAUDIT_SANDBOX_FORKSERVER=0, which keeps one child started ahead (the
spare) so a job does not wait for the imports, though it still pays their CPU.

Environment: XAUDIT_SANDBOX_FORMATS (``all`` by default; ``torchscript``, ``onnx`` or ``none`` run
the others in the worker's process: trusted models only), XAUDIT_SANDBOX_MEMORY_MB (4096),
XAUDIT_SANDBOX_CPU_SECONDS (900), XAUDIT_SANDBOX_WALL_SECONDS (1800),
XAUDIT_SANDBOX_ALLOW_UNCONFINED (unset), XAUDIT_SANDBOX_FORKSERVER (``1``; ``0``: a fresh interpreter
per job), XAUDIT_SANDBOX_PREWARM (``1``: start the zygote, or the spare, before the first job). See
docs/security.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from workers import forkserver
from workers.confine import landlock_abi
from workers.denormals import FLUSH_ENV
from workers.forkserver import ForkedChild
from workers.jobs import JobResult, Progress
from workers.sandbox_wire import ALLOW_UNCONFINED_ENV, METRIC_OPS, NO_CONFINEMENT, decode_result, read_frames
from workers.switches import switch
from workers.threads import CONCURRENCY_ENV, THREADS_ENV
from xaudit.contract.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidModel,
    ResourceExhausted,
    XauditError,
    error_for_code,
)
from xaudit.contract.spec import JobSpec
from xaudit.contract.units import MiB

__all__ = ["SandboxLimits", "allow_unconfined", "isolated_formats", "prewarm", "run_sandboxed"]

logger = logging.getLogger(__name__)

# Codes a child may report; anything else is reported as a crash of the model.
_CHILD_CODES = (
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "INTERNAL",
)


@dataclass(frozen=True)
class SandboxLimits:
    # Address space the model may add to the child's size after its imports (RLIMIT_AS).
    memory_bytes: int | None = 4096 * MiB
    # CPU seconds (all threads) for loading and running the model (RLIMIT_CPU; SIGXCPU past it).
    cpu_seconds: int | None = 900
    # Wall-clock seconds before the parent kills the child (a model blocked on a lock uses no CPU).
    wall_seconds: float | None = 1800.0

    @classmethod
    def from_env(cls) -> SandboxLimits:
        def number(name: str, default: float | None) -> float | None:
            text = os.environ.get(name, "").strip()
            if not text:
                return default
            value = float(text)
            return None if value <= 0 or not math.isfinite(value) else value

        memory = number("XAUDIT_SANDBOX_MEMORY_MB", 4096)
        cpu = number("XAUDIT_SANDBOX_CPU_SECONDS", 900)
        return cls(
            None if memory is None else int(memory * MiB),
            None if cpu is None else max(1, int(cpu)),
            number("XAUDIT_SANDBOX_WALL_SECONDS", 1800.0),
        )


def isolated_formats() -> frozenset[str]:
    text = os.environ.get("XAUDIT_SANDBOX_FORMATS", "all").strip().lower()
    if text == "all":
        return frozenset({"onnx", "torchscript"})
    if text in ("", "none"):
        return frozenset()
    return frozenset(f.strip() for f in text.split(",") if f.strip())


def allow_unconfined() -> bool:
    """The operator's explicit consent to run TorchScript where the file system cannot be confined."""
    return switch(ALLOW_UNCONFINED_ENV, False)


def run_sandboxed(
    spec: JobSpec,
    model_bytes: bytes,
    model_format: str | None,
    tensors: Mapping[str, np.ndarray],
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    limits: SandboxLimits | None = None,
) -> JobResult:
    """:func:`workers.jobs.run_job`, in an isolated child process for the formats that need one."""
    from workers.jobs import run_job
    from workers.models import detect_format

    fmt = model_format or detect_format(model_bytes)
    if fmt not in isolated_formats():
        return run_job(spec, model_bytes, fmt, tensors, progress, should_stop)
    need_filesystem = fmt == "torchscript" and not allow_unconfined()
    if need_filesystem and not landlock_abi():
        raise FailedPrecondition(NO_CONFINEMENT)
    return _Child(limits or SandboxLimits.from_env()).run(
        spec, model_bytes, fmt, tensors, progress, should_stop, need_filesystem
    )


# -- parent side -----------------------------------------------------------------------------------


def _death_reason(returncode: int, limits: SandboxLimits) -> XauditError:
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        if sig == signal.SIGXCPU:
            return ResourceExhausted(
                f"the model used up its CPU time limit of {limits.cpu_seconds} s (its process got SIGXCPU)"
            )
        if sig == signal.SIGKILL:
            return ResourceExhausted(
                "the model's process was killed (SIGKILL): out of memory, or past its CPU hard limit"
            )
        return InvalidModel(f"the model crashed its process ({name})")
    return InvalidModel(f"the model's process exited with status {returncode} before finishing its job")


# The only variables a child gets: thread and locale settings (the worker's concurrency among them:
# the child sizes its threads by it, workers.threads). Nothing else of the worker's environment
# (tokens, keys, broker and store URLs, PYTHON*) reaches the model's process.
_ENV_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "CUDA_VISIBLE", "NVIDIA_VISIBLE", "LC_")
_ENV_NAMES = ("LANG", "TZ", THREADS_ENV, CONCURRENCY_ENV, FLUSH_ENV)


def _child_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES))
        and not any(word in k for word in ("TOKEN", "SECRET", "KEY", "PASS"))
    }
    env["PATH"] = os.defpath
    return env


def _import_roots() -> list[str]:
    """Directories the child imports the compute core (and the generated protocol) from: where this
    process found them. Passed as arguments and appended after the interpreter's own paths, so they
    can add packages but never shadow the standard library."""
    roots: list[str] = []
    for top in {__name__.split(".")[0], "xaudit"}:
        module = sys.modules.get(top)
        for path in list(getattr(module, "__path__", None) or []):
            root = str(Path(path).resolve().parent)
            if root not in roots:
                roots.append(root)
    return roots


# The child's first code: fixed, no user data; its import roots come as arguments.
_BOOT = (
    "import sys; sys.path.extend(sys.argv[1:]); from workers.sandbox_child import child_main; child_main()"
)
# The zygote's: its control socket's descriptor, then the import roots.
_ZYGOTE_BOOT = (
    "import sys; sys.path.extend(sys.argv[2:]); from workers.sandbox_child import child_main; "
    "child_main(int(sys.argv[1]))"
)


def _private_directory() -> str:
    # An empty directory of its own (0700, removed afterwards): nothing to import, nothing shared.
    return tempfile.mkdtemp(prefix="xaudit-sandbox-")


class _Process:
    """A started child and its private working directory, waiting for a job on its stdin."""

    def __init__(self) -> None:
        self.workdir = _private_directory()
        try:
            self.proc: subprocess.Popen[bytes] | ForkedChild = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, *_import_roots()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                cwd=self.workdir,
                env=_child_env(),
            )
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    @classmethod
    def forked(cls, child: ForkedChild, workdir: str) -> _Process:
        """A child the zygote forked into ``workdir``."""
        process = cls.__new__(cls)
        process.proc, process.workdir = child, workdir
        return process

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(XauditError):  # a forked child whose zygote died: gone with it
            self.proc.wait()
        if isinstance(self.proc, ForkedChild):
            self.proc.close()  # its pipes and its pidfd
        else:
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


# One child started ahead (imports done, no job, nothing of a tenant's) so a job does not wait for
# the compute core's imports; each child serves exactly one job and is never reused.
_spare: _Process | None = None
_spare_lock = threading.Lock()


def _prewarm_enabled() -> bool:
    return switch("XAUDIT_SANDBOX_PREWARM", True)


def _forkserver_enabled() -> bool:
    return switch(_FORKSERVER, True) and forkserver.available() and _zygote_broken is None


def prewarm() -> None:
    """Start the zygote, or the next job's spare child, now (from a long-lived thread: a spare child
    dies with this thread)."""
    global _spare
    if not _prewarm_enabled():
        return
    if _forkserver_enabled():
        _running_zygote()
        return
    with _spare_lock:
        if _spare is None or _spare.proc.poll() is not None:
            if _spare is not None:
                _spare.close()
            _spare = _Process()


def _take_process(should_stop: Callable[[], bool] | None = None) -> _Process:
    global _spare
    if _forkserver_enabled():
        forked = _fork_process(should_stop)
        if forked is not None:
            return forked
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None and spare.proc.poll() is None and _prewarm_enabled():
        return spare
    if spare is not None:
        spare.close()
    return _Process()


# -- the zygote: one per worker process, imports once, forks a child per job -----------------------

_FORKSERVER = "XAUDIT_SANDBOX_FORKSERVER"
_ZYGOTE_TIMEOUT = 300.0  # seconds for a new zygote's imports and first fork on a loaded machine
_zygote: forkserver.ForkServer | None = None
_zygote_dir: str | None = None
_zygote_broken: str | None = None  # why this process gave up on the zygote and spawns instead
_zygote_lock = threading.Lock()


def _zygote_env() -> dict[str, str]:
    """The children's environment, and what keeps the zygote single-threaded: numpy's and scipy's
    OpenBLAS start their thread pool when loaded unless told to use one thread, and onnxruntime
    starts a telemetry thread at import (a model's process has nothing to report anyway)."""
    return _child_env() | {"OPENBLAS_NUM_THREADS": "1", "ORT_DISABLE_TELEMETRY": "1"}


def _running_zygote(fresh: bool = False) -> forkserver.ForkServer:
    """This process's zygote, started (or restarted: dead, ``fresh``, or a changed environment)."""
    global _zygote, _zygote_dir
    with _zygote_lock:
        env = _zygote_env()
        if fresh or _zygote is None or not _zygote.alive() or _zygote.env != env:
            _stop_zygote()
            _zygote_dir = _private_directory()
            _zygote = forkserver.ForkServer(_ZYGOTE_BOOT, _import_roots(), env, _zygote_dir)
            logger.info("sandbox fork server %d started", _zygote.process.pid)
        return _zygote


def _stop_zygote() -> None:
    global _zygote, _zygote_dir
    if _zygote is not None:
        _zygote.close()
    if _zygote_dir is not None:
        shutil.rmtree(_zygote_dir, ignore_errors=True)
    _zygote = _zygote_dir = None


def _fork_process(should_stop: Callable[[], bool] | None = None) -> _Process | None:
    """A child forked by the zygote; after a zygote that died, a new zygote's; None (spawn this job,
    and every later one) when that fails too or when the zygote cannot fork safely. Cancelled when
    ``should_stop`` says so while a new zygote is still importing (the next job starts another)."""
    global _zygote_broken
    workdir = _private_directory()
    for attempt in range(2):
        try:
            zygote = _running_zygote(fresh=attempt > 0)
        except OSError as exc:
            why = f"cannot start it: {exc}"
            break
        child = zygote.fork(workdir, _ZYGOTE_TIMEOUT, should_stop)
        if child is not None:
            return _Process.forked(child, workdir)
        if should_stop is not None and should_stop():
            shutil.rmtree(workdir, ignore_errors=True)
            logger.info("sandbox fork server %d stopped: its job was cancelled", zygote.process.pid)
            raise Cancelled("the job was cancelled")
        why = f"it refused to fork: {zygote.refused}" if zygote.refused else "it stopped"
        logger.warning("sandbox fork server %d: %s", zygote.process.pid, why)
        if zygote.refused:
            break
    shutil.rmtree(workdir, ignore_errors=True)
    with _zygote_lock:
        _stop_zygote()
        _zygote_broken = why
    logger.warning("sandbox fork server given up (%s): each job starts its own process now", why)
    return None


def _send_job(stream: IO[bytes], job: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError, ValueError):  # a child that died: its status says why
        pickle.dump(job, stream, protocol=pickle.HIGHEST_PROTOCOL)
        stream.close()


class _Child:
    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits

    def run(
        self,
        spec: JobSpec,
        model_bytes: bytes,
        fmt: str,
        tensors: Mapping[str, np.ndarray],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
        need_filesystem: bool = True,
    ) -> JobResult:
        child = _take_process(should_stop)
        proc = child.proc
        logger.info("sandbox %d runs a %s model (limits %s)", proc.pid, fmt, self.limits)
        assert proc.stdin is not None and proc.stdout is not None
        frames: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        reader = threading.Thread(target=read_frames, args=(proc.stdout, frames), daemon=True)
        reader.start()
        try:
            job = {
                "spec": spec.to_json(),
                "model": model_bytes,
                "format": fmt,
                "tensors": {k: np.asarray(v) for k, v in tensors.items()},
                "limits": asdict(self.limits),
                "need_filesystem": need_filesystem,
            }
            # From a thread: a child still importing reads nothing yet, and cancellation must not wait.
            writer = threading.Thread(target=_send_job, args=(proc.stdin, job), daemon=True)
            writer.start()
            return self._wait(proc, frames, progress, should_stop)
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(XauditError):  # a forked child whose zygote died: gone with it
                proc.wait()
            reader.join(timeout=5)
            child.close()
            with contextlib.suppress(Exception):  # a failed start surfaces with the next job
                prewarm()

    def _wait(
        self,
        proc: subprocess.Popen[bytes] | ForkedChild,
        frames: queue.Queue[tuple[bytes, bytes] | None],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
    ) -> JobResult:
        # The wall clock starts when the child is confined and about to load the model (a cold child
        # first imports the compute core: that is the worker's time, not the model's).
        deadline: float | None = None
        while True:
            try:
                frame = frames.get(timeout=0.2)
            except queue.Empty:
                frame = b"", b""
            if frame is None:  # the child closed its channel: exited, or died
                status = proc.wait()
                logger.warning("sandbox %d ended without a result (status %d)", proc.pid, status)
                raise _death_reason(status, self.limits)
            kind, payload = frame
            if kind == b"S" and self.limits.wall_seconds is not None:
                deadline = time.monotonic() + self.limits.wall_seconds
            elif kind == b"P" and progress is not None:
                message = json.loads(payload)
                progress(float(message["fraction"]), str(message["message"])[:500])
            elif kind == b"M":
                _replay_metrics(payload)
            elif kind == b"R":
                try:
                    return decode_result(payload)
                except Exception as exc:  # whatever the child sent, it is no result
                    raise InvalidModel(
                        f"the model's process sent a malformed result ({type(exc).__name__})"
                    ) from None
            elif kind == b"E":
                message = json.loads(payload)
                code = str(message.get("code"))
                text = str(message.get("message"))[:1000]
                if code not in _CHILD_CODES:
                    raise InvalidModel(f"the model's process failed: {text}")
                raise error_for_code(code, text)
            if should_stop is not None and should_stop():
                proc.kill()
                logger.info("sandbox %d killed: its job was cancelled", proc.pid)
                raise Cancelled("the job was cancelled")
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                raise DeadlineExceeded(
                    f"the model ran past its wall-clock limit of {self.limits.wall_seconds:g} s and was stopped"
                )


# -- metrics: recorded in the child (workers.sandbox_child), counted by the worker -----------------


def _replay_metrics(payload: bytes) -> None:
    """Apply the child's metric calls to this worker's metrics (checked: names, ops, finite values)."""
    from workers.metrics import active

    metrics = active()
    if metrics is None:
        return
    try:
        calls = json.loads(payload)
        for name, labels, op, value in calls[:10_000]:
            if METRIC_OPS.get(name) != op or not math.isfinite(value) or value < 0:
                continue
            metric = getattr(metrics, name)
            if labels:
                metric = metric.labels(*[str(v)[:100] for v in labels])
            getattr(metric, op)(value)
    except (ValueError, TypeError, AttributeError):
        logger.warning("the sandbox sent malformed metrics; ignored")
