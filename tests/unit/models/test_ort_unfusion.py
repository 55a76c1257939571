"""onnxruntime's fused operators written back as ONNX's own for the methods' torch graph
(workers/models/ort_unfusion.py): each rewrite computes what onnxruntime's own kernel computes on
the fused operator, checked here against onnxruntime itself, padding masks included; what is not
written back stays fused and is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from torch import nn

from tests.models import to_onnx
from workers.models.onnx_to_torch import onnx_to_torch
from xaudit.contract.errors import InvalidModel


def _model(nodes: list, inputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes, "g", inputs, [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    model = oh.make_model(
        graph, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    return model


def _matches_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Any:
    """The converted graph, after checking its output against onnxruntime running the fused model."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    graph = onnx_to_torch(model)
    names = [i.name for i in model.graph.input]
    got = graph(*[torch.from_numpy(feeds[n]) for n in names])
    got = got[0] if isinstance(got, (tuple, list)) else got
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=2e-5)
    return graph


def _fused_transformer_block(opset: int = 17, read_mean: bool = False) -> onnx.ModelProto:
    """x (n, 4, 8) -> MatMul -> com.microsoft.SkipLayerNormalization(h, x, gamma, beta, bias), its
    sum (output 3) read by an Add -> com.microsoft.BiasGelu -> com.microsoft.Gelu: what onnxruntime's
    transformer optimizer writes for a BERT layer's residual, norm and feed-forward GELU."""
    r = np.random.default_rng(4)
    inits = [nh.from_array(r.standard_normal((8, 8)).astype(np.float32), name) for name in ("w",)] + [
        nh.from_array(r.standard_normal(8).astype(np.float32), name) for name in ("gamma", "beta", "b1", "b2")
    ]
    mean = "mean" if read_mean else ""
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        oh.make_node(
            "SkipLayerNormalization", ["h", "x", "gamma", "beta", "b1"], ["n", mean, "", "sum"],
            name="skip_ln", domain="com.microsoft", epsilon=1e-6,
        ),
        oh.make_node("Add", ["n", "sum"], ["a"], name="residual"),
        oh.make_node("BiasGelu", ["a", "b2"], ["g"], name="bias_gelu", domain="com.microsoft"),
        oh.make_node("Gelu", ["g"], ["y0"], name="gelu", domain="com.microsoft"),
    ]  # fmt: skip
    if read_mean:
        nodes.append(oh.make_node("Add", ["y0", "mean"], ["y1"], name="uses_mean"))
    nodes.append(oh.make_node("Flatten", ["y1" if read_mean else "y0"], ["y"], name="flat"))
    return _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 8])], inits, opset)


def test_onnxruntimes_fused_norm_and_gelu_convert_as_onnxs_own_operators() -> None:
    """SkipLayerNormalization and BiasGelu (onnxruntime's transformer optimizer) are written back as
    Add + LayerNormalization and the exact GELU (workers/models/ort_unfusion.py): the methods' graph
    computes what onnxruntime computes, with layer norms where LRP's rules look for them."""
    from workers.methods._fx_plan import _is_norm

    model = _fused_transformer_block()
    x = np.random.default_rng(5).standard_normal((3, 4, 8)).astype(np.float32)
    graph = _matches_onnxruntime(model, {"x": x})
    kinds = [type(m).__name__ for m in graph.modules()]
    assert sum(_is_norm(m, type(m).__name__) for m in graph.modules()) == 1 and kinds.count("Gelu") == 2, (
        kinds
    )
    # Left fused where it cannot be written back: the mean read, or no LayerNormalization (opset 16).
    for unwritable in (_fused_transformer_block(read_mean=True), _fused_transformer_block(opset=16)):
        with pytest.raises(InvalidModel, match=r"'com.microsoft.SkipLayerNormalization' \(node 'skip_ln'\)"):
            onnx_to_torch(unwritable)


