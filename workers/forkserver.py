"""A fork server ("zygote"): one long-lived process that imported the compute core once and forks a
fresh child for each job, so that a job does not pay the imports' CPU (see workers/sandbox.py).

The worker side is :class:`ForkServer`: it starts the zygote (``python -I -c BOOT FD ROOTS...``,
with the control socket's descriptor as ``FD``) and asks it for a child with :meth:`ForkServer.fork`,
which hands over the child's stdin, stdout and working directory as file descriptors (SCM_RIGHTS)
and returns a :class:`ForkedChild` with the surface of :class:`subprocess.Popen` the sandbox uses
(``pid``, ``stdin``, ``stdout``, ``poll``, ``kill``, ``wait``). The zygote side is :func:`serve`.

The zygote forks only while it is single-threaded (a fork copies one thread, so a lock held by any
other would stay locked in the child forever); otherwise it refuses and says why. It holds no
tenant data: what a child needs arrives on that child's own pipes, after the fork. It reaps its
children through pidfds and reports each exit status to the worker; the worker kills a child
through a pidfd the zygote opened before the child could be reaped (no pid-reuse race). The zygote
exits, killing its children, when the worker's end of the control socket closes (the worker's
process died): that holds whichever of the worker's threads started it, where the parent-death
signal would follow the starting thread. Linux only (pidfds: 5.3+).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, NoReturn

from xaudit.contract.errors import XauditError
from xaudit.contract.process import die_with_parent

__all__ = ["ForkServer", "ForkedChild", "available", "serve", "threads_in_process"]

_MESSAGE = 256  # bytes: the longest control message ("refused <reason>")
# How often a fork request waiting on a starting zygote asks whether its job was cancelled.
_STOP_POLL_SECONDS = 0.2


def available() -> bool:
    """Whether this platform can run a fork server (fork, pidfds, descriptor passing)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def threads_in_process() -> int:
    """Threads of this process: the interpreter's, and on Linux every native one (a library's pool)."""
    count = threading.active_count()
    with contextlib.suppress(OSError):
        count = max(count, len(os.listdir("/proc/self/task")))
    return count


# -- worker side -----------------------------------------------------------------------------------


