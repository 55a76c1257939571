"""Game throughput (masked inputs per second) against raw batched onnxruntime inference, and exact
Shapley values against shap's ExactExplainer, in one run on one model.

    .venv/bin/python bench/game_throughput.py [--repeats 5]

Ratios compare numbers measured in this same run, so machine load affects both sides alike.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import median_seconds, paired_medians
from workers.game import masked_inputs, play
from workers.models import load_model
from workers.players import parse_players
from workers.targets import parse_target

ASSETS = Path(__file__).resolve().parent.parent / "workers" / "assets"


def game_vs_raw(repeats: int) -> None:
    data = (ASSETS / "digits_cnn.onnx").read_bytes()
    model = load_model(data, "onnx", "cpu")
    x = np.load(ASSETS / "digits_inputs.npy")[:1]
    players = parse_players("grid:4x4", x.shape[1:])  # 2^16 = 65536 masked inputs
    target = parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.zeros_like(x)
    rows = 2**players.n
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    # The same masked inputs, generated beforehand: raw inference of exactly the game's work.
    masked = masked_inputs(x[0], base[0], players, np.arange(rows, dtype=np.uint64))
    step = model.batch_size

    def raw() -> None:
        for start in range(0, rows, step):
            session.run(None, {name: masked[start : start + step]})

    t_raw, t_game = paired_medians(raw, lambda: play(model, x, base, players, target, classes), repeats)
    print(
        f"## Game throughput: digits CNN (1x8x8), 16 players, {rows} masked inputs, batch {model.batch_size}"
    )
    print("| | masked inputs/s | seconds |")
    print("|---|---:|---:|")
    print(f"| raw onnxruntime inference | {rows / t_raw:,.0f} | {t_raw:.3f} |")
    print(f"| xaudit game (mask + infer + Moebius) | {rows / t_game:,.0f} | {t_game:.3f} |")
    print(f"| game / raw | {t_raw / t_game:.0%} | |")


def _shapley_row(n: int, repeats: int) -> str:
    import shap
    import torch

    from tests.models import relu_mlp, to_onnx  # built here, no download

    module = relu_mlp(0, features=n, hidden=(32, 16))
    x = np.random.default_rng(n).normal(size=(1, n)).astype(np.float32)
    model = load_model(to_onnx(module, torch.from_numpy(x)), "onnx", "cpu")
    players = parse_players("features", x.shape[1:])
    target = parse_target("class:0")
    classes = np.zeros(1, dtype=np.int64)
    base = np.zeros_like(x)
    ours = play(model, x, base, players, target, classes).shapley()[0]
    t_ours = median_seconds(lambda: play(model, x, base, players, target, classes).shapley(), repeats)

    def f(z: np.ndarray) -> np.ndarray:
        return model.predict(z.astype(np.float32))[:, 0]

    explainer = shap.explainers.Exact(f, shap.maskers.Independent(base, max_samples=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = explainer(x).values[0]  # also the warm-up (numba compiles shap's kernels once)
        t_shap = median_seconds(lambda: explainer(x), max(1, repeats // 2), warmup=0)
    diff = float(np.abs(ours - theirs).max())
    return f"| {n} | {t_ours:.4f} | {t_shap:.4f} | {t_shap / t_ours:.1f}x | {diff:.1e} |"


def shapley_vs_shap(repeats: int) -> None:
    print("\n## Exact Shapley values: xaudit (one batched game + Moebius) vs shap.explainers.Exact")
    print("| players n | xaudit s | shap Exact s | speed-up | max abs diff |")
    print("|---:|---:|---:|---:|---:|")
    for n in (8, 10, 12, 14):
        print(_shapley_row(n, repeats))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    game_vs_raw(args.repeats)
    shapley_vs_shap(args.repeats)
