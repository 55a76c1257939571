"""A Keras 3 CNN (torch backend) exported by Keras' own ``model.export(format="onnx")``, as another team
would ship it: a channels-last input, a no-op ``Cast`` after most layers, and every convolution
written ``Transpose -> Conv (no bias) -> Transpose -> Add(bias)``. The methods' graph makes each Cast
the identity and gives each Conv its bias (workers/models/dense_layers.py), and Deep Taylor's z-beta
terms are taken back through the input's transpose (workers/methods/_modified_backward.py), so the
five rule methods run xaudit's own passes and give the numbers of a torch twin built from the same
weights (channels first; the twin's passes are checked against Zennit and Captum elsewhere). A
batch norm, which Keras writes out as Sub, Mul, Add, is folded into its convolution the same way.
Before, all five were refused at the first Cast."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from workers.inspect_model import inspect_model
from workers.methods import AttributionContext, get_method
from workers.models import load_model
from workers.models.dense_layers import fuse_dense_layers
from workers.players import parse_players
from workers.targets import Target

_RULES = ("lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_rescale", "deeplift_revealcancel")
_SHAPE = (10, 10, 3)  # height, width, channels: Keras' default layout

_KERAS = """
import os, sys
os.environ["KERAS_BACKEND"] = "torch"
import numpy as np
import keras

keras.utils.set_random_seed(0)
"""
_EXPORT = """
model.export(sys.argv[1] + "/model.onnx", format="onnx", verbose=False)
np.savez(sys.argv[1] + "/weights.npz", *model.get_weights())
"""


def _keras_export(build: str, where: Path) -> tuple[bytes, list[np.ndarray]]:
    """Run ``build`` (it makes ``model`` and calls it once: Keras exports a called model only) in its
    own process with Keras on torch, export it with Keras' defaults, and return the ONNX model and
    the model's weights."""
    script = _KERAS + build + _EXPORT
    subprocess.run([sys.executable, "-c", script, str(where)], check=True, capture_output=True, timeout=300)
    saved = np.load(where / "weights.npz")
    return (where / "model.onnx").read_bytes(), [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _first(a: np.ndarray) -> np.ndarray:
    """Channels-last rows as the channels-first twin reads them."""
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def _assert_twins_numbers(
    data: bytes, twin: nn.Module, method: str, classes: list[int], seed: int
) -> np.ndarray:
    """``method`` on the Keras export gives the numbers of its channels-first torch ``twin``, on rows
    of normal inputs and references a tenth their size; returns the rows."""
    r = np.random.default_rng(seed)
    x = r.normal(size=(len(classes), *_SHAPE)).astype(np.float32)
    x0 = 0.1 * r.normal(size=x.shape).astype(np.float32)
    chosen = np.array(classes)
    ctx = AttributionContext(load_model(data, "onnx", "cpu"), parse_players("grid:2x2", _SHAPE), Target(), {})
    got = get_method(method).attribute(ctx, x, x0, chosen)
    twin_ctx = context(twin, torch.from_numpy(_first(x[:1])))
    want = get_method(method).attribute(twin_ctx, _first(x), _first(x0), chosen)
    np.testing.assert_allclose(_first(got), want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3  # not two maps of zeros
    return x


_BUILD = textwrap.dedent(
    """
    inputs = keras.Input((10, 10, 3))
    # Zero biases: about half the first ReLUs are off, so max-pool windows of zeros (ties) are common,
    # and RevealCancel's float64 plan (the Keras graph's Transposes) and float32 plan (the twin) must
    # break them alike (workers/methods/_max_pool_ties.py).
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(6, 3, activation="relu", bias_initializer="random_normal")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    model.predict(np.zeros((1, 10, 10, 3), np.float32), verbose=0)
    """
)


@pytest.fixture(scope="module")
def keras_cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[np.ndarray]]:
    return _keras_export(_BUILD, tmp_path_factory.mktemp("keras"))


def _twin(weights: list[np.ndarray]) -> nn.Sequential:
    """The same CNN channels first, in torch."""
    k1, b1, k2, b2, dense, b3 = (torch.from_numpy(w.astype(np.float32)) for w in weights)
    conv1, conv2, linear = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3), nn.Linear(6, 3)
    with torch.no_grad():
        for layer, weight, bias in ((conv1, k1.permute(3, 2, 0, 1), b1), (conv2, k2.permute(3, 2, 0, 1), b2)):
            layer.weight.copy_(weight)  # Keras' kernels are (height, width, in, out)
            layer.bias.copy_(bias)
        linear.weight.copy_(dense.T)
        linear.bias.copy_(b3)
    return nn.Sequential(
        conv1, nn.ReLU(), nn.MaxPool2d(2), conv2, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), linear
    ).eval()