class ForkedChild:
    """A child forked by the zygote, as the worker sees it."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None  # as subprocess: negative for a signal
        self.stdin: IO[bytes] | None = None
        self.stdout: IO[bytes] | None = None
        self._pidfd = pidfd
        self._lost = False  # the zygote died before it reported this child's exit
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if self._done.is_set():
            return
        with contextlib.suppress(ProcessLookupError):  # already gone
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def wait(self) -> int:
        self._done.wait()
        if self.returncode is None:
            raise XauditError(
                "the sandbox's fork server stopped while the model ran, taking the model's process with "
                "it; the next job gets a new one"
            )
        return self.returncode

    def close(self) -> None:
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(OSError):
            os.close(self._pidfd)

    def _ended(self, returncode: int | None) -> None:
        self.returncode = returncode
        self._done.set()


class ForkServer:
    """A started zygote and its control socket (one fork request at a time)."""

    def __init__(self, boot: str, roots: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
        self.env = dict(env)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", boot, str(theirs.fileno()), *roots],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                cwd=cwd,
                env=self.env,
            )
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()
        self.refused: str | None = None  # the zygote's reason for not forking, once it gave one
        self._children: dict[int, ForkedChild] = {}
        self._replies: list[ForkedChild | str | None] = []
        self._changed = threading.Condition()
        self._request = threading.Lock()
        self._alive = True
        threading.Thread(target=self._read, name="xaudit-forkserver", daemon=True).start()

    def alive(self) -> bool:
        return self._alive and self.process.poll() is None

    def fork(
        self, cwd: str, timeout: float, should_stop: Callable[[], bool] | None = None
    ) -> ForkedChild | None:
        """A new child with pipes on its stdin and stdout, in ``cwd``; None when the zygote is gone
        or refused (``refused`` then says why), or gave no answer within ``timeout`` seconds, or
        ``should_stop`` said so while it was still starting (the zygote is stopped then: a fork it
        made later would be for nobody)."""
        job_read, job_write = os.pipe()
        result_read, result_write = os.pipe()
        cwd_fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with self._request:
                if not self.alive():
                    return None
                socket.send_fds(self._sock, [b"fork"], [job_read, result_write, cwd_fd])
                reply = self._next_reply(timeout, should_stop)
        except OSError:
            reply = None
        finally:
            for fd in (job_read, result_write, cwd_fd):  # the child has its own copies now
                os.close(fd)
        if not isinstance(reply, ForkedChild):
            self.refused = reply
            os.close(job_write)
            os.close(result_read)
            return None
        reply.stdin = open(job_write, "wb")  # noqa: SIM115  # closed by ForkedChild.close
        reply.stdout = open(result_read, "rb")  # noqa: SIM115
        return reply

    def close(self) -> None:
        """Stop the zygote (its children die with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._sock.close()

    def _next_reply(self, timeout: float, should_stop: Callable[[], bool] | None) -> ForkedChild | str | None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (self._replies or not self._alive):
                left = deadline - time.monotonic()
                if left <= 0 or (should_stop is not None and should_stop()):
                    self.close()  # a zygote that does not answer (or answers nobody) is of no use
                    return None
                self._changed.wait(min(left, _STOP_POLL_SECONDS))
            return self._replies.pop(0) if self._replies else None

    def _read(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._sock, _MESSAGE, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            word, _, rest = message.decode("ascii", "replace").partition(" ")
            with self._changed:
                if word == "forked" and fds:
                    child = ForkedChild(int(rest), fds[0])
                    self._children[child.pid] = child  # before its exit can be reported
                    self._replies.append(child)
                elif word == "exit":
                    pid, code = (int(v) for v in rest.split())
                    ended = self._children.pop(pid, None)
                    if ended is not None:
                        ended._ended(code)
                else:
                    self._replies.append(rest or message.decode("ascii", "replace"))
                self._changed.notify_all()
        with self._changed:
            self._alive = False
            for child in self._children.values():
                child._ended(None)
            self._children.clear()
            self._changed.notify_all()


# -- zygote side -----------------------------------------------------------------------------------


def serve(control_fd: int, run_child: Callable[[], object]) -> NoReturn:
    """The zygote's loop: fork a child that runs ``run_child`` (with the stdin, stdout and working
    directory sent with its request) for each request, report each child's exit; exit with the
    worker. ``run_child`` must end the child's process itself (``os._exit``)."""
    control = socket.socket(fileno=control_fd)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready = select.select([control_fd, *children], [], [])[0]
        for fd in ready:
            if fd == control_fd:
                try:
                    message, fds, _, _ = socket.recv_fds(control, _MESSAGE, 3)
                except OSError:
                    message, fds = b"", []
                if not message:  # the worker is gone: so are its jobs
                    for pidfd in children:
                        with contextlib.suppress(OSError):
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    os._exit(0)
                _fork(control, fds, children, run_child)
            else:  # a child exited: reap it, then say how it ended
                pid = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                control.send(f"exit {pid} {os.waitstatus_to_exitcode(status)}".encode())


def _fork(
    control: socket.socket, fds: list[int], children: dict[int, int], run_child: Callable[[], object]
) -> None:
    threads = threads_in_process()
    if len(fds) != 3 or threads != 1:
        reason = f"{threads} threads in the fork server" if threads != 1 else "malformed request"
        control.send(f"refused {reason}".encode())
        for fd in fds:
            os.close(fd)
        return
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _become_child(control, fds, zygote)
            run_child()
        finally:
            os._exit(70)  # run_child did not end the process: a failure, never the zygote's loop
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    children[pidfd] = pid
    socket.send_fds(control, [f"forked {pid}".encode()], [pidfd])


def _become_child(control: socket.socket, fds: list[int], zygote: int) -> None:
    """In the new child: keep only its own pipes (as stdin and stdout) and its working directory."""
    job_read, result_write, cwd_fd = fds
    die_with_parent()  # the flag is not inherited through fork
    if os.getppid() != zygote:  # the zygote died before the flag was set
        os._exit(1)
    control.detach()  # closed below with every other inherited descriptor, never twice
    os.fchdir(cwd_fd)
    os.dup2(job_read, 0)
    os.dup2(result_write, 1)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the control socket, siblings' pidfds, the rest
