"""Build the demo assets once: a small ReLU CNN trained on scikit-learn's bundled digits (no download).

Outputs, committed beside this script and shipped as package data:
- ``digits_cnn.onnx``: 1x8x8 inputs in [0, 1] -> 10 logits; opset 17, dynamic batch, TorchScript exporter.
- ``digits_inputs.npy``: 4 test images, (4, 1, 8, 8) float32.
- ``digits_background.npy``: 16 training images, (16, 1, 8, 8) float32.
- ``digits_cnn.json``: what the model is, its sha256 and test accuracy.

Run: ``.venv/bin/python workers/assets/build_demo.py`` (seeded; about a minute on one CPU core).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

__all__ = ["build", "digits_cnn"]

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SEED = 0


def digits_cnn() -> nn.Module:
    # No pooling: every method applies (Grad-CAM finds the last conv layer, DeepLIFT needs no max rule).
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    # Pixel values are 0..16 in the bundled set.
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y)
    return x_train, x_test, y_train, y_test


def _train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int) -> None:
    gen = torch.Generator().manual_seed(SEED)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Decay the step size: a constant one leaves the last epochs noisy on 1.3k samples.
    steps = epochs * ((len(xt) + 63) // 64)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for start in range(0, len(xt), 64):
            idx = order[start : start + 64]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss) * len(idx)
        logger.info("epoch %d loss %.4f", epoch, total / len(xt))
    model.eval()


def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((pred == y).mean())


def _to_onnx(model: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.zeros(2, 1, 8, 8),),
        buf,  # type: ignore[arg-type]  # the TorchScript exporter writes to file objects; the stub says paths
        dynamo=False,
        opset_version=17,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
    )
    return buf.getvalue()


def build(out_dir: Path = HERE, epochs: int = 40) -> float:
    """Train, check, export; returns the test accuracy."""
    torch.manual_seed(SEED)
    x_train, x_test, y_train, y_test = _data()
    model = digits_cnn()
    _train(model, x_train, y_train, epochs)
    acc = _accuracy(model, x_test, y_test)
    if acc < 0.95:
        raise SystemExit(f"test accuracy {acc:.3f} is below 0.95; not writing the assets")
    onnx_bytes = _to_onnx(model)

    # The exported graph must compute what torch computes, on any batch size.
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x_test[:5]})[0]
    with torch.no_grad():
        want = model(torch.from_numpy(x_test[:5])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    # One correctly classified test image of four different classes: the demo explains predictions
    # the model gets right, and the report shows several classes.
    with torch.no_grad():
        pred = model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    picks = [int(np.flatnonzero((y_test == cls) & (pred == cls))[0]) for cls in (0, 3, 7, 8)]
    inputs = np.ascontiguousarray(x_test[picks], dtype=np.float32)
    background = np.ascontiguousarray(x_train[:16], dtype=np.float32)

    (out_dir / "digits_cnn.onnx").write_bytes(onnx_bytes)
    np.save(out_dir / "digits_inputs.npy", inputs)
    np.save(out_dir / "digits_background.npy", background)
    # Provenance for the demo's output and for readers: what the shipped model is and how good it is.
    about = {
        "model": "digits_cnn.onnx",
        "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
        "architecture": "Conv(1->8,3x3)-ReLU-Conv(8->16,3x3,stride 2)-ReLU-Linear(256->32)-ReLU-Linear(32->10)",
        "data": "sklearn.datasets.load_digits, pixels / 16, 75/25 stratified split (random_state 0)",
        "input_shape": [1, 8, 8],
        "test_accuracy": round(acc, 4),
        "epochs": epochs,
        "seed": SEED,
        "inputs": {"file": "digits_inputs.npy", "classes": [0, 3, 7, 8], "split": "test"},
        "background": {"file": "digits_background.npy", "count": int(background.shape[0]), "split": "train"},
    }
    (out_dir / "digits_cnn.json").write_text(json.dumps(about, indent=2) + "\n")
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    acc = build(args.out, args.epochs)
    print(f"test accuracy {acc:.4f}; wrote the model, inputs and background to {args.out}")


if __name__ == "__main__":
    main()
