"""How many intra-op threads torch and onnxruntime use in this process.

Default: the CPUs this process may really use (its affinity mask, capped by a cgroup CPU quota)
divided among the worker processes sharing them, at least one. More threads than cores only thrash
(threads spin in barriers waiting for each other), so that is never chosen. ``--threads`` (which
sets ``XAUDIT_THREADS`` for the processes the CLI starts) overrides the default, then
``OMP_NUM_THREADS`` where set.

Idle threads sleep rather than spin (torch's OpenMP through ``OMP_WAIT_POLICY=PASSIVE``,
onnxruntime through its session options) unless the operator declares the CPUs dedicated with
``XAUDIT_THREAD_SPIN=1`` (and they are not shared among workers). Spinning is faster on an idle
2-core machine (the 8-player digits audit in 1.8 s against 2.7 s) but, with one other busy process,
made it take 24 to 46 s instead of about 3 s: each barrier waits for a descheduled thread (README
"Performance" has the figures). libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads, so
:func:`set_wait_policy` runs when the ``workers`` package is imported, before any torch import of
ours.

numpy's own BLAS (OpenBLAS in its wheels, and scipy's copy) gets one thread whatever the policy
(``OPENBLAS_NUM_THREADS`` overrides): xaudit's numpy products are small (Moebius blocks, Shapley
shares, per-player sums), and OpenBLAS starts a thread per core whose idle threads spin, with no
passive mode. Left at its default, a one-thread digits audit took 3.7 s of CPU in 2.0 s of wall
time; with one BLAS thread, 1.8 s in 1.8 s (bench/suite.py, threads). At two threads, the same
audit child alternated with and without the limit took 2.8 s instead of 5.1 s of CPU, no slower.

The policy is applied once per process (:func:`apply`) before the first model is loaded; the report's
environment section records it (:meth:`ThreadPolicy.as_dict`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workers.switches import switch
from xaudit.contract.errors import InvalidInput

__all__ = [
    "BLAS_ENV",
    "CONCURRENCY_ENV",
    "SPIN_ENV",
    "THREADS_ENV",
    "ThreadPolicy",
    "apply",
    "available_cpus",
    "choose",
    "current",
    "limit_numpy_blas",
    "ort_session_options",
    "set_wait_policy",
]

logger = logging.getLogger(__name__)

THREADS_ENV = "XAUDIT_THREADS"
# The operator's statement that this process's CPUs are not shared with anything else: threads spin.
SPIN_ENV = "XAUDIT_THREAD_SPIN"
# Set by the worker's main process for its pool children: how many of them share the CPUs.
CONCURRENCY_ENV = "XAUDIT_WORKER_CONCURRENCY"
# OpenBLAS's own variable: numpy's BLAS threads (one by default: see the module's docstring).
BLAS_ENV = "OPENBLAS_NUM_THREADS"
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadPolicy:
    threads: int  # intra-op threads for torch and onnxruntime
    source: str  # "--threads/XAUDIT_THREADS", "OMP_NUM_THREADS" or "cpus"
    cpus: int  # CPUs this process may use
    cpus_from: str  # what limited them: "affinity", "cgroup quota" or "cpu count"
    concurrency: int  # worker processes sharing those CPUs
    spinning: bool  # idle threads spin (only on the operator's XAUDIT_THREAD_SPIN=1, CPUs not shared)
    blas_threads: int = 1  # numpy's (and scipy's) OpenBLAS: 1 unless $OPENBLAS_NUM_THREADS says otherwise

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cgroup_quota(root: Path = _CGROUP) -> float | None:
    """CPUs allowed by a cgroup CPU quota (v2 cpu.max, else v1 cfs), or None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def available_cpus(cgroup_root: Path = _CGROUP) -> tuple[int, str]:
    """(CPUs this process may use, what limited them)."""
    count = os.cpu_count() or 1
    cpus, why = count, "cpu count"
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
        if affinity < cpus:
            cpus, why = affinity, "affinity"
    quota = _cgroup_quota(cgroup_root)
    if quota is not None and math.ceil(quota) < cpus:
        cpus, why = max(1, math.ceil(quota)), "cgroup quota"
    return cpus, why


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"{what} '{text}' is not a whole number") from None
    if value < 1:
        raise InvalidInput(f"{what} must be at least 1 (got {value})")
    return value


