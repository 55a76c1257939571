"""Confine the current process before it touches an untrusted model (Linux; see docs/security.md).

Layers, each applied when the machine allows it:

* another user: a process started as root enters a private, empty network namespace and leaves for
  ``nobody`` (no supplementary groups): files readable by the service only (mode 0600, e.g. the
  signing key) and every root process's ``/proc/<pid>/environ`` are then out of reach. Where
  ``nobody`` could not read the interpreter (installed under /root), it stays uid 0 with every
  capability dropped, and Landlock alone keeps it from the service's files.
* not dumpable: no other process of the same user can ptrace it or read its memory or environ.
* no new privileges: no set-uid program can give rights back.
* Landlock (kernel 5.13+): the file system becomes read-only code: reading files beneath the
  directories the interpreter imports from (and the system libraries it may load), nothing else; no
  file written, created, removed or renamed anywhere; no TCP bind or connect (ABI 4+); no signal to
  and no abstract unix socket with a process outside the sandbox (ABI 6+).

:func:`landlock_abi` says whether Landlock is there; :func:`confine` applies everything and says
what it applied. The raw syscalls go through ctypes so no extra package is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xaudit.contract.process import die_with_parent

__all__ = ["Confinement", "confine", "landlock_abi", "unprivileged_ids"]

# Syscall numbers of Landlock: the same on x86_64 and on the generic table (aarch64, riscv64).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
_CLONE_NEWNET = 0x40000000

# File-system rights by the ABI that introduced them (include/uapi/linux/landlock.h).
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_READ_CODE = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_READ_WRITE_DEVICE = _FS_READ_FILE | _FS_WRITE_FILE

# Read-only beyond the interpreter's own paths: shared libraries a lazy import may load, the CPU
# topology thread pools read. Nothing here holds a secret.
_SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/sys/devices/system/cpu")
_DEVICES_READ = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero", "/proc/cpuinfo")
# GPU device files (compute needs read, write and ioctl on them); absent on CPU machines.
_GPU_DEVICES = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
    *(f"/dev/nvidia{i}" for i in range(16)),
)  # fmt: skip
# What the CUDA driver reads at initialisation (hardware description, no secret); only on GPU hosts.
_GPU_READ = ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/dev/nvidia-caps")

NOBODY = 65534


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = _libc()
    except OSError:
        return 0
    version = libc.syscall(
        _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(0, int(version))


def _open_to_others(directory: str) -> bool:
    """Whether a user with no special rights can list ``directory`` (and traverse every parent)."""
    path = Path(directory)
    for part in [path, *path.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & 0o001 or (part == path and not mode & 0o004):
            return False
    return True


def unprivileged_ids(code: Iterable[str] = ()) -> tuple[int, int] | None:
    """(uid, gid) a root process switches to; None when this process cannot switch (not root), or
    when ``nobody`` could not read the interpreter's code (e.g. Python installed under /root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    if not all(_open_to_others(d) for d in code):
        return None
    return NOBODY, NOBODY


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """Root that stays root (its uid kept): no capability left, none to regain (bounding set emptied)."""
    pr_capbset_drop = 24
    for cap in range(64):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) < 0:
            break  # past the last capability this kernel knows
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")


@dataclass(frozen=True)
class Confinement:
    """What :func:`confine` applied; ``filesystem`` says whether file access is confined."""

    landlock_abi: int
    uid: int
    network_namespace: bool

    @property
    def filesystem(self) -> bool:
        return self.landlock_abi > 0

    def describe(self) -> str:
        parts = [
            f"landlock ABI {self.landlock_abi}" if self.landlock_abi else "no landlock",
            f"uid {self.uid}",
        ]
        if self.network_namespace:
            parts.append("private network namespace")
        return ", ".join(parts)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _ruleset(abi: int) -> _RulesetAttr:
    fs = _FS_ABI1
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    if abi >= 5:
        fs |= _FS_IOCTL_DEV
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    return _RulesetAttr(fs, net, scoped)


def _attr_size(abi: int) -> int:
    # Older kernels refuse a struct larger than they know (E2BIG): pass only the fields of their ABI.
    if abi >= 6:
        return ctypes.sizeof(_RulesetAttr)
    return 16 if abi >= 4 else 8


def _add_rule(libc: ctypes.CDLL, ruleset_fd: int, path: str, access: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent here: nothing to allow
    try:
        if not os.path.isdir(path):
            # Directory-only rights are refused on a file rule (EINVAL).
            access &= _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
        rule = _PathBeneathAttr(access & handled, fd)
        _check(
            libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(rule), ctypes.c_uint32(0)),
            f"landlock_add_rule({path})",
        )  # fmt: skip
    finally:
        os.close(fd)


def _landlock(abi: int, readable: Iterable[str]) -> None:
    libc = _libc()
    attr = _ruleset(abi)
    fd = _check(
        libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_attr_size(abi)), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )  # fmt: skip
    try:
        for path in readable:
            _add_rule(libc, fd, path, _READ_CODE, attr.handled_access_fs)
        for path in _DEVICES_READ:
            _add_rule(libc, fd, path, _FS_READ_FILE, attr.handled_access_fs)
        for path in _GPU_DEVICES:
            _add_rule(libc, fd, path, _READ_WRITE_DEVICE | _FS_IOCTL_DEV, attr.handled_access_fs)
        _check(
            libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)), "landlock_restrict_self"
        )
    finally:
        os.close(fd)


def code_directories() -> list[str]:
    """Where this interpreter imports from (absolute directories only: never the working directory)."""
    out: list[str] = []
    gpu = _GPU_READ if os.path.exists(_GPU_DEVICES[0]) else ()
    for entry in [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *_SYSTEM_READ, *gpu]:
        if entry and os.path.isabs(entry):
            path = str(Path(entry).resolve())
            if os.path.isdir(path) and path not in out:
                out.append(path)
    return out


def confine(*, use_landlock: bool = True, use_other_user: bool = True) -> Confinement:
    """Apply every layer this machine supports to the calling process (irreversible); say which.

    Call it once, single-threaded if possible (the uid change and no_new_privs cover every thread on
    Linux through glibc's setxid broadcast; Landlock covers threads created afterwards)."""
    if not sys.platform.startswith("linux"):
        return Confinement(0, os.getuid(), False)  # nothing applied: TorchScript is then refused
    libc = _libc()
    code = code_directories()
    netns = False
    if os.geteuid() == 0:
        netns = libc.unshare(_CLONE_NEWNET) == 0  # no interface but a downed loopback
    ids = unprivileged_ids(code) if use_other_user else None
    if ids is not None:
        os.setgroups([])
        os.setgid(ids[1])
        os.setuid(ids[0])
    elif os.geteuid() == 0:
        _drop_capabilities(libc)
    # A change of credentials clears the parent-death signal: set it (again) now.
    die_with_parent()
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    abi = landlock_abi() if use_landlock else 0
    if abi:
        _landlock(abi, code)
    return Confinement(abi, os.getuid(), netns)