def test_the_export_is_written_the_way_the_rewrites_read(keras_cnn: tuple[bytes, list[np.ndarray]]) -> None:
    data, weights = keras_cnn
    model = onnx.load_from_string(data)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == list(_SHAPE)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Cast") >= 5 and ops[:4] == ["Cast", "Cast", "Cast", "Transpose"], ops
    assert all(len(node.input) == 2 for node in model.graph.node if node.op_type == "Conv"), "bias-free Convs"
    rewritten = fuse_dense_layers(model)
    ops = [node.op_type for node in model.graph.node]
    assert "Cast" not in ops and "Add" not in ops and ops.count("Gemm") == 1, ops
    assert (
        rewritten == 15 + 2 + 1
    )  # the Casts, the Convs' biases, the Dense layer (its pool's axes a Constant)
    x = np.random.default_rng(0).normal(size=(4, *_SHAPE)).astype(np.float32)
    name = model.graph.input[0].name
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {name: x}
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    twin = _twin(weights)(torch.from_numpy(x).permute(0, 3, 1, 2)).detach().numpy()
    np.testing.assert_allclose(twin, want, rtol=1e-4, atol=1e-5)


def test_the_rule_methods_run_their_own_passes(keras_cnn: tuple[bytes, list[np.ndarray]]) -> None:
    check = inspect_model(keras_cnn[0])
    assert "grid:3x3, patches over height and width, the channels last" in check.text()
    methods = check.methods
    assert all(methods[name].startswith("runs: torch graph") for name in _RULES), methods
    assert "xaudit's Rescale pass" in methods["deeplift_rescale"], methods
    from workers.models.named import OnnxGraph

    graph = OnnxGraph(keras_cnn[0], "sha", torch.device("cpu")).torch_graph(None)
    kinds = {type(m).__name__ for m in graph.modules()} - {"GraphModule", "GraphModuleImpl"}
    assert kinds <= {
        "Conv2d",
        "DenseGradientConv2d",
        "Linear",
        "ReLU",
        "MaxPool2d",
        "OnnxTranspose",
        "OnnxReduceStaticAxes",
    }, kinds


@pytest.mark.parametrize("method", _RULES)
def test_the_rule_methods_give_the_twins_numbers(
    keras_cnn: tuple[bytes, list[np.ndarray]], method: str
) -> None:
    data, weights = keras_cnn
    _assert_twins_numbers(data, _twin(weights), method, [0, 2, 1, 0], seed=1)


def test_a_bias_along_another_axis_stays_an_add() -> None:
    """After the transpose to (N, H, W, C), a (C, 1) constant broadcasts along the width, not the channels:
    it is not the Conv's bias."""
    from onnx import TensorProto
    from onnx import helper as oh
    from onnx import numpy_helper as nh

    r = np.random.default_rng(2)
    kernel = nh.from_array(r.normal(size=(5, 3, 3, 3)).astype(np.float32), "k")
    bias = nh.from_array(r.normal(size=(5, 1)).astype(np.float32), "b")
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
         oh.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
         oh.make_node("Add", ["t", "b"], ["y"])],
        "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 5, 5])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [kernel, bias],
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    assert fuse_dense_layers(model) == 0
    assert [node.op_type for node in model.graph.node] == ["Conv", "Transpose", "Add"]
    bias.CopyFrom(nh.from_array(r.normal(size=(5,)).astype(np.float32), "b"))
    model.graph.initializer[1].CopyFrom(bias)
    assert fuse_dense_layers(model) == 1
    assert [node.op_type for node in model.graph.node] == ["Conv", "Transpose"]