def choose(
    requested: int | None = None,
    environ: Mapping[str, str] | None = None,
    cpus: tuple[int, str] | None = None,
) -> ThreadPolicy:
    """The policy for this process: ``requested`` (or $XAUDIT_THREADS) capped at the CPUs, otherwise
    the CPUs divided among $XAUDIT_WORKER_CONCURRENCY worker processes."""
    env = os.environ if environ is None else environ
    count, why = cpus or available_cpus()
    concurrency = _positive(env[CONCURRENCY_ENV], CONCURRENCY_ENV) if env.get(CONCURRENCY_ENV) else 1
    source = "--threads/XAUDIT_THREADS"
    if requested is None and env.get(THREADS_ENV, "").strip():
        requested = _positive(env[THREADS_ENV].strip(), THREADS_ENV)
    if requested is None and env.get("OMP_NUM_THREADS", "").strip().isdigit():
        requested, source = max(1, int(env["OMP_NUM_THREADS"])), "OMP_NUM_THREADS"
    if requested is not None:
        threads = min(requested, count)
        if requested > count:
            logger.warning(
                "%d threads requested but only %d CPUs are available: using %d", requested, count, count
            )
    else:
        threads, source = max(1, count // concurrency), "cpus"
    shared = concurrency > 1 or count < (os.cpu_count() or 1) or threads * concurrency > count
    spinning = threads > 1 and not shared and _spin_requested(env)
    return ThreadPolicy(threads, source, count, why, concurrency, spinning, _blas_threads(env))


def _blas_threads(environ: Mapping[str, str]) -> int:
    wanted = environ.get(BLAS_ENV, "").strip()
    return int(wanted) if wanted.isdigit() and int(wanted) > 0 else 1


def _spin_requested(environ: Mapping[str, str]) -> bool:
    return switch(SPIN_ENV, False, environ)


def set_wait_policy(environ: dict[str, str] | None = None) -> None:
    """Make torch's OpenMP threads sleep when idle (``OMP_WAIT_POLICY=PASSIVE``) unless the operator
    asked for spinning or set ``OMP_WAIT_POLICY`` themselves. Effective only before torch loads; the
    processes this one starts (sandbox children, pool workers) inherit it."""
    env = os.environ if environ is None else environ
    if not _spin_requested(env):
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_applied: ThreadPolicy | None = None


def apply(policy: ThreadPolicy | None = None) -> ThreadPolicy:
    """Set torch's thread counts for this process (once; later calls return the applied policy)."""
    global _applied
    if _applied is not None:
        return _applied
    chosen = policy or choose()
    set_wait_policy()
    import torch

    torch.set_num_threads(chosen.threads)
    # One op at a time: the batch is the parallel work. Torch allows setting it only once.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    limit_numpy_blas(chosen.blas_threads)
    _applied = chosen
    logger.info("compute threads: %s", chosen)
    return chosen


def limit_numpy_blas(threads: int, environ: dict[str, str] | None = None) -> None:
    """Hold numpy's (and scipy's) OpenBLAS to ``threads``.

    Where $OPENBLAS_NUM_THREADS came with the process (set by the operator, or by the sandbox for its
    children), OpenBLAS read it when it loaded. Otherwise the copies loaded already are limited now,
    and copies loaded later, and child processes, read the variable set here."""
    env = os.environ if environ is None else environ
    if env.get(BLAS_ENV, "").strip():
        return
    env[BLAS_ENV] = str(threads)
    from threadpoolctl import ThreadpoolController

    try:  # it reads /proc/self/maps, which a confined model process may not
        ThreadpoolController().select(internal_api="openblas").limit(limits=threads)
    except OSError as exc:
        logger.warning("numpy's BLAS threads left as they are: %s", exc)


def current() -> ThreadPolicy:
    """The applied policy (applying the default one if nothing was applied yet)."""
    return _applied or apply()


def ort_session_options(options: Any) -> Any:
    """Set an ``onnxruntime.SessionOptions``'s threads from the applied policy."""
    policy = current()
    options.intra_op_num_threads = policy.threads
    options.inter_op_num_threads = 1
    spin = "1" if policy.spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return options
