"""The normalisations both exporters write out run as one operator in the methods' graph
(workers/models/norm_fusion.py): RMS norms (Pow, ReduceMean, Add, Sqrt, a reciprocal) as ``RMSNorm``,
layer norms written by hand (the same after ``x - mean(x)``) as ``Standardize``, with the same
outputs and gradients; a mean over another axis, a different power, or a centred value read
elsewhere is left as written."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.models._fusions import assert_fused_as_written, lifted
from workers.models.norm_fusion import fuse_norms


class _Normed(nn.Module):
    """Two RMS norms as Llama writes them (x * rsqrt(...), a weight), one as x / sqrt(...), and two
    look-alikes that are not RMS norms: over the tokens' axis, and a cube."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.weight = nn.Parameter(1 + 0.5 * torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        h = torch.relu(self.b(h))
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6)  # over the tokens: not fused
        h = h * torch.rsqrt(h.pow(3).mean(-1, keepdim=True).abs() + 1e-6)  # a cube: not fused
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.head(h.mean(1))


class _Standardized(nn.Module):
    """Two layer norms written by hand, over the channels of an NCHW tensor (ConvNeXt's) and over the
    last axis with ``x - u`` written twice, and three look-alikes: a centre over another axis than the
    variance's, a centred value the block also adds back, and an RMS over the channels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.a, self.head = nn.Conv2d(2, 6, 3, padding=1), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        d = h - h.mean(1, keepdim=True)
        h = d / torch.sqrt(d.pow(2).mean(1, keepdim=True) + 1e-6)
        h = torch.relu(h)
        h = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(
            (h - h.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + 1e-5
        )
        d = h - h.mean(2, keepdim=True)
        h = d * torch.rsqrt(d.pow(2).mean(1, keepdim=True) + 1e-5)  # centre and spread: other axes
        d = h - h.mean(1, keepdim=True)
        h = d * torch.rsqrt(d.pow(2).mean(1, keepdim=True) + 1e-5) + d  # the centred value read again
        h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6)  # an RMS over the channels
        return self.head(h.mean((2, 3)))


class _Responses(nn.Module):
    """timm's global response norm (ConvNeXt V2) channels first, and channels last after a permute, as
    its MLP blocks run it."""

    def __init__(self) -> None:
        super().__init__()
        from timm.layers.grn import GlobalResponseNorm

        torch.manual_seed(5)
        self.a, self.head = nn.Conv2d(2, 6, 3, padding=1), nn.Linear(6, 3)
        self.first, self.last = GlobalResponseNorm(6, channels_last=False), GlobalResponseNorm(6)
        with torch.no_grad():
            for grn in (self.first, self.last):
                grn.weight.normal_()
                grn.bias.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(torch.relu(self.a(x)))
        h = self.last(h.permute(0, 2, 3, 1))
        return self.head(h.mean((1, 2)))


# Each model: its input's shape and seed, how many nodes are fused into which operator, and what
# look-alike operator is left how many times (each comment in the model says why).
CASES = {
    "rms": (_Normed, (4, 5, 6), 3, 3, "RMSNorm", "Pow", 2),  # the tokens' and the cube's
    "written": (_Standardized, (4, 2, 5, 5), 6, 2, "Standardize", "Pow", 3),  # the three look-alikes'
    "response": (_Responses, (4, 2, 5, 5), 7, 2, "ResponseScale", "ReduceL2", 0),
}


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_norms_give_onnxruntimes_outputs_and_the_same_gradients(
    case: str, dynamo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, shape, seed, count, op, left, left_count = CASES[case]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    proto = onnx.load_from_string(to_onnx(model().eval(), x[:2], opset=18 if dynamo else 17, dynamo=dynamo))
    copy = lifted(proto)
    assert fuse_norms(copy) == count
    assert [n.op_type for n in copy.graph.node].count(op) == count
    assert sum(n.op_type == left for n in copy.graph.node) == left_count
    assert_fused_as_written(proto, x, "fuse_norms", op, count, monkeypatch)


class _Variances(nn.Module):
    """Layer norms written with ``x.var()`` over the input's last axis (the input's rank is declared,
    the centred value's is not: the two axes are counted apart) and with ``torch.var_mean`` after a
    layer. The legacy exporter centres the variance on a mean of its own and squares by a product."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.a, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        h = self.a(h)
        v, u = torch.var_mean(h, -1, keepdim=True, unbiased=False)
        return self.head(((h - u) * torch.rsqrt(v + 1e-6)).mean(1))


def test_layer_norms_written_with_variances_fuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The legacy exporter's; the dynamo exporter writes a Reshape after the variance's mean and
    var_mean as a ReduceSum over a count, which stay as written (README)."""
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(7))
    proto = onnx.load_from_string(to_onnx(_Variances().eval(), x[:2]))
    copy = lifted(proto)
    assert fuse_norms(copy) == 2
    assert [n.op_type for n in copy.graph.node].count("Standardize") == 2
    assert_fused_as_written(proto, x, "fuse_norms", "Standardize", 2, monkeypatch)