_BUILD_LSTM = textwrap.dedent(
    """
    inputs = keras.Input((7, 4))  # (time, features)
    x = keras.layers.LSTM(5, bias_initializer="random_normal")(inputs)
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    model.predict(np.zeros((1, 7, 4), np.float32), verbose=0)
    """
)


class _UnrolledLstm(nn.Module):
    """Keras' LSTM (gates i, f, c, o; sigmoid gates, tanh) written out step by step, as its export is."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        super().__init__()
        kernel, recurrent, bias, dense, dense_bias = (torch.from_numpy(w) for w in weights)
        self.units = recurrent.shape[0]
        self.x, self.h = (
            nn.Linear(kernel.shape[0], 4 * self.units),
            nn.Linear(self.units, 4 * self.units, bias=False),
        )
        self.out = nn.Linear(self.units, dense.shape[1])
        with torch.no_grad():
            self.x.weight.copy_(kernel.T)
            self.x.bias.copy_(bias)
            self.h.weight.copy_(recurrent.T)
            self.out.weight.copy_(dense.T)
            self.out.bias.copy_(dense_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.units
        h = c = torch.zeros(x.shape[0], u)
        for t in range(x.shape[1]):
            z = self.x(x[:, t]) + self.h(h)
            i, f, g, o = z[:, :u], z[:, u : 2 * u], z[:, 2 * u : 3 * u], z[:, 3 * u :]
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.out(h)


@pytest.mark.parametrize("method", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_a_keras_lstm_gets_lrp_with_its_gates_held(tmp_path: Path, method: str) -> None:
    """Keras writes its LSTM out step by step (MatMul, Slice, Sigmoid, Tanh, Mul) with Casts between;
    the Casts after its Gathers and Slices were of unknown type and stopped LRP. Now LRP holds the
    sigmoid gates constant (Arras et al. 2017) and gives the numbers of the same LSTM written out in
    torch (Deep Taylor with z-beta at each step's input layer); players are windows of time
    (windows:K:axis=0; plain windows:K cuts the features axis)."""
    data, weights = _keras_export(_BUILD_LSTM, tmp_path)
    twin = _UnrolledLstm(weights).eval()
    x = np.random.default_rng(1).normal(size=(3, 7, 4)).astype(np.float32)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got_out = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got_out, twin(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    players = parse_players("windows:4:axis=0", (7, 4))
    np.testing.assert_array_equal(players.labels[:, 0], [0, 0, 1, 1, 2, 3, 3])  # time windows
    assert (players.labels == players.labels[:, :1]).all()  # every feature with its time step
    classes, x0 = np.array([0, 1, 2]), np.zeros_like(x)

    def attribution(model: bytes) -> np.ndarray:
        ctx = AttributionContext(load_model(model, "onnx", "cpu"), players, Target(), {})
        return get_method(method).attribute(ctx, x, x0, classes)

    want = attribution(to_onnx(twin, torch.from_numpy(x[:1])))
    np.testing.assert_allclose(attribution(data), want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))


_BUILD_BATCH_NORM = textwrap.dedent(
    """
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(inputs)
    norm = keras.layers.BatchNormalization()
    x = keras.layers.ReLU()(norm(x))
    x = keras.layers.Dropout(0.3)(x)
    x = keras.layers.Conv2D(5, 3, strides=2, activation="relu", bias_initializer="random_normal")(x)
    x = keras.layers.Flatten()(x)  # a Reshape to a shape computed from Shape(x) at run time
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    r = np.random.default_rng(0)  # running statistics as after training; a negative scale among them
    norm.set_weights([np.array([1.5, -0.7, 0.9, 1.2]), r.normal(size=4), r.normal(size=4), r.uniform(0.5, 2, 4)])
    model.predict(np.zeros((1, 10, 10, 3), np.float32), verbose=0)
    """
)


def _batch_norm_twin(weights: list[np.ndarray]) -> nn.Sequential:
    k1, gamma, beta, mean, var, k2, b2, dense, b3 = (torch.from_numpy(w.astype(np.float32)) for w in weights)
    conv1, norm, conv2 = (
        nn.Conv2d(3, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4, eps=1e-3),
        nn.Conv2d(4, 5, 3, 2),
    )
    linear = nn.Linear(80, 3)
    with torch.no_grad():
        conv1.weight.copy_(k1.permute(3, 2, 0, 1))
        norm.weight.copy_(gamma)
        norm.bias.copy_(beta)
        norm.running_mean.copy_(mean)
        norm.running_var.copy_(var)
        conv2.weight.copy_(k2.permute(3, 2, 0, 1))
        conv2.bias.copy_(b2)
        linear.weight.copy_(dense.T)
        linear.bias.copy_(b3)
    return nn.Sequential(
        conv1, norm, nn.ReLU(), conv2, nn.ReLU(), _ChannelsLast(), nn.Flatten(), linear
    ).eval()


class _ChannelsLast(nn.Module):
    """Keras flattens (H, W, C) activations: the twin's Flatten reads them in that order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1)


@pytest.mark.parametrize("method", _RULES)
def test_a_keras_batch_norm_is_folded_into_its_convolution(tmp_path: Path, method: str) -> None:
    """Keras writes an inference batch norm out as Sub(mean), Mul(scale), Add(beta) on the channels-last
    activations, and its Flatten as a Reshape to a shape computed at run time; RevealCancel and
    DeepLIFT's own pass stopped at the Sub, then at the Dense layer's MatMul, whose input rank could
    not be told. The methods' graph folds the norm into the convolution (as torch's exporter and
    Zennit's canonizers do) and reads the Reshape's rank from its shape's length, and every rule
    method gives the numbers of the torch twin with its BatchNorm2d."""
    data, weights = _keras_export(_BUILD_BATCH_NORM, tmp_path)
    twin = _batch_norm_twin(weights)
    assert {"Sub", "Mul"} <= {node.op_type for node in onnx.load_from_string(data).graph.node}
    if method == "deeplift_rescale":
        assert "xaudit's Rescale pass" in inspect_model(data).methods[method]
    _assert_twins_numbers(data, twin, method, [0, 2, 1, 0], seed=1)


_BUILD_PADDED = textwrap.dedent(
    """
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.ZeroPadding2D(1)(inputs)  # as keras.applications' ResNets and MobileNets begin
    x = keras.layers.Conv2D(4, 3, activation="relu", bias_initializer=keras.initializers.Constant(3.0))(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    model.predict(np.zeros((1, 10, 10, 3), np.float32), verbose=0)
    """
)


@pytest.mark.parametrize("method", ["deep_taylor", "lrp_epsilon"])
def test_deep_taylor_reads_the_input_through_keras_zero_padding(tmp_path: Path, method: str) -> None:
    """ZeroPadding2D is a Pad between the input's Transpose and the first convolution, where Deep
    Taylor's z-beta terms sit; it was refused there. The padded positions hold no input, so their
    bounds are 0: the numbers of the twin whose convolution pads by itself."""
    data, weights = _keras_export(_BUILD_PADDED, tmp_path)
    assert "Pad" in {node.op_type for node in onnx.load_from_string(data).graph.node}
    k1, b1, dense, b2 = (torch.from_numpy(w.astype(np.float32)) for w in weights)
    conv, linear = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 3)
    with torch.no_grad():
        conv.weight.copy_(k1.permute(3, 2, 0, 1))
        conv.bias.copy_(b1)
        linear.weight.copy_(dense.T)
        linear.bias.copy_(b2)
    twin = nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), linear).eval()
    _assert_twins_numbers(data, twin, method, [2, 0, 1], seed=3)


