"""DeepLIFT Rescale on Captum's path (transformers, and any graph xaudit's Rescale pass has no rule
for) with a Softmax inside: each row on its own, and the Rescale multiplier of each Softmax output
(workers/methods/_captum_deeplift.py). Captum 0.9.0 subtracted the mean multiplier of the whole
batch: a BERT's attributions changed by up to ten times their size with the pass size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workers.methods._passes as passes
from tests.unit.methods._context import context
from workers.methods import get_method


class _SoftmaxLayer(nn.Module):
    """Linear-Softmax-Linear: the Softmax is the only nonlinearity, as in an attention's weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.inner, self.softmax, self.outer = nn.Linear(6, 5), nn.Softmax(dim=-1), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.softmax(self.inner(x)))


def _rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(4)).numpy()
    refs = np.full_like(x, 0.25)
    return x, refs, np.arange(12) % 3


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_rows_attributions_do_not_depend_on_the_rows_in_its_pass(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, refs, classes = _rows()
    ctx = context(_SoftmaxLayer().eval(), torch.from_numpy(x[:3]), fmt)
    method = get_method("deeplift_rescale")
    assert "Softmax rule as Captum corrected it" in (method.implementation(ctx.model) or "")
    whole = method.attribute(ctx, x, refs, classes)
    monkeypatch.setattr(passes, "CHUNK", 2)  # Captum's calls of one row and its reference
    np.testing.assert_allclose(method.attribute(ctx, x, refs, classes), whole, atol=1e-6)


def test_a_softmax_takes_the_rescale_multiplier_of_each_output() -> None:
    """Against DeepLIFT written out in float64: m_j = w_cj (s_j - s0_j) / (z_j - z0_j) at the
    Softmax, then the linear layer's transpose; the attributions add up to f(x) - f(x0)."""
    module = _SoftmaxLayer().eval()
    x, refs, classes = _rows()
    ours = get_method("deeplift_rescale").attribute(
        context(module, torch.from_numpy(x[:3])), x, refs, classes
    )

    a, b = (module.inner.weight.double().detach().numpy(), module.inner.bias.double().detach().numpy())
    w, c = (module.outer.weight.double().detach().numpy(), module.outer.bias.double().detach().numpy())
    z, z0 = x.astype(np.float64) @ a.T + b, refs.astype(np.float64) @ a.T + b
    s, s0 = (np.exp(v) / np.exp(v).sum(1, keepdims=True) for v in (z, z0))
    multipliers = w[classes] * (s - s0) / (z - z0)
    expected = (x - refs) * (multipliers @ a)
    np.testing.assert_allclose(ours, expected, atol=1e-5)
    rows = np.arange(len(x))
    delta = (s @ w.T + c)[rows, classes] - (s0 @ w.T + c)[rows, classes]
    np.testing.assert_allclose(ours.sum(1), delta, atol=1e-5)
