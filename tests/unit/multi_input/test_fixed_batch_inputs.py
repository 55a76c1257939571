"""Models of several inputs exported from a one-row example without dynamic axes, as
``torch.onnx.export(model, (ids, mask), path)`` writes them by default: every input declared with a
batch of 1. A mask is given per sample, and the model is re-batched where its rows are independent
at one sample's held inputs (workers/models/named.py's batch_axis, workers/models/rebatch.py)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from torch import nn

from tests.unit.models._default_exports import Logits, inlined, prepared_tokens
from workers.explain import explain
from workers.prepare import Prepared, prepare
from xaudit.contract.spec import JobSpec

IDS = np.random.default_rng(4).integers(1, 100, (3, 8)).astype(np.int64)
MASK = np.ones((3, 8), np.int64)
MASK[0, -2:] = 0  # each sample its own mask
MASK[1, -1:] = 0
PADDED = np.where(MASK == 0, 0, IDS)  # GPT-2 pools at the last token that is not its pad id 0


def _classifier(family: str) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    if family == "GPT2":
        config = transformers.GPT2Config(
            vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, pad_token_id=0, use_cache=False,
            num_labels=3, initializer_range=0.3,
        )  # fmt: skip
    else:
        config = getattr(transformers, f"{family}Config")(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, num_labels=3, initializer_range=0.3,
        )  # fmt: skip
    return Logits(getattr(transformers, f"{family}ForSequenceClassification")(config).eval())


@pytest.fixture(scope="module", params=["bert", "roberta", "bert_legacy", "gpt2", "gpt2_legacy"])
def bert_exports(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, bytes]:
    """transformers' BertForSequenceClassification or RobertaForSequenceClassification from its
    config (random weights), exported with the defaults from one row, and its twin exported with a
    dynamic batch and sequence. From one row the exporter reads row 0's attention mask (a GatherND)
    and, for RoBERTa, gathers its buffered token-type ids, a constant (1, 64), at the rows' positions
    (a GatherElements that workers/models/pinned_shapes.py expands to the rows). ``bert_legacy``: the
    TorchScript-based exporter (opset 17) without ``dynamic_axes``, which also reads row 0's mask (a
    Gather of the flattened mask) and writes the batch of 1 beside the sizes it reads at run time.
    ``gpt2``, ``gpt2_legacy``: GPT2ForSequenceClassification, whose logits are read at each row's
    last token, ``logits[arange(rows), last]``, exported from one row with ``arange(1)`` a constant
    (workers/models/row_indices.py)."""
    family = {"bert": "Bert", "roberta": "Roberta", "gpt2": "GPT2"}[request.param.removesuffix("_legacy")]
    module = _classifier(family)
    folder = tmp_path_factory.mktemp(request.param)
    ids, mask = torch.from_numpy(PADDED if family == "GPT2" else IDS), torch.from_numpy(MASK)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    found = {}
    for name, example, dynamic in (
        ("defaults", (ids[:1], mask[:1]), None),
        ("dynamic", (ids[:2], mask[:2]), ({0: batch, 1: sequence},) * 2),
    ):
        path = folder / f"{name}.onnx"
        names = ["input_ids", "attention_mask"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if request.param.endswith("legacy"):
                axes = {n: {0: "batch", 1: "sequence"} for n in names} if dynamic else None
                torch.onnx.export(
                    module, example, str(path), dynamo=False, opset_version=17, input_names=names,
                    dynamic_axes=axes,
                )  # fmt: skip
            else:
                torch.onnx.export(
                    module, example, str(path), dynamo=True, input_names=names, dynamic_shapes=dynamic
                )  # fmt: skip
        found[name] = inlined(path)
    return found


METHODS = ("integrated_gradients", "lrp_epsilon", "deeplift_rescale")


def _prepared(data: bytes, ids: np.ndarray, mask: np.ndarray) -> Prepared:
    return prepared_tokens(data, ids, mask, METHODS, baseline="token:0")


def test_a_default_bert_export_takes_a_mask_per_sample_and_is_rebatched(
    bert_exports: dict[str, bytes], request: pytest.FixtureRequest
) -> None:
    proto = onnx.load_from_string(bert_exports["defaults"])
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input] == [[1, 8]] * 2
    ids = PADDED if "gpt2" in request.node.callspec.params["bert_exports"] else IDS
    pinned = _prepared(bert_exports["defaults"], ids, MASK)
    twin = _prepared(bert_exports["dynamic"], ids, MASK)
    assert pinned.model.explained.fixed_batch is None  # re-batched: many rows per call
    assert pinned.model.axes == {"attention_mask": 0} and pinned.model.per_sample
    session = ort.InferenceSession(bert_exports["defaults"], providers=["CPUExecutionProvider"])
    feeds = ({"input_ids": ids[i : i + 1], "attention_mask": MASK[i : i + 1]} for i in range(3))
    alone = np.concatenate([session.run(None, feed)[0] for feed in feeds])
    np.testing.assert_allclose(pinned.full_outputs, alone, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(twin.full_outputs, alone, rtol=1e-5, atol=1e-5)
    got, want = (explain(p, METHODS).attributions for p in (pinned, twin))
    for name in METHODS:  # DeepLIFT and LRP: before, not applicable on this export
        assert np.abs(want[name]).max() > 1e-3, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def _folded_features() -> bytes:
    """x (1, 4) and m (1, 4) -> x * m -> Reshape (2, 2) -> Transpose -> MatMul (2, 2) -> Reshape (1, 4)
    -> MatMul: at two rows the fold can only put them inside the axis the first weight contracts, so
    the batch stays pinned for good and the model runs one row per call, with m per sample."""
    rng = np.random.default_rng(8)
    graph = oh.make_graph(
        [
            oh.make_node("Mul", ["x", "m"], ["xm"]),
            oh.make_node("Reshape", ["xm", "folded"], ["fold"]),
            oh.make_node("Transpose", ["fold"], ["turned"], perm=[1, 0]),
            oh.make_node("MatMul", ["turned", "mix"], ["mixed"]),
            oh.make_node("Reshape", ["mixed", "row"], ["f"]),
            oh.make_node("MatMul", ["f", "w"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "m")],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        initializer=[
            nh.from_array(np.array([2, 2], np.int64), "folded"),
            nh.from_array(np.array([1, 4], np.int64), "row"),
            nh.from_array(rng.standard_normal((4, 2)).astype(np.float32), "w"),
            nh.from_array(rng.standard_normal((2, 2)).astype(np.float32), "mix"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_pinned_two_input_model_runs_row_by_row_with_its_held_input_per_sample() -> None:
    data = _folded_features()
    rng = np.random.default_rng(9)
    x, m = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    spec = JobSpec(players="features", explain="x", device="cpu")
    prep = prepare(spec, data, None, {"inputs": x, "input:m": m})
    assert prep.model.explained.fixed_batch == 1 and prep.model.axes == {"m": 0}
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    alone = np.concatenate([session.run(None, {"x": x[i : i + 1], "m": m[i : i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(prep.full_outputs, alone, rtol=1e-6)
    shared = prepare(spec, data, None, {"inputs": x, "input:m": m[:1]})  # one value for all samples
    alone = np.concatenate([session.run(None, {"x": x[i : i + 1], "m": m[:1]})[0] for i in range(3)])
    np.testing.assert_allclose(shared.full_outputs, alone, rtol=1e-6)
