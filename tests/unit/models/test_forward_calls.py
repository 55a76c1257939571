"""Forward calls hold a bounded number of input elements (workers/models/base.py, FORWARD_ELEMENTS),
a token model's counted at its embedding output: at a fixed 256 rows per call onnxruntime held 1.7 GB
of activations for resnet18 at 224x224, and about 10 GB for a BERT of width 256 at 512 tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workers.models.base as base
from tests.models import to_onnx, to_torchscript
from tests.unit.multi_input.models import tiny_token_job
from workers.game import play
from workers.models import load_model


def _recorded_calls(monkeypatch: pytest.MonkeyPatch, module: str) -> list[tuple[int, int]]:
    """(rows, calls) of every predict of the adapters in ``module``."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(f"{module}.count_forward", lambda rows, batches=1: calls.append((rows, batches)))
    return calls


def test_a_token_models_forward_calls_count_its_embedding(monkeypatch: pytest.MonkeyPatch) -> None:
    prep = tiny_token_job()
    assert prep.model.embedding is not None and prep.model.embedding.width == 16
    monkeypatch.setattr(base, "FORWARD_ELEMENTS", 6 * 16 * 10)  # ten rows of embeddings, 160 of ids
    calls = _recorded_calls(monkeypatch, "workers.models.named")
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    assert game.values.shape == (1, 64)
    assert sum(rows for rows, _ in calls) == 64
    assert all(-(-rows // 10) == batches for rows, batches in calls)  # ten rows per onnxruntime call


@pytest.mark.parametrize("form", ["onnx", "torchscript"])
def test_large_inputs_take_few_rows_per_call(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = nn.Sequential(nn.Conv2d(3, 2, 16, stride=16), nn.Flatten(), nn.LazyLinear(3))
    x = torch.rand(64, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    module(x[:1])
    data = to_onnx(module, x[:2]) if form == "onnx" else to_torchscript(module, x[:2])
    model = load_model(data, form, device="cpu")
    assert model.rows_per_call(3 * 224 * 224) == 27  # 2**22 elements, below the batch size 256
    calls = _recorded_calls(monkeypatch, f"workers.models.{form}_model")
    out = model.predict(x.numpy())
    assert calls == [(64, 3)]
    with torch.no_grad():
        np.testing.assert_allclose(out, module(x).numpy(), rtol=1e-4, atol=1e-5)
