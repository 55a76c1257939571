"""A zygote whose forked children run a probe instead of a job: the product's fork server
(workers.forkserver.serve, the same descriptor handling) and the product's confine(), with arbitrary
code after it, as a model that escaped the TorchScript allow-list would run.

Each child reads a JSON request on stdin (a secret file's path, the worker's pid, whether to leave
for another user), tries to read the file, signal the zygote and the worker, read the zygote's
memory and ptrace it, before and after confine(), and writes what happened as JSON on stdout."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from workers.confine import confine
from workers.forkserver import serve

__all__ = ["BOOT", "main"]

BOOT = (
    "import sys; sys.path.extend(sys.argv[2:]); "
    "from tests.integration.security._fork_probe import main; main(int(sys.argv[1]))"
)
_PTRACE_ATTACH, _PTRACE_DETACH = 16, 17


def _outcome(action) -> str:  # type: ignore[no-untyped-def]
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "done"


def _read(path: str) -> None:
    with open(path, "rb") as f:
        f.read(1)


def _ptrace(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(_PTRACE_ATTACH, pid, None, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    libc.ptrace(_PTRACE_DETACH, pid, None, None)  # never reached where the defence holds


def _attempts(request: dict[str, object], zygote: int, after: bool) -> dict[str, str]:
    worker = int(request["worker"])  # type: ignore[call-overload]
    out = {
        "key": _outcome(lambda: _read(str(request["key"]))),
        "zygote_mem": _outcome(lambda: open(f"/proc/{zygote}/mem", "rb").close()),
        "signal_zygote": _outcome(lambda: os.kill(zygote, 0)),
        "signal_worker": _outcome(lambda: os.kill(worker, 0)),
    }
    if after:  # a real attack, only where it must fail (the control would stop the zygote)
        out["kill_zygote"] = _outcome(lambda: os.kill(zygote, signal.SIGKILL))
        out["ptrace_zygote"] = _outcome(lambda: _ptrace(zygote))
    return out


def _probe() -> None:
    request = json.loads(sys.stdin.buffer.read())
    zygote = os.getppid()
    result: dict[str, object] = {"zygote": zygote, "before": _attempts(request, zygote, after=False)}
    confinement = confine(use_other_user=bool(request["other_user"]))
    result["after"] = _attempts(request, zygote, after=True)
    result["how"] = confinement.describe()
    os.write(1, json.dumps(result).encode())
    os._exit(0)


def main(control_fd: int) -> None:
    serve(control_fd, _probe)
