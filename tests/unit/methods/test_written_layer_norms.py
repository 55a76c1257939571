"""A layer norm written out by hand is held as nn.LayerNorm is (workers/models/norm_fusion.py).

The original ConvNeXt's channels-first layer norm, transformers' ViTDet, DeBERTa and Cohere, and
many a custom block write ``d = x - mean(x); d / sqrt(mean(d^2) + eps)``
and then scale and shift it. Both exporters keep every step, and the rule methods stopped at the
``Pow``. Fused into one normalisation over that axis, each method must give the numbers of the
same model with torch's own nn.LayerNorm (for the channels, between two permutes), which the
exporters write as LayerNormalization and which tests/unit/methods/test_transformer_lrp.py checks
against Zennit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import assert_same_attributions, context, pooled_cnn
from workers.methods._fx_plan import held_constant

X = torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(4))
# Each method, and its tolerance as a share of the largest attribution. DeepLIFT takes a norm's
# gradient (Captum's nonlinearity rules do not cover it): the two graphs round it differently, by a
# few float32 steps of the largest attribution.
METHODS = {"lrp_epsilon": 1e-6, "lrp_alpha_beta": 1e-6, "deep_taylor": 1e-6, "deeplift_rescale": 1e-4}


class _WrittenNorm(nn.Module):
    """A layer norm over ``axis`` as ConvNeXt writes it (``kept``); ``twice``: ``x - u`` written twice,
    as ViTDet's does (the legacy exporter then writes two Sub); ``cast``: DeBERTa's, in float32 with a
    cast back (the legacy exporter writes a Cast on each side); ``var`` and ``var_mean``: with
    ``x.var()`` or ``torch.var_mean`` (the legacy exporter centres the variance on a mean of its own
    and writes the square as a product)."""

    def __init__(self, dim: int, axis: int, style: str) -> None:
        super().__init__()
        self.axis, self.style, self.eps = axis, style, 1e-6
        generator = torch.Generator().manual_seed(dim)
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(dim, generator=generator))
        self.bias = nn.Parameter(0.1 * torch.randn(dim, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.style == "cast":
            x = x.float()
        u = x.mean(self.axis, keepdim=True)
        if self.style == "var":
            y = (x - u) / torch.sqrt(x.var(self.axis, keepdim=True, unbiased=False) + self.eps)
        elif self.style == "var_mean":
            v, u = torch.var_mean(x, self.axis, keepdim=True, unbiased=False)
            y = (x - u) * torch.rsqrt(v + self.eps)
        elif self.style != "kept":
            s = (x - u).pow(2).mean(self.axis, keepdim=True)
            y = ((x - u) / torch.sqrt(s + self.eps)).to(dtype)
        else:
            d = x - u
            y = d * torch.rsqrt(d.pow(2).mean(self.axis, keepdim=True) + self.eps)
        shape = [-1] + [1] * (x.ndim - 1 - self.axis)
        return self.weight.reshape(shape) * y + self.bias.reshape(shape)


class _TorchNorm(nn.Module):
    """The same normalisation with nn.LayerNorm, over the channels through two permutes."""

    def __init__(self, written: _WrittenNorm) -> None:
        super().__init__()
        self.axis = written.axis
        self.norm = nn.LayerNorm(written.weight.shape[0], eps=written.eps)
        with torch.no_grad():
            self.norm.weight.copy_(written.weight)
            self.norm.bias.copy_(written.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.axis == x.ndim - 1:
            return self.norm(x)
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _cnn(norm: nn.Module) -> nn.Sequential:
    return pooled_cnn(lambda: norm, 2, seed=5, relu_first=False)


# The dynamo exporter writes x.var() with a Reshape after the variance's mean, and var_mean as a
# ReduceSum over a count: not fused (the rule methods name the operator they stop at).
CASES = [(s, d) for s in ("kept", "twice", "cast") for d in (False, True)] + [
    ("var", False),
    ("var_mean", False),
]


@pytest.mark.parametrize(
    ("style", "dynamo"), CASES, ids=[f"{s}-{'dynamo' if d else 'legacy'}" for s, d in CASES]
)
@pytest.mark.parametrize("axis", [1, 3], ids=["channels", "last"])
def test_a_written_layer_norm_gives_nn_layer_norms_attributions(dynamo: bool, axis: int, style: str) -> None:
    written = _WrittenNorm(8 if axis == 1 else 6, axis, style)
    model = _cnn(written)
    twin = _cnn(_TorchNorm(written))
    twin.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith("1.")}, strict=False
    )
    with torch.no_grad():
        np.testing.assert_allclose(model(X).numpy(), twin(X).numpy(), rtol=1e-5, atol=1e-5)
    ctx = context(model, X, dynamo=dynamo)
    assert_same_attributions(ctx, context(twin, X, dynamo=dynamo), X.numpy(), METHODS)
    assert "layer norms' scales" in held_constant(ctx.model.torch_hookable("lrp_epsilon"), "lrp_epsilon")
