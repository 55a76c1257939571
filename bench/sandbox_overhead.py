"""Cost of the model sandbox on the digits demo's audit: in-process ``run_job`` against
``run_sandboxed`` with a prewarmed child (what a worker does) and with a cold one.

    python -m bench.sandbox_overhead [--repeats 5]

Prints the median seconds of each (timed alternately with the in-process run, so drifting machine
load hits both) and the ratios. The child loads the model once per job and runs every evaluation
of the job in that one process; its overhead is the start (hidden by the spare child), the
confinement, the model load and the pickled inputs and results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from workers import sandbox
from workers.jobs import run_job
from xaudit.contract.spec import JobSpec

ASSETS = Path(__file__).resolve().parents[1] / "workers" / "assets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default="", help="comma-separated (default: the demo's, all of them)")
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
    sandbox.prewarm()
    time.sleep(5)
    warm()  # the first job, in the spare started above; each job starts the next spare
    a, b = [], []
    for _ in range(args.repeats):
        time.sleep(5)  # as between a worker's jobs: the next spare finishes its imports
        for fn, out in ((inproc, a), (warm, b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    cold = []
    for _ in range(max(1, args.repeats // 2)):
        sandbox._take_process().close()  # no spare: the job waits for the child's imports
        os.environ["XAUDIT_SANDBOX_PREWARM"] = "0"
        t0 = time.perf_counter()
        warm()
        cold.append(time.perf_counter() - t0)
        os.environ["XAUDIT_SANDBOX_PREWARM"] = "1"
    ip, w, c = statistics.median(a), statistics.median(b), statistics.median(cold)
    print(
        f"digits demo audit ({len(tensors['inputs'])} images, players grid:2x4, {len(spec.methods)} methods)"
    )
    print(f"in-process run_job        {ip:8.3f} s")
    print(f"sandboxed, prewarmed      {w:8.3f} s   x{w / ip:.2f}   (+{w - ip:.3f} s)")
    print(f"sandboxed, cold child     {c:8.3f} s   x{c / ip:.2f}   (+{c - ip:.3f} s)")


if __name__ == "__main__":
    main()
