"""Statically quantized models in the methods' graph (workers/models/fake_quantization.py).

onnxruntime's ``quantize_static`` writes QuantizeLinear -> DequantizeLinear pairs around every layer
and its weights as integers behind a DequantizeLinear; onnx2torch converted neither, so no gradient
or rule method ran on such a model. The pairs now run as a fake quantization, which computes ONNX's
values and the straight-through gradient; the rule methods pass relevance through them, and
DeepLIFT's two rules take each pair as the elementwise nonlinearity it is."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import dense_layers, pooled_cnn
from tests.unit.methods._zennit_reference import lrp_cases, passing, zennit_relevance
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import AttributionContext, get_method
from workers.methods._conversion_check import check_graph_matches_model
from workers.methods._fx_plan import held_constant
from workers.methods._lrp_rules import ZBox
from workers.models import load_model
from workers.models.fake_quantization import simulate_quantization
from workers.models.onnx_converters import FakeQuantize
from workers.models.onnx_to_torch import methods_copy, onnx_to_torch
from workers.models.quantized_operators import as_qdq
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))


def _rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ONNX graph the torch conversion starts from (workers.models.onnx_to_torch)."""
    copy = methods_copy(model)
    as_qdq(copy)
    simulate_quantization(copy)
    return copy


def _spec_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime evaluating each node as ONNX defines it (no fused integer kernels)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _pair(kind: int, scale: list[float], zero: list[int], axis: int | None) -> onnx.ModelProto:
    shape = [len(scale)] if axis is not None else []
    nodes = [
        helper.make_node(
            "QuantizeLinear", ["x", "s", "z"], ["q"], **({"axis": axis} if axis is not None else {})
        ),
        helper.make_node(
            "DequantizeLinear", ["q", "s", "z"], ["y"], **({"axis": axis} if axis is not None else {})
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3, 5])],
        [
            helper.make_tensor("s", TensorProto.FLOAT, shape, scale),
            helper.make_tensor("z", kind, shape, zero),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


PAIRS = {
    "uint8": (TensorProto.UINT8, [0.02], [7], None, (0, 255)),
    "int8": (TensorProto.INT8, [0.03], [-4], None, (-128, 127)),
    "int8-per-channel": (TensorProto.INT8, [0.01, 0.05, 0.002], [0, 3, -9], 1, (-128, 127)),
    "uint16": (TensorProto.UINT16, [0.0001], [30000], None, (0, 65535)),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_a_pair_runs_as_onnx_defines_it_with_the_straight_through_gradient(case: str) -> None:
    kind, scale, zero, axis, (low, high) = PAIRS[case]
    model = _pair(kind, scale, zero, axis)
    x = (np.random.default_rng(0).standard_normal((64, 3, 5)) * 3).astype(np.float32)
    step = np.array(scale, np.float32).reshape(-1, 1)
    x[0] = (np.arange(15).reshape(3, 5) + 0.5) * step  # ties: rounded half to even
    want = _spec_session(model).run(None, {"x": x})[0]

    fused = _rewritten(model)
    assert [n.op_type for n in fused.graph.node] == ["FakeQuantize"]
    np.testing.assert_array_equal(_spec_session(fused).run(None, {"x": x})[0], want)  # its function body

    graph = onnx_to_torch(model)
    t = torch.from_numpy(x).requires_grad_(True)
    out = graph(t)
    np.testing.assert_array_equal(out.detach().numpy(), want)
    (gradient,) = torch.autograd.grad(out.sum(), t)
    s, z = np.array(scale).reshape(-1, 1), np.array(zero).reshape(-1, 1)
    levels = np.round(x / s) + z
    np.testing.assert_array_equal(gradient.numpy(), ((levels >= low) & (levels <= high)).astype(np.float32))
    assert 0 < gradient.numpy().mean() < 1, "the case saturates somewhere and not everywhere"


class _Residual(nn.Module):
    """x + relu(conv(x)): a residual sum, which the QOperator format writes as QLinearAdd."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.conv(x))


def _quantize_static(tmp_path: object, model: bytes, rows: np.ndarray, **options: object) -> bytes:
    """``model`` (input ``input``) quantized by onnxruntime's ``quantize_static`` with ``options``
    over its defaults (QDQ, uint8 activations, int8 weights), calibrated on ``rows`` one at a time."""
    from pathlib import Path

    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    folder = Path(str(tmp_path))
    (folder / "float.onnx").write_bytes(model)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter([{"input": rows[i : i + 1]} for i in range(len(rows))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.rows, None)

    quantize_static(str(folder / "float.onnx"), str(folder / "int8.onnx"), Reader(), **options)
    return (folder / "int8.onnx").read_bytes()


def _quantized(tmp_path: object, per_channel: bool, operators: bool = False, residual: bool = False) -> bytes:
    """A small CNN (two convolutions, pooling, a Linear head; a residual block between where
    ``residual``) exported by the legacy exporter and quantized with ``quantize_static``'s defaults
    (its QOperator format where ``operators``), calibrated on random images."""
    from onnxruntime.quantization import QuantFormat

    model = to_onnx(pooled_cnn(_Residual if residual else nn.Identity, 3, 5), X[:1])
    rows = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(4)).numpy()
    fmt = QuantFormat.QOperator if operators else QuantFormat.QDQ
    return _quantize_static(tmp_path, model, rows, quant_format=fmt, per_channel=per_channel)


def _context(data: bytes, params: dict | None = None) -> AttributionContext:
    model = load_model(data, "onnx", "cpu")
    return AttributionContext(model, parse_players("grid:2x2", (3, 8, 8)), Target(), dict(params or {}))


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_a_statically_quantized_cnn_converts_to_its_fake_quantized_graph(
    tmp_path: object, per_channel: bool
) -> None:
    data = _quantized(tmp_path, per_channel, residual=True)
    proto = onnx.load_from_string(data)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in proto.graph.node}
    fused = _rewritten(proto)
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in fused.graph.node}
    assert sum(n.op_type == "FakeQuantize" for n in fused.graph.node) >= 4
    # the rewritten graph (weights dequantized ahead, pairs fused) is the model as ONNX defines it
    x = X.numpy()
    np.testing.assert_allclose(
        _spec_session(fused).run(None, {"input": x})[0],
        _spec_session(proto).run(None, {"input": x})[0],
        atol=1e-6,
    )
    ctx = _context(data)
    check_graph_matches_model("gradient_x_input", ctx.model, x)  # passes: rounding flips at most
    # the report says what the gradient methods ran on; the perturbation methods run the model itself
    assert "straight-through" in (
        get_method("integrated_gradients").described_implementation(ctx.model) or ""
    )
    assert get_method("occlusion_1").described_implementation(ctx.model) is None


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_the_qoperator_format_is_written_as_qdq(tmp_path: object, per_channel: bool) -> None:
    """onnxruntime's QOperator format (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm; MaxPool
    and Flatten of integers) converts to the same fake-quantized graph: the conversion check passes,
    and the rule methods run through it."""
    data = _quantized(tmp_path, per_channel, operators=True, residual=True)
    proto = onnx.load_from_string(data)
    ops = {n.op_type for n in proto.graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= ops
    fused = _rewritten(proto)
    left = {n.op_type for n in fused.graph.node}
    assert not {op for op in left if op.startswith("Q") or op.endswith("QuantizeLinear")}, left
    assert {"Conv", "Add", "GlobalAveragePool", "Gemm", "FakeQuantize"} <= left
    ctx = _context(data)
    x = X.numpy()
    check_graph_matches_model("gradient_x_input", ctx.model, x)
    classes = np.array([0, 1, 2, 1])
    for name in ("lrp_epsilon", "deeplift_rescale", "integrated_gradients"):
        found = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
        assert np.isfinite(found).all() and np.abs(found).max() > 0, name


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_lrp_passes_relevance_through_the_pairs_as_zennit_does(tmp_path: object, name: str) -> None:
    """Zennit's hooks on the same converted graph, its Pass rule on each pair (the input's, the
    activations', and the output's above the last layer): the relevance xaudit's own pass gives.
    Deep Taylor's first layer reads the quantized input, whose bounds are the pair's values at the
    input's bounds."""
    data = _quantized(tmp_path, per_channel=True)
    params, rules = lrp_cases(3)[name]
    ctx = _context(data, params)
    twin = onnx_to_torch(onnx.load_from_string(data))
    layers = [m for m in twin.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    quantizers = [m for m in twin.modules() if isinstance(m, FakeQuantize)]
    assert len(quantizers) >= 4
    if isinstance(rules[0], ZBox):
        with torch.no_grad():
            low, high = (
                float(quantizers[0](torch.tensor([bound]))) for bound in (rules[0].low, rules[0].high)
            )
        assert (low, high) != (rules[0].low, rules[0].high), "the input's grid saturates inside the bounds"
        rules = [ZBox(low, high), *rules[1:]]
    classes = np.array([0, 1, 2, 1])
    ours = get_method(name).attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), classes)
    want = zennit_relevance(twin, passing(layers, rules, FakeQuantize), X, classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_deeplift_rescales_through_the_pairs(tmp_path: object) -> None:
    """Rescale's multipliers Δy/Δx through each pair sum to the graph's own output difference
    (summation-to-delta); the straight-through gradient, which the pair's own backward is, does not."""
    ctx = _context(_quantized(tmp_path, per_channel=True))
    x = X.numpy()
    classes = np.array([0, 1, 2, 1])
    found = get_method("deeplift_rescale").attribute(ctx, x, np.zeros_like(x), classes)
    graph = ctx.model.torch_differentiable()
    with torch.no_grad():
        delta = (graph(X) - graph(torch.zeros_like(X))).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(found.reshape(4, -1).sum(1), delta, rtol=1e-4, atol=1e-5 * np.abs(delta).max())
    straight = get_method("gradient_x_input").attribute(ctx, x, np.zeros_like(x), classes)
    assert np.abs(straight.reshape(4, -1).sum(1) - delta).max() > 1e-3 * np.abs(delta).max()


class _Quantize(nn.Module):
    """A fake quantization to a uint8 grid (scale ``S``, zero point 0), which the legacy exporter
    writes as a QuantizeLinear -> DequantizeLinear pair: an activation that clamps at 0 and at 255 S."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fake_quantize_per_tensor_affine(x, S, 0, 0, 255)


S = 0.05


def _on_grid(v: float) -> float:
    """The pair's function in float64 (its scale a float32, as the graph holds it)."""
    s = float(np.float32(S))
    return float(np.clip(np.round(v / s), 0, 255) * s)


@pytest.mark.parametrize("reference", ["zeros", "random"])
def test_revealcancel_takes_its_rule_at_each_pair(reference: str) -> None:
    """RevealCancel's rule holds for any elementwise nonlinearity (Shrikumar et al. 2017, 3.5.3):
    through each pair, a staircase, it matches the per-unit reference with f the pair."""
    torch.manual_seed(21)
    model = nn.Sequential(
        nn.Linear(6, 10), _Quantize(), nn.Linear(10, 8), _Quantize(), nn.Linear(8, 3)
    ).eval()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(22)) * 3
    x0 = torch.zeros_like(x) if reference == "zeros" else x.flip(0) * 0.5
    loaded = load_model(to_onnx(model, x[:1]), "onnx", "cpu")
    ctx = AttributionContext(loaded, parse_players("windows:3", (6,)), Target(), {})
    classes = np.array([0, 1, 2, 0])
    got = get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), classes)
    twin = nn.Sequential(model[0], nn.ReLU(), model[2], nn.ReLU(), model[4])  # flags the pairs' layers
    layers = dense_layers(twin, (6,))
    flat, flat0 = x.numpy().astype(np.float64), x0.numpy().astype(np.float64)
    want = np.stack(
        [revealcancel_ref(layers, flat[k], flat0[k], int(classes[k]), _on_grid) for k in range(4)]
    )
    assert np.abs(want).max() > 1e-2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_revealcancel_adds_up_to_the_quantized_graphs_difference(tmp_path: object) -> None:
    """On a quantized residual CNN (per channel), RevealCancel's attributions sum to the fake-quantized
    graph's own output difference (summation-to-delta, in float64 as its plan runs)."""
    ctx = _context(_quantized(tmp_path, per_channel=True, residual=True))
    x = X.numpy()
    x0 = np.flip(x, 0).copy()
    classes = np.array([0, 1, 2, 1])
    found = get_method("deeplift_revealcancel").attribute(ctx, x, x0, classes)
    graph = copy.deepcopy(ctx.model.torch_differentiable()).double()
    with torch.no_grad():
        delta = (graph(X.double()) - graph(torch.from_numpy(x0).double())).numpy()[np.arange(4), classes]
    assert np.count_nonzero(delta) >= 3  # the output's own pair moves by whole steps of its grid
    np.testing.assert_allclose(found.reshape(4, -1).sum(1), delta, rtol=1e-5, atol=1e-7)


