"""A TorchScript text model takes integer token ids: TorchScript declares no input types, so ids it
refuses as float32 are fed as int64; perturbation methods run on the tokens and gradient, hook and
rule methods say why they cannot (they need the embedding, which an ONNX export exposes). ``xaudit
inspect`` finds the ids in the graph (the input indexes aten::embedding) and says the same first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from clients.cli.main import main
from tests.models import to_torchscript
from workers.audit import run_audit
from workers.inspect_model import inspect_model
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


def test_inspect_finds_the_token_ids_and_suggests_a_command_that_runs(tmp_path: Path) -> None:
    _, data = _model()
    check = inspect_model(data, str(tmp_path / "m.pt"))
    assert check.inputs[0]["dtype"] == "int64"
    refused = {m for m, why in check.methods.items() if why.startswith("not applicable")}
    assert {"integrated_gradients", "lrp_epsilon", "grad_cam", "saliency"} <= refused
    assert {"occlusion_1", "shapley_value"} <= set(check.runnable())
    assert " --players tokens " in check.command
    # The suggested command runs, and the audit refuses exactly what inspect said it would.
    (tmp_path / "m.pt").write_bytes(data)
    np.save(tmp_path / "inputs.npy", IDS)
    command = check.command.replace("inputs.npy", str(tmp_path / "inputs.npy"))
    command = command.replace("report.json", str(tmp_path / "report.json")).split()[1:]
    assert main(command) == 0

    report = json.loads((tmp_path / "report.json").read_text())
    audited = {m["name"]: m["reason"] for m in report["methods"]}
    # inspect also lists saliency and smoothgrad, which `--methods all` (the paper's 14) leaves out
    refused_here = {name: why for name, why in audited.items() if "integer token ids" in why}
    no_background = {name for name, why in audited.items() if "background" in why}  # checked first
    assert set(refused_here) == (refused & set(audited)) - no_background
    for name, why in refused_here.items():  # in the audit's own words
        assert check.methods[name] == f"not applicable: {why}", name
    judged = {m["name"] for m in report["methods"] if m["verdict"] != "not_applicable"}
    assert judged == set(audited) - refused - no_background
    # An image model's input feeds a convolution: not ids.
    image = to_torchscript(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten()).eval(), torch.zeros(1, 1, 4, 4))
    assert inspect_model(image).inputs[0]["dtype"] == "float32"
