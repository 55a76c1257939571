"""The 4x4 digits audit (16 players, order-limited game): verdicts, coverage and the unaudited line.

    .venv/bin/python bench/verdicts_4x4.py [--samples 4]

Above 10 players only sets up to the audit order (3) are enumerated; the effect mass above it is the
audit's unaudited mass, printed on its own line, and never part of a method's coverage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

ASSETS = Path(__file__).resolve().parent.parent / "workers" / "assets"
METHODS = ("integrated_gradients", "deeplift_rescale", "deepshap", "shapley_value")


def audit(samples: int) -> dict[str, object]:
    tensors = {
        "inputs": np.load(ASSETS / "digits_inputs.npy")[:samples],
        "background": np.load(ASSETS / "digits_background.npy"),
    }
    spec = JobSpec(players="grid:4x4", device="cpu", methods=METHODS)
    return run_audit(prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", tensors)).report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    t0 = time.perf_counter()
    report = audit(args.samples)
    from clients._report import verdict_table

    print(f"## 4x4 digits audit, {args.samples} samples, {time.perf_counter() - t0:.0f} s\n")
    print(verdict_table(report))
    for m in report["methods"]:  # type: ignore[union-attr]
        print(f"{m['name']}: {m['verdict']}: {m['reason']}")


if __name__ == "__main__":
    main()