def test_the_check_refuses_a_graph_that_lost_its_quantization(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversion check admits rounding flips, not a graph that computes the float model: with
    the pairs as the identity, most outputs move and the gradient methods say so."""
    monkeypatch.setattr(FakeQuantize, "forward", lambda self, x: x)
    ctx = _context(_quantized(tmp_path, per_channel=False))
    with pytest.raises(NotApplicable, match="quantized model converted for gradients"):
        check_graph_matches_model("gradient_x_input", ctx.model, X.numpy())


def test_where_onnxruntimes_kernels_compute_another_function_the_check_says_so(tmp_path: object) -> None:
    """A quantized transformer: the graph equals the model as ONNX defines it (onnxruntime with its
    graph optimizations off), while onnxruntime's fused integer kernels, which the game runs, land
    several percent away; the gradient methods are refused, saying which of the two they match."""
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(
        image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=4
    ).eval()
    with torch.no_grad():
        vit.heads.head.weight.normal_()  # torchvision starts the head at zero
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    data = _quantize_static(tmp_path, to_onnx(vit, images[:1]), images.numpy(), per_channel=True)
    model = load_model(data, "onnx", "cpu")
    x = images[:4].numpy()
    defined = model.predict_as_defined(x)
    assert defined is not None
    with torch.no_grad():
        graph = model.torch_differentiable()(images[:4]).numpy()
    np.testing.assert_allclose(graph, defined, rtol=0, atol=1e-2 * np.abs(defined).max())
    assert np.abs(model.predict(x) - defined).max() > 0.02 * np.abs(defined).max(), "the kernels differ"
    with pytest.raises(NotApplicable, match="as ONNX defines it"):
        check_graph_matches_model("gradient_x_input", model, x)
    assert load_model(to_onnx(vit, images[:1]), "onnx", "cpu").predict_as_defined(x) is None


class _Excited(nn.Module):
    """A squeeze-and-excitation block as MobileNetV3 writes it: x times a hard-sigmoid gate of its
    pooled channels (the quantizer puts the gate on its grid before the product)."""

    def __init__(self) -> None:
        super().__init__()
        self.squeeze, self.excite = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean((2, 3), keepdim=True)
        return x * nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(pooled))))


def test_lrp_holds_a_quantized_gate_and_conserves_relevance(tmp_path: object) -> None:
    """The gate reaches its product through a pair; LRP holds both (the gate's branch gets no
    relevance), so with no bias on the explained path the input's relevance sums to the output."""
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.ReLU(),
        _Excited(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3, bias=False),
    ).eval()
    rows = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(4)).numpy()
    ctx = _context(_quantize_static(tmp_path, to_onnx(model, X[:1]), rows, per_channel=True))
    graph = ctx.model.torch_hookable("lrp_epsilon")
    assert "sigmoid gates" in held_constant(graph, "lrp_epsilon")
    x, classes = X.numpy(), np.array([0, 1, 2, 1])
    relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    with torch.no_grad():
        scores = graph(X).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(
        relevance.reshape(4, -1).sum(1), scores, rtol=1e-3, atol=1e-4 * np.abs(scores).max()
    )


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(9)
        self.embed, self.hidden, self.head = nn.Embedding(40, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(self.embed(ids))).mean(1))


