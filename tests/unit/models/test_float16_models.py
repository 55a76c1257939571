"""Float16 models as onnxruntime's documentation makes them for GPUs (workers/models/onnx_to_torch.py).

onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)`` keeps a float32 input and
output and casts to float16 after the one and back before the other. The methods' graph computes
in float32 (its weights made so), and the first Cast handed every layer a float16 activation: each
gradient and rule method failed ("Input type (c10::Half) and bias type (float) should be the same").
Cast to float32 instead, and the cast back taken as the identity it then is, every method gives the
float32 model's attributions up to float16's rounding of the weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnxconverter_common import float16
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import assert_same_attributions, pooled_cnn
from workers.methods import AttributionContext
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(6))
METHODS = dict.fromkeys(
    [
        "gradient_x_input",
        "integrated_gradients",
        "grad_cam",
        "lrp_epsilon",
        "lrp_alpha_beta",
        "deep_taylor",
        "deeplift_rescale",
        "deeplift_revealcancel",
    ],
    1e-2,  # of the largest attribution: the weights rounded to float16 (about 5e-4 of each)
)


def _context(data: bytes) -> AttributionContext:
    model = load_model(data, "onnx", "cpu")
    return AttributionContext(model, parse_players("grid:2x2", (3, 8, 8)), Target(), {})


@pytest.mark.filterwarnings("ignore::UserWarning")  # the converter warns of values it truncates
def test_a_float16_model_with_float32_io_gets_the_float32_models_attributions() -> None:
    data = to_onnx(pooled_cnn(nn.Identity, 3, 7), X[:1])
    half = float16.convert_float_to_float16(onnx.load_from_string(data), keep_io_types=True)
    casts = [
        onnx.helper.get_attribute_value(a)
        for n in half.graph.node
        if n.op_type == "Cast"
        for a in n.attribute
    ]
    assert onnx.TensorProto.FLOAT16 in casts, "the converter casts the float32 input to float16"
    ctx = _context(half.SerializeToString())
    with torch.no_grad():
        out = ctx.model.torch_differentiable()(X)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(
        out.numpy(), ctx.model.predict(X.numpy()), rtol=0, atol=1e-2 * float(out.abs().max())
    )
    assert_same_attributions(ctx, _context(data), X.numpy(), METHODS)
