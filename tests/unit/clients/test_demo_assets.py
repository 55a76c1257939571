"""The demo's shipped model and data are what workers/assets/digits_cnn.json says they are."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

ASSETS = Path(__file__).resolve().parents[3] / "workers" / "assets"


def test_assets_match_their_description() -> None:
    about = json.loads((ASSETS / "digits_cnn.json").read_text())
    model = (ASSETS / "digits_cnn.onnx").read_bytes()
    assert hashlib.sha256(model).hexdigest() == about["sha256"]
    assert about["test_accuracy"] >= 0.95

    inputs = np.load(ASSETS / "digits_inputs.npy")
    background = np.load(ASSETS / "digits_background.npy")
    assert inputs.dtype == background.dtype == np.float32
    assert inputs.shape == (4, 1, 8, 8) and background.shape == (16, 1, 8, 8)
    assert inputs.min() >= 0.0 and inputs.max() <= 1.0 and background.max() <= 1.0

    # Dynamic batch, and every demo input is classified as the digit it shows.
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": inputs})[0]
    assert logits.shape == (4, 10)
    assert logits.argmax(axis=1).tolist() == about["inputs"]["classes"]
    assert session.run(None, {"input": background})[0].shape == (16, 10)
