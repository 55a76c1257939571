"""Opset 23's Attention written as softmax(scale Q K^T + mask) V for the methods' graph
(workers/models/attention_ops.py), in each form the operator has (causal, grouped heads, packed heads,
soft cap, sliding window), against onnxruntime's kernel and onnx's reference implementation; the rule
methods then hold the attention weights as they do on an opset-20 export."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator
from torch import nn

from tests.models import ort_outputs, to_onnx
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


def test_an_encoders_attention_is_written_out_and_computes_the_same() -> None:
    model = onnx.load_from_string(to_onnx(_encoder(), X[:2], opset=23, dynamo=True))
    assert "Attention" in {n.op_type for n in model.graph.node}
    written = methods_copy(model)
    assert "Attention" not in {n.op_type for n in written.graph.node}
    assert not unconvertible_nodes(written)
    feeds = {"input": X.numpy()}
    np.testing.assert_allclose(ort_outputs(written, feeds), ort_outputs(model, feeds), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(
            onnx_to_torch(model)(X).numpy(), ort_outputs(model, feeds), rtol=1e-4, atol=1e-5
        )


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
    np.testing.assert_allclose(ort_outputs(written, feeds), ort_outputs(model, feeds), rtol=1e-5, atol=1e-6)
    unmasked = dict(feeds, **{names[1]: np.ones_like(mask)})
    assert not np.allclose(ort_outputs(model, unmasked)[1], ort_outputs(model, feeds)[1], atol=1e-5), (
        "the mask matters"
    )


class _Decoder(nn.Module):
    """nanoGPT's causal self-attention, with grouped heads where ``grouped`` (4 query heads, 2 key and
    value heads, as Llama's ``enable_gqa``)."""

    def __init__(self, grouped: bool) -> None:
        super().__init__()
        torch.manual_seed(76)
        self.grouped = grouped
        self.qkv, self.head = nn.Linear(16, 16 + 2 * (8 if grouped else 16)), nn.Linear(80, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv_heads = 2 if self.grouped else 4
        q, k, v = self.qkv(x).split([16, 4 * kv_heads, 4 * kv_heads], dim=-1)
        q = q.reshape(x.shape[0], 5, 4, 4).transpose(1, 2)
        k, v = (t.reshape(x.shape[0], 5, kv_heads, 4).transpose(1, 2) for t in (k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)
        return self.head(y.transpose(1, 2).reshape(x.shape[0], -1))


@pytest.mark.parametrize("grouped", [False, True], ids=["causal", "causal_grouped"])
@pytest.mark.parametrize("name", ["gradient_x_input", "lrp_epsilon"])
def test_a_causal_decoders_methods_give_the_opset_20_exports_attributions(name: str, grouped: bool) -> None:
    newest = onnx.load_from_string(to_onnx(_Decoder(grouped).eval(), X[:2], opset=23, dynamo=True))
    attention = next(n for n in newest.graph.node if n.op_type == "Attention")
    assert ("is_causal", 1) in [(a.name, a.i) for a in attention.attribute], "the case needs the causal node"
    assert "Attention" not in {n.op_type for n in methods_copy(newest).graph.node}
    contexts = [
        AttributionContext(
            load_model(data, "onnx", "cpu"), parse_players("windows:5:axis=0", (5, 16)), Target(), {}
        )
        for data in (
            newest.SerializeToString(),
            to_onnx(_Decoder(grouped).eval(), X[:2], opset=20, dynamo=True),
        )
    ]
    x = X.numpy()
    classes = np.array([0, 1, 2])
    got, want = (get_method(name).attribute(c, x, np.zeros_like(x), classes) for c in contexts)
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    for context in contexts:
        assert "attention weights" in held_constant(context.model.torch_differentiable(), "lrp_epsilon")


def _attention(
    shapes: list[list[int | str]],
    opset: int = 23,
    mask: tuple[int, list[int]] | None = None,
    **options: object,
) -> onnx.ModelProto:
    names = ["q", "k", "v"] + (["mask"] if mask else [])
    types = [(onnx.TensorProto.FLOAT, shape) for shape in shapes] + ([mask] if mask else [])
    graph = helper.make_graph(
        [helper.make_node("Attention", names, ["y"], **options)],
        "attention",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in zip(names, types, strict=True)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


_BOOL, _FLOAT = onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT
_FORMS = {
    "causal": _attention([[2, 2, 5, 4]] * 3, is_causal=1),
    "causal_fewer_queries": _attention([[2, 2, 3, 4], [2, 2, 6, 4], [2, 2, 6, 4]], is_causal=1),
    "grouped": _attention([[2, 4, 5, 4], [2, 2, 5, 4], [2, 2, 5, 3]]),
    "grouped_causal_masked": _attention(
        [[2, 4, 5, 4], [2, 1, 5, 4], [2, 1, 5, 4]], mask=(_BOOL, [5, 5]), is_causal=1
    ),
    "packed": _attention([[2, 5, 8], [2, 6, 8], [2, 6, 6]], q_num_heads=2, kv_num_heads=2),
    "packed_grouped_causal": _attention(
        [[2, 5, 16], [2, 5, 8], [2, 5, 8]], q_num_heads=4, kv_num_heads=2, is_causal=1
    ),
    "softcap_float_mask": _attention([[2, 2, 5, 4]] * 3, mask=(_FLOAT, [2, 1, 5, 5]), softcap=2.0, scale=0.9),
    "window": _attention([[2, 2, 6, 4]] * 3, opset=25, left_window_size=2, right_window_size=1),
    "window_causal": _attention([[2, 2, 6, 4]] * 3, opset=25, left_window_size=2, is_causal=1),
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(77)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == _BOOL:
            feeds[value.name] = rng.random(shape) > 0.3
            feeds[value.name][..., 0] = True  # every query keeps a key
        else:
            feeds[value.name] = rng.normal(size=shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("form", list(_FORMS))
def test_each_form_is_written_out_as_the_operator_defines_it(form: str) -> None:
    model = _FORMS[form]
    written = methods_copy(model)
    assert "Attention" not in {n.op_type for n in written.graph.node}
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(
        ort_outputs(model, feeds), want, rtol=1e-5, atol=1e-6
    )  # the two references agree
    np.testing.assert_allclose(ort_outputs(written, feeds), want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        got = onnx_to_torch(model)(*(torch.from_numpy(feeds[v.name]) for v in model.graph.input))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def _with_past_state() -> onnx.ModelProto:
    model = _attention([[2, 2, 1, 4]] * 3)
    node, graph = model.graph.node[0], model.graph
    node.input.extend(["", "past_key", "past_value"])
    node.output.extend(["present_key", "present_value"])
    graph.input.extend(
        helper.make_tensor_value_info(n, _FLOAT, [2, 2, 4, 4]) for n in ("past_key", "past_value")
    )
    graph.output.extend(
        helper.make_tensor_value_info(n, _FLOAT, None) for n in ("present_key", "present_value")
    )
    return model


@pytest.mark.parametrize(
    "model",
    [
        _with_past_state(),
        _attention([[2, 2, "s", 4]] * 3, is_causal=1),
        _attention([[2, 2, 6, 4], [2, 2, 3, 4], [2, 2, 3, 4]], opset=25, left_window_size=0, is_causal=1),
        _attention([[2, 2, 5, 4]] * 3, mask=(_FLOAT, [5, 1])),
    ],
    ids=["past_state", "causal_dynamic_length", "window_leaves_a_query_no_key", "mask_over_fewer_keys"],
)
def test_what_a_softmax_cannot_write_stays_and_is_named_with_the_reason(
    model: onnx.ModelProto, request: pytest.FixtureRequest
) -> None:
    reasons = {
        "past_state": "past keys and values",
        "causal_dynamic_length": "a causal or window mask over sequence lengths known only at run time",
        "window_leaves_a_query_no_key": "a causal or window mask that leaves a query no key",
        "mask_over_fewer_keys": "a mask over fewer keys than there are",
    }
    named = [name for name in unconvertible_nodes(methods_copy(model)) if name.startswith("'Attention'")]
    assert named and named[0].endswith(f", which stays as it is: {reasons[request.node.callspec.id]})"), named


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
            onnx_to_torch(newest)(X).numpy(), ort_outputs(newest, {"input": X.numpy()}), rtol=1e-5, atol=1e-6
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
