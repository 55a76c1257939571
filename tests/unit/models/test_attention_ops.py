"""Opset 23's Attention written as softmax(scale Q K^T + mask) V for the methods' graph
(workers/models/attention_ops.py), against onnxruntime's kernel; the rule methods then hold the
attention weights as they do on an opset-20 export."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import held_constant
from workers.models import load_model
from workers.models.onnx_to_torch import methods_copy, onnx_to_torch, unconvertible_nodes
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(71))


def _encoder() -> nn.Module:
    torch.manual_seed(72)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.Sequential(
        nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), nn.Flatten(), nn.Linear(80, 3)
    ).eval()


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_an_encoders_attention_is_written_out_and_computes_the_same() -> None:
    model = onnx.load_from_string(to_onnx(_encoder(), X[:2], opset=23, dynamo=True))
    assert "Attention" in {n.op_type for n in model.graph.node}
    written = methods_copy(model)
    assert "Attention" not in {n.op_type for n in written.graph.node}
    assert not unconvertible_nodes(written)
    feeds = {"input": X.numpy()}
    np.testing.assert_allclose(_run(written, feeds), _run(model, feeds), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(onnx_to_torch(model)(X).numpy(), _run(model, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gradient_x_input", "lrp_epsilon"])
def test_the_methods_give_the_opset_20_exports_attributions(name: str) -> None:
    contexts = [
        AttributionContext(
            load_model(to_onnx(_encoder(), X[:2], opset=opset, dynamo=True), "onnx", "cpu"),
            parse_players("windows:5:axis=0", (5, 16)),
            Target(),
            {},
        )
        for opset in (23, 20)
    ]
    x = X.numpy()
    classes = np.array([0, 1, 2])
    got, want = (get_method(name).attribute(c, x, np.zeros_like(x), classes) for c in contexts)
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert "attention weights" in held_constant(contexts[0].model.torch_differentiable(), "lrp_epsilon")


def _bert_at_23() -> bytes:
    import transformers

    config = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_labels=3, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(73)
    bert = transformers.BertForSequenceClassification(config).eval()

    class Logits(nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return bert(input_ids=ids, attention_mask=mask).logits

    buffer = io.BytesIO()
    ids, mask = torch.randint(0, 50, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(), (ids, mask), buffer, dynamo=True, opset_version=23)
    return buffer.getvalue()


def test_berts_boolean_padding_mask_is_written_as_a_bias() -> None:
    model = onnx.load_from_string(_bert_at_23())
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    assert len(attention.input) == 4 and attention.input[3], "the case needs the mask"
    written = methods_copy(model)
    assert "Attention" not in {n.op_type for n in written.graph.node}
    ids = np.random.default_rng(74).integers(0, 50, (2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0  # padding: the mask decides the second row
    names = [i.name for i in model.graph.input]
    feeds = dict(zip(names, (ids, mask), strict=True))
    np.testing.assert_allclose(_run(written, feeds), _run(model, feeds), rtol=1e-5, atol=1e-6)
    unmasked = dict(feeds, **{names[1]: np.ones_like(mask)})
    assert not np.allclose(_run(model, unmasked)[1], _run(model, feeds)[1], atol=1e-5), "the mask matters"


def test_a_causal_attention_stays_and_is_named() -> None:
    class Causal(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = x.reshape(x.shape[0], 5, 2, 8).transpose(1, 2)
            y = nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            return y.transpose(1, 2).reshape(x.shape[0], -1)

    model = onnx.load_from_string(to_onnx(Causal(), X[:2], opset=23, dynamo=True))
    assert any(name.startswith("'Attention'") for name in unconvertible_nodes(methods_copy(model)))


class _RmsBlock(nn.Module):
    """A Llama-style block's norms: nn.RMSNorm before a Linear, which opset 23 writes as one
    RMSNormalization node (earlier opsets write it out, and workers.models.norm_fusion fuses it)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(75)
        self.norm, self.proj, self.head = nn.RMSNorm(16, eps=1e-6), nn.Linear(16, 16), nn.Linear(80, 3)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(self.norm(x))).flatten(1))


@pytest.mark.parametrize("name", ["gradient_x_input", "lrp_epsilon"])
def test_rms_normalization_is_torchs_rms_norm_held_as_at_opset_20(name: str) -> None:
    newest = onnx.load_from_string(to_onnx(_RmsBlock().eval(), X[:2], opset=23, dynamo=True))
    assert "RMSNormalization" in {n.op_type for n in newest.graph.node}
    with torch.no_grad():
        np.testing.assert_allclose(
            onnx_to_torch(newest)(X).numpy(), _run(newest, {"input": X.numpy()}), rtol=1e-5, atol=1e-6
        )
    contexts = [
        AttributionContext(
            load_model(data, "onnx", "cpu"), parse_players("windows:5:axis=0", (5, 16)), Target(), {}
        )
        for data in (newest.SerializeToString(), to_onnx(_RmsBlock().eval(), X[:2], opset=20, dynamo=True))
    ]
    x = X.numpy()
    classes = np.array([0, 1, 2])
    got, want = (get_method(name).attribute(c, x, np.zeros_like(x), classes) for c in contexts)
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
