"""Verdicts of the deterministic methods on the 8-player digits CNN and a 10-feature tabular MLP.

    .venv/bin/python bench/verdicts_check.py [--out verdicts.json]

Prints one line per (model, method): verdict and criterion scores; with --out, writes them as JSON so
that two trees can be compared (the verdicts must not change between releases unless a finding says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.models import relu_mlp, to_onnx
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import FOURTEEN_METHODS, JobSpec

ASSETS = Path(__file__).resolve().parent.parent / "workers" / "assets"
DETERMINISTIC = tuple(m for m in FOURTEEN_METHODS if m != "expected_gradients")


def _digits() -> dict[str, object]:
    tensors = {
        "inputs": np.load(ASSETS / "digits_inputs.npy")[:4],
        "background": np.load(ASSETS / "digits_background.npy"),
    }
    spec = JobSpec(players="grid:2x4", device="cpu", methods=DETERMINISTIC)
    return run_audit(prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", tensors)).report


def _tabular() -> dict[str, object]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 10, generator=gen)
    background = torch.randn(8, 10, generator=gen).numpy()
    model = to_onnx(relu_mlp(3, features=10, hidden=(16, 8)), x)
    spec = JobSpec(players="features", device="cpu", methods=DETERMINISTIC)
    return run_audit(prepare(spec, model, "onnx", {"inputs": x.numpy(), "background": background})).report


def measure() -> dict[str, dict[str, object]]:
    """model/method -> verdict and criterion scores."""
    out: dict[str, dict[str, object]] = {}
    for name, build in (("digits-2x4", _digits), ("tabular-10", _tabular)):
        report = build()
        for m in report["methods"]:  # type: ignore[union-attr]
            scores = {c: round(v["score"], 4) for c, v in (m.get("criteria") or {}).items()}
            out[f"{name}/{m['name']}"] = {"verdict": m["verdict"], "scores": scores}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = measure()
    for key, value in out.items():
        print(f"{key:40} {value['verdict']:15} {value['scores']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
