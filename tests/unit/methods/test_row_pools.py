"""A sum over a row's axes is pooling for the rule methods, as a mean is (workers/methods/_fx_plan.py):
ResNeSt sums its split-attention branches with a ReduceSum, and LRP refused it. A network that pools
by sum gives the attributions of its twin that pools by mean and scales the next layer's weights by
the pool's size, the same function computed with the other operator."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from workers.methods import AttributionContext, get_method
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

SHAPE = (2, 4, 4)


class _Pooled(nn.Module):
    def __init__(self, by_sum: bool) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.conv, self.head = nn.Conv2d(2, 5, 3, padding=1), nn.Linear(5, 3)
        self.by_sum = by_sum
        if by_sum:
            with torch.no_grad():
                self.head.weight /= SHAPE[1] * SHAPE[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return self.head(h.sum(dim=(2, 3)) if self.by_sum else h.mean(dim=(2, 3)))


X = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(9))
X0 = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(10)) * 0.3


def test_the_exporter_writes_a_reduce_sum() -> None:
    graph = onnx.load_from_string(to_onnx(_Pooled(by_sum=True), X[:1])).graph
    assert "ReduceSum" in {node.op_type for node in graph.node}


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_revealcancel"])
def test_sum_pooling_gives_the_mean_pooling_twins_attributions(name: str) -> None:
    classes = np.array([0, 1, 2, 1])
    reference = np.zeros_like(X.numpy()) if name.startswith(("lrp", "deep_taylor")) else X0.numpy()
    got = [
        get_method(name).attribute(context(_Pooled(by_sum), X[:1]), X.numpy(), reference, classes)
        for by_sum in (True, False)
    ]
    np.testing.assert_allclose(got[0], got[1], rtol=1e-4, atol=1e-6 * float(np.abs(got[1]).max()))
    assert np.abs(got[1]).max() > 0


class _SequenceFirst(nn.Module):
    """(B, L, F) -> Linear -> ReLU -> pooled over the L positions: laid out sequence first (L, B, H)
    and pooled with ``mean(0)``, as code around ``nn.TransformerEncoder`` without ``batch_first``
    pools, or batch first with ``mean(1)``: the same function."""

    def __init__(self, sequence_first: bool) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.embed, self.head = nn.Linear(4, 6), nn.Linear(6, 3)
        self.sequence_first = sequence_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        return self.head(h.transpose(0, 1).mean(0) if self.sequence_first else h.mean(1))


TOKENS = torch.randn(4, 5, 4, generator=torch.Generator().manual_seed(12))


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_rescale"])
@pytest.mark.parametrize("dynamo", [False, True])
def test_a_mean_over_axis_0_that_holds_positions_is_pooling(name: str, dynamo: bool) -> None:
    """workers/models/pooled_rows.py follows the rows to axis 1 there; before, the rules refused the
    mean, taking axis 0 for the batch."""
    classes = np.array([0, 1, 2, 1])
    reference = np.zeros_like(TOKENS.numpy())
    got = [
        get_method(name).attribute(
            context(_SequenceFirst(first), TOKENS[:2], dynamo=dynamo), TOKENS.numpy(), reference, classes
        )
        for first in (True, False)
    ]
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-7)
    assert np.abs(got[1]).max() > 1e-3


def _positions_dynamic(module: nn.Module) -> AttributionContext:
    """``module`` exported with its batch and its positions axis symbolic, as a text model is."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (TOKENS[:2],), buffer, dynamo=False, opset_version=17, input_names=["input"],
            output_names=["output"], dynamic_axes={"input": {0: "batch", 1: "positions"}, "output": {0: "batch"}},
        )  # fmt: skip
    model = load_model(buffer.getvalue(), "onnx", "cpu")
    return AttributionContext(model, parse_players("features", tuple(TOKENS.shape[1:])), Target(), {})


@pytest.mark.parametrize("name", ["lrp_epsilon", "deep_taylor"])
def test_a_mean_over_axis_0_is_pooling_with_the_positions_symbolic(name: str) -> None:
    """The walk reads the symbolic positions axis at a size of its own (workers/models/batch_placement.py)."""
    classes = np.array([0, 1, 2, 1])
    reference = np.zeros_like(TOKENS.numpy())
    got = [
        get_method(name).attribute(
            _positions_dynamic(_SequenceFirst(first)), TOKENS.numpy(), reference, classes
        )
        for first in (True, False)
    ]
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-7)
    assert np.abs(got[1]).max() > 1e-3


class _BatchCentred(nn.Module):
    """Each row less the batch's mean (``x - x.mean(0)``): a mean over the rows themselves."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(13)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x - x.mean(0, keepdim=True)))


def test_a_mean_over_the_rows_is_still_refused() -> None:
    from xaudit.contract.errors import NotApplicable

    x = TOKENS[:, 0]
    with pytest.raises(NotApplicable, match=r"ReduceStaticAxes\[mean\]"):
        get_method("lrp_epsilon").attribute(
            context(_BatchCentred(), x[:2]), x.numpy(), np.zeros_like(x.numpy()), np.array([0, 1, 2, 1])
        )