_BUILD_DENSE_BLOCK = textwrap.dedent(
    """
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Normalization(mean=[0.2, -0.1, 0.4], variance=[0.5, 2.0, 1.5])(inputs)
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", bias_initializer=keras.initializers.Constant(3.0))(x)
    x = keras.layers.MaxPooling2D()(x)
    grown = keras.layers.Conv2D(4, 3, padding="same", bias_initializer="random_normal")(x)
    x = keras.layers.Concatenate()([x, grown])  # a dense block: the norm after it cannot be folded
    norm = keras.layers.BatchNormalization()
    x = keras.layers.ReLU()(norm(x))
    x = keras.layers.Conv2D(5, 3, activation="relu", bias_initializer="random_normal")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    r = np.random.default_rng(0)
    scale = np.array([1.5, -0.7, 0.9, 1.2, 0.8, 1.1, -1.3, 0.6])
    norm.set_weights([scale, r.normal(size=8), r.normal(size=8), r.uniform(0.5, 2, 8)])
    model.predict(np.zeros((1, 10, 10, 3), np.float32), verbose=0)
    """
)


class _DenseBlockTwin(nn.Module):
    def __init__(self, weights: list[np.ndarray]) -> None:
        super().__init__()
        k1, b1, k2, b2, gamma, beta, moving_mean, moving_var, k3, b3, dense, b4 = (
            torch.from_numpy(np.asarray(w, np.float32)) for w in weights
        )  # the Normalization's mean and variance are the build's constants, not weights
        self.register_buffer("mean", torch.tensor([0.2, -0.1, 0.4]).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.5, 2.0, 1.5]).sqrt().reshape(1, 3, 1, 1))
        self.conv1, self.grow, self.conv3 = (
            nn.Conv2d(3, 4, 3, padding=1),
            nn.Conv2d(4, 4, 3, padding=1),
            nn.Conv2d(8, 5, 3),
        )
        self.norm, self.linear = nn.BatchNorm2d(8, eps=1e-3), nn.Linear(5, 3)
        with torch.no_grad():
            for layer, kernel, bias in ((self.conv1, k1, b1), (self.grow, k2, b2), (self.conv3, k3, b3)):
                layer.weight.copy_(kernel.permute(3, 2, 0, 1))
                layer.bias.copy_(bias)
            for name, value in (
                ("weight", gamma),
                ("bias", beta),
                ("running_mean", moving_mean),
                ("running_var", moving_var),
            ):
                getattr(self.norm, name).copy_(value)
            self.linear.weight.copy_(dense.T)
            self.linear.bias.copy_(b4)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1((x - self.mean) / self.std)), 2)
        x = torch.relu(self.norm(torch.cat([x, self.grow(x)], 1)))
        return self.linear(torch.relu(self.conv3(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def keras_dense_block(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[np.ndarray]]:
    return _keras_export(_BUILD_DENSE_BLOCK, tmp_path_factory.mktemp("keras_dense_block"))


@pytest.mark.parametrize("method", _RULES)
def test_a_keras_norm_after_a_concatenation_is_the_batch_norm_it_stands_for(
    keras_dense_block: tuple[bytes, list[np.ndarray]], method: str
) -> None:
    """Keras writes a batch norm after a concatenation (DenseNet's dense blocks) and its Normalization
    layer as Sub, Mul, Add and Div with per-channel constants: RevealCancel refused them, DeepLIFT
    Rescale went to Captum, and LRP gave the shift a bias's share. The methods' graph makes each such
    run the BatchNormalization it is (workers/models/dense_layers.py), so every rule method runs its
    own pass with the numbers of the torch twin with its BatchNorm2d (LRP's epsilon rule on it as a
    diagonal layer; the relevance taken at the normalized input; Deep Taylor's bounds carried through
    the Normalization)."""
    data, weights = keras_dense_block
    said = inspect_model(data).methods[method]
    assert said.startswith("runs: torch graph") and "Captum" not in said, said
    twin = _DenseBlockTwin(weights)
    x = _assert_twins_numbers(data, twin, method, [0, 2, 1], seed=1)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        twin(torch.from_numpy(_first(x))).detach().numpy(),
        session.run(None, {session.get_inputs()[0].name: x})[0], rtol=1e-4, atol=1e-5,
    )  # fmt: skip
