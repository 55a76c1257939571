"""Cost of the model sandbox on the digits demo's audit: in-process ``run_job`` against
``run_sandboxed`` with a child forked by the zygote (what a worker does by default), with a
prewarmed spawned child (XAUDIT_SANDBOX_FORKSERVER=0) and with a cold one; then the per-job cost of
a burst of tiny jobs (one gradient of a 6-feature MLP, the load test's job) run back to back,
spawned against forked: wall seconds and CPU seconds of the whole process tree per job.

    python -m bench.sandbox_overhead [--repeats 5] [--burst 10]

Prints the median seconds of each (timed alternately with the in-process run, so drifting machine
load hits both) and the ratios. The child loads the model once per job and runs every evaluation
of the job in that one process; its overhead is the start (a fork, or a spawn hidden by the spare
child when jobs are far enough apart), the confinement, the model load and the pickled inputs and
results. A burst shows what the spare does not hide: each spawned child imports the compute core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tests.models import MLP_FEATURES, relu_mlp, to_onnx
from workers import sandbox
from workers.jobs import run_job
from xaudit.contract.spec import JobSpec

ASSETS = Path(__file__).resolve().parents[1] / "workers" / "assets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default="", help="comma-separated (default: the demo's, all of them)")
    parser.add_argument("--burst", type=int, default=10, help="tiny jobs back to back, per mode")
    args = parser.parse_args()
    model = (ASSETS / "digits_cnn.onnx").read_bytes()
    tensors = {
        "inputs": np.load(ASSETS / "digits_inputs.npy"),
        "background": np.load(ASSETS / "digits_background.npy"),
    }
    spec = JobSpec(kind="audit", players="grid:2x4", device="cpu")
    if args.methods:
        spec = JobSpec(kind="audit", players="grid:2x4", methods=tuple(args.methods.split(",")), device="cpu")

    def inproc() -> None:
        run_job(spec, model, "onnx", tensors)

    def warm() -> None:
        sandbox.run_sandboxed(spec, model, "onnx", tensors)

    inproc()
    _mode(spawn=False)
    sandbox.prewarm()  # the zygote
    _mode(spawn=True)
    sandbox.prewarm()  # the spare
    time.sleep(5)
    for spawn in (False, True):
        _mode(spawn)
        warm()  # the first job of each mode; a spawned job starts the next spare
    a, b, f = [], [], []
    for _ in range(args.repeats):
        time.sleep(5)  # as between a worker's jobs: the next spare finishes its imports
        for fn, out in ((inproc, a), (_in_mode(False, warm), f), (_in_mode(True, warm), b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    cold = []
    _mode(spawn=True)
    for _ in range(max(1, args.repeats // 2)):
        sandbox._take_process().close()  # no spare: the job waits for the child's imports
        os.environ["XAUDIT_SANDBOX_PREWARM"] = "0"
        t0 = time.perf_counter()
        warm()
        cold.append(time.perf_counter() - t0)
        os.environ["XAUDIT_SANDBOX_PREWARM"] = "1"
    ip, w, c, fk = (statistics.median(v) for v in (a, b, cold, f))
    print(
        f"digits demo audit ({len(tensors['inputs'])} images, players grid:2x4, {len(spec.methods)} methods)"
    )
    print(f"in-process run_job        {ip:8.3f} s")
    print(f"sandboxed, forked         {fk:8.3f} s   x{fk / ip:.2f}   (+{fk - ip:.3f} s)")
    print(f"sandboxed, spawn, spare   {w:8.3f} s   x{w / ip:.2f}   (+{w - ip:.3f} s)")
    print(f"sandboxed, spawn, cold    {c:8.3f} s   x{c / ip:.2f}   (+{c - ip:.3f} s)")
    _burst(args.burst)


def _mode(spawn: bool) -> None:
    os.environ["XAUDIT_SANDBOX_FORKSERVER"] = "0" if spawn else "1"


def _in_mode(spawn: bool, fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        _mode(spawn)
        fn()

    return run


def _tree_cpu() -> float:
    """CPU seconds of this process, its reaped children and the zygote with its reaped children."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    zygote = sandbox._zygote
    if zygote is not None and zygote.alive():
        fields = Path(f"/proc/{zygote.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime..cstime
    return total


def _burst(jobs: int) -> None:
    """Tiny jobs back to back: per job, the wall and the CPU the sandbox adds to the job itself."""
    spec = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
    model = to_onnx(relu_mlp(0), torch.zeros(2, MLP_FEATURES))
    x = {"inputs": np.random.default_rng(0).normal(size=(1, MLP_FEATURES)).astype(np.float32)}
    rows = []
    for label, spawn in (("forked", False), ("spawn, spare", True)):
        _mode(spawn)
        sandbox.run_sandboxed(spec, model, "onnx", x)
        time.sleep(5)  # the zygote or the next spare is ready
        walls, cpus = [], []
        for _ in range(jobs):
            t0, c0 = time.perf_counter(), _tree_cpu()
            sandbox.run_sandboxed(spec, model, "onnx", x)
            walls.append(time.perf_counter() - t0)
            cpus.append(_tree_cpu() - c0)
        rows.append((label, statistics.median(walls), sum(walls) / jobs, sum(cpus) / jobs))
    print(f"\n{jobs} tiny jobs back to back (one gradient, 6-feature MLP)")
    for label, median, mean, cpu in rows:
        print(f"{label:14s} wall median {median:7.3f} s  mean {mean:7.3f} s   CPU {cpu:7.3f} s per job")


if __name__ == "__main__":
    main()
