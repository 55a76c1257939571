"""Scale: the audit's time and peak memory as players and samples grow, each case in a fresh process.

    python -m bench.scale [--sections players,digits64,dataset] [--players 16,64,256] [--samples 2]
                          [--dataset-sizes 50,100,250,500] [--steps 16]

- players: a small CNN on 1x16x16 inputs (random weights, seeded, exported here; the inputs are
  the shipped digits upsampled 2x) audited with
  grid:4x4, grid:8x8 and grid:16x16 players (16, 64, 256); above 10 players the audit samples sets
  (workers.audit.sets), so memory should follow the sets audited, not 2^n;
- digits64: the acceptance case, the shipped digits CNN with every pixel a player (grid:8x8 on 8x8),
  Integrated Gradients (default 64 steps), DeepLIFT, Gradient x Input, Occlusion-1 and Shapley;
- dataset: the digits CNN, 8 players, on 50..500 samples of scikit-learn's bundled digits (no
  download), streamed in batches (workers.audit.dataset): peak memory should stay flat.

Peak memory is the process's maximum resident set size (ru_maxrss), after imports and model
loading ("before") and at the end ("peak"). Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "workers" / "assets"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{ROOT / 'proto'}"}
FIVE = ("integrated_gradients", "deeplift_rescale", "gradient_x_input", "occlusion_1", "shapley_value")


def _grid_cnn(path: Path) -> None:
    """A ReLU CNN on 1x16x16 with seeded random weights, as ONNX."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 8 * 8, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    ).eval()
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 16, 16),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )


def _child(case: dict[str, Any]) -> dict[str, Any]:
    """Run one audit in this (fresh) process and measure it."""
    import resource
    import time

    import numpy as np

    from workers.audit import run_audit
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    if case["inputs"] == "digits":
        inputs = np.load(ASSETS / "digits_inputs.npy")[: case["samples"]]
    elif case["inputs"] == "sklearn":
        from sklearn.datasets import load_digits

        images = (load_digits().images / 16.0).astype(np.float32)[:, None]
        inputs = images[np.random.default_rng(0).permutation(len(images))[: case["samples"]]]
    else:  # digits upsampled to 16x16
        digits = np.concatenate(
            [np.load(ASSETS / "digits_inputs.npy"), np.load(ASSETS / "digits_background.npy")]
        )
        inputs = np.kron(digits[: case["samples"]], np.ones((1, 1, 2, 2), dtype=np.float32))
    params = {"integrated_gradients": {"steps": case["steps"]}} if case.get("steps") else {}
    spec = JobSpec(
        players=case["players"], device="cpu", methods=tuple(case["methods"]), method_params=params
    )
    prep = prepare(spec, Path(case["model"]).read_bytes(), "onnx", {"inputs": inputs})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    report = run_audit(prep).report
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sets = report["game"].get("audited_sets") or {}
    return {
        "players": report["game"]["n"],
        "samples": len(inputs),
        "sub_inputs": sets.get("sub_inputs", 2 ** report["game"]["n"]),
        "sets": [(r["order"], r["audited"], r["sets"]) for r in sets.get("by_order", [])],
        "seconds": seconds,
        "before_mb": before,
        "peak_mb": peak,
        "verdicts": {m["name"]: m["verdict"] for m in report["methods"]},
        "reasons": {m["name"]: m["reason"] for m in report["methods"]},
        "method_seconds": {m["name"]: round(m.get("seconds", 0.0), 1) for m in report["methods"]},
        "scores": {
            m["name"]: {c: round(v["score"], 4) for c, v in m.get("criteria", {}).items()}
            for m in report["methods"]
        },
        "unaudited": (report["game"].get("unaudited") or {}).get("share"),
    }


def _run(case: dict[str, Any], timeout: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--child", json.dumps(case)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"case {case} failed: {out.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def _table(rows: list[dict[str, Any]], title: str) -> None:
    print(f"\n### {title}\n")
    print(
        "| players | samples | sub-inputs / sample | sets (order: audited of all) | seconds | RSS before audit (MB) | peak RSS (MB) | verdicts |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        sets = "; ".join(f"{o}: {a} of {n}" for o, a, n in r["sets"]) or "all 2^n"
        verdicts = ", ".join(f"{k} {v} ({r['method_seconds'][k]} s)" for k, v in r["verdicts"].items())
        print(
            f"| {r['players']} | {r['samples']} | {r['sub_inputs']} | {sets} | {r['seconds']:.1f} | "
            f"{r['before_mb']:.0f} | {r['peak_mb']:.0f} | {verdicts} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sections", default="players,digits64,dataset")
    parser.add_argument("--players", default="16,64,256")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--steps", type=int, default=32, help="IG steps in the players and dataset sections")
    parser.add_argument("--dataset-sizes", default="50,100,250,500")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    sections = args.sections.split(",")
    print("## Scale: players and samples (fresh process per row, one thread)")
    if "players" in sections:
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "grid_cnn.onnx"
            _grid_cnn(model)
            side = {16: "4x4", 64: "8x8", 256: "16x16"}
            rows = [
                _run(
                    {
                        "inputs": "digits16",
                        "model": str(model),
                        "players": f"grid:{side[int(n)]}",
                        "samples": args.samples,
                        "methods": FIVE,
                        "steps": args.steps,
                    },
                    args.timeout,
                )
                for n in args.players.split(",")
            ]
        _table(rows, f"CNN 1x16x16, five methods (IG {args.steps} steps), {args.samples} samples")
    if "digits64" in sections:
        case = {"inputs": "digits", "model": str(ASSETS / "digits_cnn.onnx"), "players": "grid:8x8",
                "samples": 4, "methods": FIVE}  # fmt: skip
        row = _run(case, args.timeout)
        _table([row], "Digits CNN, every pixel a player (grid:8x8), 4 samples, five methods (IG 64 steps)")
        print("\nscores: " + json.dumps(row["scores"]) + f"\nunaudited share: {row['unaudited']}")
        print("seconds per method: " + json.dumps(row["method_seconds"]))
    if "dataset" in sections:
        rows = [
            _run(
                {
                    "inputs": "sklearn",
                    "model": str(ASSETS / "digits_cnn.onnx"),
                    "players": "grid:2x4",
                    "samples": int(size),
                    "methods": FIVE,
                    "steps": args.steps,
                },
                args.timeout,
            )
            for size in args.dataset_sizes.split(",")
        ]
        _table(rows, f"Digits CNN, 8 players, data sets streamed in batches of 32 (IG {args.steps} steps)")


if __name__ == "__main__":
    main()
