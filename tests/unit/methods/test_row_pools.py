"""A sum over a row's axes is pooling for the rule methods, as a mean is (workers/methods/_fx_plan.py):
ResNeSt sums its split-attention branches with a ReduceSum, and LRP refused it. A network that pools
by sum gives the attributions of its twin that pools by mean and scales the next layer's weights by
the pool's size, the same function computed with the other operator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from workers.methods import get_method

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
