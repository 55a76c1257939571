"""Keep a library's native console output out of ours.

torch's legacy ONNX exporter prints the whole TorchScript graph (hundreds of lines, from C++, to
standard output) whenever an export fails: its logging switch is tested as a function object, so it
is always on (torch 2.14). In the sandbox child that floods the worker's log; in the CLI it would
mix into the command's own output. :func:`captured_native_output` sends file descriptors 1 and 2 to
an anonymous in-memory file (``memfd``: no file system access, so it works under Landlock) for the
duration of the call and hands back what was written.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

__all__ = ["captured_native_output"]

_LIMIT = 1 << 16  # characters of captured output kept (its start: where the error is named)


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # C stdio buffers (std::cout syncs with them)
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_native_output() -> Iterator[list[str]]:
    """Within the block, whatever this process writes to fds 1 and 2 is captured; afterwards the
    yielded list holds it (one string, at most 64 KiB). Where memfd is missing, nothing is captured."""
    captured: list[str] = []
    if not hasattr(os, "memfd_create"):
        yield captured
        return
    _flush_all()
    sink = os.memfd_create("xaudit-native-output", os.MFD_CLOEXEC)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield captured
    finally:
        _flush_all()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        os.lseek(sink, 0, os.SEEK_SET)
        captured.append(os.read(sink, _LIMIT).decode("utf-8", "replace"))
        os.close(sink)