def test_a_quantized_token_model_is_cut_at_its_embedding(tmp_path: object) -> None:
    """Gradient methods on token ids run at the embedding's output, in a head that onnxruntime runs
    as given (quantized) and torch fake-quantized. Before, the cut was taken from the fused graph,
    which onnxruntime refuses (xaudit's operator domain), and no gradient method ran."""
    from pathlib import Path

    from clients.cli.main import main

    ids = np.random.default_rng(3).integers(1, 40, (16, 6)).astype(np.int64)
    data = _quantize_static(tmp_path, to_onnx(_Tokens().eval(), torch.from_numpy(ids[:1])), ids)
    assert "DequantizeLinear" in {n.op_type for n in onnx.load_from_string(data).graph.node}
    folder = Path(str(tmp_path))
    (folder / "q.onnx").write_bytes(data)
    np.save(folder / "ids.npy", ids[:2])
    out = folder / "maps.npz"
    job = ["--model", str(folder / "q.onnx"), "--input", str(folder / "ids.npy"), "--players", "tokens"]
    assert (
        main(["explain", *job, "--baseline", "token:0", "--methods", "gradient_x_input", "--out", str(out)])
        == 0
    )
    maps = np.load(out)["gradient_x_input"]
    assert np.isfinite(maps).all() and np.abs(maps).max() > 0


