"""A model exported with a fixed batch of several rows, as ``torch.onnx.export(model, (x,), path)``
writes it by default from an example of, say, three images: every shape pins the batch of 3, which
workers/models/rebatch.py does not widen (it widens a batch of 1 only). The game runs three rows per
call. LRP, alpha-beta, Deep Taylor and Grad-CAM were refused ("no single graph call over all rows");
they now run the graph three rows at a time, the last call filled up with copies of its last row
(workers.methods._base.in_row_chunks), and give the attributions of the model's dynamic-batch twin.
The methods that need one call over all rows still say why they cannot run."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.explain import explain
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

CHUNKED = ("lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "grad_cam")


def _cnn() -> nn.Module:
    torch.manual_seed(91)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5),
    ).eval()  # fmt: skip


def _pinned(module: nn.Module, example: torch.Tensor, opset: int, dynamo: bool) -> bytes:
    """The export's defaults: no dynamic axes, the example's batch written into every shape."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), buffer, dynamo=dynamo, opset_version=opset)
    return buffer.getvalue()


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_rule_methods_and_grad_cam_run_a_fixed_batch_chunk_by_chunk(dynamo: bool) -> None:
    x = torch.rand(5, 3, 8, 8, generator=torch.Generator().manual_seed(92))  # 5 rows: a short last chunk
    opset = 20 if dynamo else 17
    fixed, twin = _pinned(_cnn(), x[:3], opset, dynamo), to_onnx(_cnn(), x[:3], opset=opset, dynamo=dynamo)
    spec = JobSpec(players="grid:2x2", device="cpu")
    pinned, free = (prepare(spec, data, None, {"inputs": x.numpy()}) for data in (fixed, twin))
    assert pinned.model.explained.fixed_batch == 3, "the case needs the batch pinned"
    got, want = (explain(p, CHUNKED) for p in (pinned, free))
    assert not got.not_applicable, got.not_applicable
    for name in CHUNKED:
        assert np.abs(want.attributions[name]).max() > 1e-4, name
        np.testing.assert_allclose(got.attributions[name], want.attributions[name], rtol=1e-4, atol=1e-6)
    refused = explain(pinned, ("deeplift_rescale",)).not_applicable
    assert "fixed batch of 3" in refused["deeplift_rescale"]