def _attention_model(mask_rank: int, **attributes: Any) -> onnx.ModelProto:
    """x (n, 5, 12) -> com.microsoft.Attention(x, W (12, 3*12 or qkv_hidden_sizes), bias, mask),
    mask: none (0), lengths (1: shape n) or raw 0/1 (2: shape n x 5), as int32 graph inputs."""
    r = np.random.default_rng(6)
    sizes = attributes.get("qkv_hidden_sizes", [12, 12, 12])
    inits = [
        nh.from_array(r.standard_normal((12, sum(sizes))).astype(np.float32) * 0.5, "w"),
        nh.from_array(r.standard_normal(sum(sizes)).astype(np.float32), "b"),
    ]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 12])]
    if mask_rank:
        inputs.append(oh.make_tensor_value_info("m", TensorProto.INT32, ["n", 5][:mask_rank]))
    node = oh.make_node(
        "Attention", ["x", "w", "b", "m" if mask_rank else ""], ["y"], name="attention", domain="com.microsoft",
        num_heads=attributes.pop("num_heads", 3), **attributes,
    )  # fmt: skip
    return _model([node], inputs, inits)


@pytest.mark.parametrize(
    ("mask_rank", "attributes"),
    [
        (0, {}),
        (1, {}),
        (2, {}),
        (1, {"scale": 0.3, "mask_filter_value": -50.0}),
        (2, {"qkv_hidden_sizes": [12, 12, 6]}),
    ],
)
def test_attention_is_written_back_as_onnxruntime_computes_it(mask_rank: int, attributes: dict) -> None:
    x = np.random.default_rng(7).standard_normal((3, 5, 12)).astype(np.float32)
    feeds = {"x": x}
    if mask_rank == 1:
        feeds["m"] = np.array([5, 3, 1], np.int32)  # row 1 attends its first 3 keys, row 2 one
    elif mask_rank == 2:
        feeds["m"] = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 1], [0, 1, 1, 1, 1]], np.int32)
    graph = _matches_onnxruntime(_attention_model(mask_rank, **attributes), feeds)
    assert "Softmax" in {type(m).__name__ for m in graph.modules()}  # where LRP's rules look for it


@pytest.mark.parametrize(
    "attributes",
    [
        {"unidirectional": 1},
        {"do_rotary": 1},
        {"num_heads": 0},  # malformed: a division by zero in the rewrite
        {"num_heads": 5},  # malformed: 12 features do not split into 5 heads
        {"qkv_hidden_sizes": [12]},  # malformed: one size for three parts
    ],
)
def test_attention_that_is_not_written_back_is_named(attributes: dict) -> None:
    with pytest.raises(InvalidModel, match=r"'com.microsoft.Attention' \(node 'attention'\)"):
        onnx_to_torch(_attention_model(1, **attributes))


@pytest.mark.parametrize(("segments", "positions", "mask"), [(True, False, True), (False, True, False)])
def test_embed_layer_norm_and_its_mask_index_are_written_back(
    segments: bool, positions: bool, mask: bool
) -> None:
    """EmbedLayerNormalization's lookups, sum and norm, and its mask index (the count of each row's
    ones; zeros without a mask) read by an Attention, as onnxruntime computes them."""
    r = np.random.default_rng(8)
    inits = [
        nh.from_array(r.standard_normal((20, 12)).astype(np.float32), "words"),
        nh.from_array(r.standard_normal((16, 12)).astype(np.float32), "positions"),
        nh.from_array(r.standard_normal((2, 12)).astype(np.float32), "segments"),
        nh.from_array(1 + 0.1 * r.standard_normal(12).astype(np.float32), "gamma"),
        nh.from_array(0.1 * r.standard_normal(12).astype(np.float32), "beta"),
        nh.from_array(r.standard_normal((12, 36)).astype(np.float32) * 0.5, "w"),
        nh.from_array(r.standard_normal(36).astype(np.float32), "b"),
    ]
    inputs = [oh.make_tensor_value_info("ids", TensorProto.INT32, ["n", 5])]
    feeds: dict[str, np.ndarray] = {"ids": r.integers(0, 20, (3, 5)).astype(np.int32)}
    names = ["ids", "", "words", "positions", "", "gamma", "beta", "", ""]
    if segments:
        inputs.append(oh.make_tensor_value_info("seg", TensorProto.INT32, ["n", 5]))
        feeds["seg"] = r.integers(0, 2, (3, 5)).astype(np.int32)
        names[1], names[4] = "seg", "segments"
    if mask:
        inputs.append(oh.make_tensor_value_info("mask", TensorProto.INT32, ["n", 5]))
        feeds["mask"] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], np.int32)
        names[7] = "mask"
    if positions:
        inputs.append(oh.make_tensor_value_info("pos", TensorProto.INT32, ["n", 5]))
        feeds["pos"] = np.tile(np.array([3, 4, 5, 6, 7], np.int32), (3, 1))
        names[8] = "pos"
    nodes = [
        oh.make_node(
            "EmbedLayerNormalization", names, ["e", "mask_index"], name="embed", domain="com.microsoft", epsilon=1e-6
        ),
        oh.make_node("Attention", ["e", "w", "b", "mask_index"], ["y"], name="attention", domain="com.microsoft", num_heads=3),
    ]  # fmt: skip
    graph = _matches_onnxruntime(_model(nodes, inputs, inits), feeds)
    assert "Gather" in "".join(type(m).__name__ for m in graph.modules())  # the lookups, where gradients go