class _GeluMlp(nn.Module):
    """A transformer's MLP over tokens, no biases: GELU as the legacy exporter writes it (Div, Erf,
    Add, Mul, Mul), which the quantizer splits with a pair after each step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(10)
        self.up, self.down = nn.Linear(6, 8, bias=False), nn.Linear(8, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x))).mean(1)


def test_lrp_holds_a_quantized_gelus_factor_and_conserves_relevance(tmp_path: object) -> None:
    """GELU's factor (1 + erf(x / sqrt 2)) / 2 is held through the pairs around its steps, as in the
    float model; with no bias, the input's relevance sums to the output."""
    tokens = torch.randn(16, 5, 6, generator=torch.Generator().manual_seed(11))
    data = _quantize_static(tmp_path, to_onnx(_GeluMlp().eval(), tokens[:1]), tokens.numpy())
    assert "Erf" in {n.op_type for n in onnx.load_from_string(data).graph.node}
    model = load_model(data, "onnx", "cpu")
    ctx = AttributionContext(model, parse_players("features", (5, 6)), Target(), {})
    graph = model.torch_hookable("lrp_epsilon")
    assert "GELU's factor" in held_constant(graph, "lrp_epsilon")
    x, classes = tokens[:4].numpy(), np.array([0, 1, 2, 1])
    relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    with torch.no_grad():
        scores = graph(tokens[:4]).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(
        relevance.reshape(4, -1).sum(1), scores, rtol=1e-3, atol=1e-4 * np.abs(scores).max()
    )
