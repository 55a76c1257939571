"""A TorchScript text model takes integer token ids: TorchScript declares no input types, so ids it
refuses as float32 are fed as int64; perturbation methods run on the tokens and gradient, hook and
rule methods say why they cannot (they need the embedding, which an ONNX export exposes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_torchscript
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec


class _TextLstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 6)
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(ids))
        return self.head(out[:, -1])


IDS = np.array([[3, 7, 1, 12, 5, 9]], np.int64)
METHODS = ("occlusion_1", "shapley_value", "integrated_gradients", "lrp_epsilon")


def _model() -> tuple[nn.Module, bytes]:
    torch.manual_seed(0)
    module = _TextLstm().eval()
    return module, to_torchscript(module, torch.from_numpy(IDS))


def test_token_ids_are_fed_as_int64_and_perturbation_methods_are_judged() -> None:
    module, data = _model()
    spec = JobSpec(kind="audit", players="tokens", baseline="token:0", methods=METHODS, device="cpu")
    prep = prepare(spec, data, "torchscript", {"inputs": IDS})
    with torch.no_grad():
        expected = module(torch.from_numpy(IDS)).numpy()
    np.testing.assert_allclose(prep.full_outputs, expected, rtol=1e-5)
    report = run_audit(prep).report
    entries = {m["name"]: m for m in report["methods"]}
    assert entries["occlusion_1"]["verdict"] != "not_applicable"
    assert entries["shapley_value"]["verdict"] != "not_applicable"
    assert "integer token ids" in entries["integrated_gradients"]["reason"]
    assert "integer token ids" in entries["lrp_epsilon"]["reason"]


def test_a_refused_input_that_is_not_ids_keeps_the_models_own_error() -> None:
    _, data = _model()
    spec = JobSpec(kind="audit", players="tokens", methods=("occlusion_1",), device="cpu")
    with pytest.raises(InvalidInput, match=r"rejected an input of shape \(6,\): .*indices") as caught:
        prepare(spec, data, "torchscript", {"inputs": IDS + 0.5})
    assert "int64" not in str(caught.value)
