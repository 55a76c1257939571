"""An attention mask written as -inf (torch.onnx's legacy export of ``masked_fill``, as in
transformers' BERT): the methods' graph holds the type's minimum instead, which keeps the model's
outputs and gives DeepLIFT a difference of 0 where it divided inf - inf (workers/models/onnx_to_torch)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

TOKENS, WIDTH = 6, 4
X = torch.randn(3, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1))


class MaskedAttention(nn.Module):
    """One attention head over six positions, the last two masked out (padding)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.query, self.key = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(TOKENS * WIDTH, 3)
        self.register_buffer("padding", torch.arange(TOKENS) >= TOKENS - 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(1, 2) / 2
        attention = scores.masked_fill(self.padding, float("-inf")).softmax(-1)
        return self.head(torch.relu(attention @ x).flatten(1))


@pytest.fixture(scope="module")
def exported() -> bytes:
    data = to_onnx(MaskedAttention().eval(), X)
    proto = onnx.load_from_string(data)
    constants = [numpy_helper.to_array(t) for t in proto.graph.initializer]
    constants += [
        numpy_helper.to_array(a.t) for n in proto.graph.node for a in n.attribute if a.name == "value"
    ]
    assert any(np.isneginf(v).any() for v in constants if v.dtype.kind == "f"), "no -inf exported"
    return data


def test_the_methods_graph_keeps_the_models_outputs(exported: bytes) -> None:
    model = load_model(exported, "onnx", "cpu")
    with torch.no_grad():
        graph_out = model.torch_differentiable()(X).numpy()
    np.testing.assert_allclose(graph_out, model.predict(X.numpy()), rtol=1e-5, atol=1e-6)


def test_deeplift_through_a_minus_inf_mask_is_finite(exported: bytes) -> None:
    model = load_model(exported, "onnx", "cpu")
    model.check_sample(X.numpy())
    ctx = AttributionContext(model, parse_players("features", (TOKENS, WIDTH)), Target(), {})
    x = X.numpy()
    classes = ctx.target.resolve_classes(model.predict(x))
    for name in ("deeplift_rescale", "deepshap"):
        got = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
        # inf - inf at the masked positions made every attribution NaN (an attention product
        # breaks summation-to-delta, so that is not checked here: the audit measures it)
        assert np.isfinite(got).all() and np.abs(got).max() > 1e-4, name