def _optimized_by_onnxruntime(data: bytes, folder: Path) -> onnx.ModelProto:
    """``data`` as onnxruntime's extended optimization saves it (``optimized_model_filepath``), which
    teams ship for faster start-up: Conv + activation become FusedConv, scaled MatMuls FusedMatMul."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(folder / "optimized.onnx")
    ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return onnx.load(str(folder / "optimized.onnx"))


def test_onnxruntimes_fused_conv_and_gemm_are_written_back(tmp_path: Path) -> None:
    """A CNN whose convolutions end in ReLU, LeakyReLU, Sigmoid and a clip, and a Gemm in tanh."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1), nn.LeakyReLU(0.2),
        nn.Conv2d(4, 4, 3, padding=1), nn.Sigmoid(),
        nn.Conv2d(4, 4, 3, padding=1), nn.Hardtanh(-1.0, 2.0),
        nn.Flatten(), nn.Linear(4 * 6 * 6, 5), nn.Tanh(),
    ).eval()  # fmt: skip
    model = _optimized_by_onnxruntime(to_onnx(net, torch.randn(1, 3, 6, 6)), tmp_path)
    fused = sorted(n.op_type for n in model.graph.node if n.domain == "com.microsoft")
    assert fused.count("FusedConv") >= 3 and "FusedGemm" in fused, fused
    x = np.random.default_rng(9).standard_normal((2, 3, 6, 6)).astype(np.float32)
    _matches_onnxruntime(model, {model.graph.input[0].name: x})


def test_onnxruntimes_fused_matmul_of_attention_scores_is_written_back(tmp_path: Path) -> None:
    """Attention laid out as transformers' BERT lays it out (keys permuted to (B, N, d, S) by one
    Transpose): onnxruntime folds the scores' 1/2 into FusedMatMul's alpha. A FusedMatMul that also
    transposes an operand (keys transposed by their last two axes) stays fused, its rank unknown in
    the saved model, and is named."""

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.reshape(*x.shape[:2], 2, 4) for t in self.qkv(x).split(8, dim=-1))
            q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
            return (torch.softmax(q @ k / 2.0, dim=-1) @ v).flatten(1)

    class Transposing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(4, 12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).split(4, dim=-1)
            return torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v

    torch.manual_seed(0)
    x = np.random.default_rng(10).standard_normal((3, 5, 8)).astype(np.float32)
    model = _optimized_by_onnxruntime(to_onnx(Heads().eval(), torch.randn(1, 5, 8)), tmp_path)
    assert "FusedMatMul" in {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    graph = _matches_onnxruntime(model, {model.graph.input[0].name: x})
    assert "Softmax" in {type(m).__name__ for m in graph.modules()}
    transposing = _optimized_by_onnxruntime(to_onnx(Transposing().eval(), torch.randn(1, 5, 4)), tmp_path)
    assert any(a.name == "transB" and a.i for n in transposing.graph.node for a in n.attribute)
    with pytest.raises(InvalidModel, match=r"'com\.microsoft\.FusedMatMul'"):
        onnx_to_torch(transposing)
