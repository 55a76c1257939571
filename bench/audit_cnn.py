"""Audit of all fourteen methods on a small CNN (8x8 input, 8 players, 4 samples), per-method times.

    .venv/bin/python bench/audit_cnn.py [--repeats 1]

The model is the shipped digits CNN (trained on scikit-learn's bundled digits); players grid:2x4.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workers.audit import run_audit
from workers.prepare import prepare
from workers.spec import FOURTEEN_METHODS, JobSpec

ASSETS = Path(__file__).resolve().parent.parent / "workers" / "assets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    tensors = {
        "inputs": np.load(ASSETS / "digits_inputs.npy")[:4],
        "background": np.load(ASSETS / "digits_background.npy"),
    }
    model = (ASSETS / "digits_cnn.onnx").read_bytes()
    totals, per_method = [], {}
    report = {}
    for _ in range(args.repeats):
        spec = JobSpec(players="grid:2x4", device="cpu", methods=FOURTEEN_METHODS)
        t0 = time.perf_counter()
        report = run_audit(prepare(spec, model, "onnx", tensors)).report
        totals.append(time.perf_counter() - t0)
        for m in report["methods"]:
            per_method.setdefault(m["name"], []).append(m["seconds"])
    print(
        f"## Audit: 14 methods, digits CNN 1x8x8, 8 players (grid:2x4), 4 samples, {len(report['game']['players'])} players"
    )
    print(f"total wall time (median of {args.repeats}): {statistics.median(totals):.1f} s\n")
    print("| method | verdict | seconds |")
    print("|---|---|---:|")
    for m in report["methods"]:
        print(f"| {m['name']} | {m['verdict']} | {statistics.median(per_method[m['name']]):.2f} |")


if __name__ == "__main__":
    main()
