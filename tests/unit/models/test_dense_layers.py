"""Dense layers written as MatMul + Add after a no-op Cast (skl2onnx's MLPs, tf2onnx's Dense) made one
Gemm for the methods' graph (workers/models/dense_layers.py): the same outputs as onnxruntime and
scikit-learn, and the rule methods plan the graph; what cannot be told to be a matrix stays."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from skl2onnx import to_onnx
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from workers.inspect_model import inspect_model
from workers.models.dense_layers import fuse_dense_layers
from workers.models.onnx_to_torch import onnx_to_torch

_RULES = ("lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_rescale", "deeplift_revealcancel")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("classes", [2, 3])
def test_scikit_learn_mlp_is_linear_layers_with_its_own_probabilities(classes: int) -> None:
    """Two classes: [1 - sigmoid(z), sigmoid(z)] becomes one two-column layer and a sigmoid."""
    r = np.random.default_rng(0)
    x = r.normal(size=(200, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + (classes == 3) * (x[:, 1] > 0.5).astype(int)
    pipeline = make_pipeline(StandardScaler(), MLPClassifier((8,), max_iter=200, random_state=0)).fit(x, y)
    data = to_onnx(pipeline, x[:1]).SerializeToString()
    check = inspect_model(data)
    assert all(check.methods[name].startswith("runs: torch graph; xaudit") or name == "deeplift_revealcancel"
               for name in _RULES), check.methods  # fmt: skip
    assert check.methods["deeplift_revealcancel"].startswith("runs"), check.methods
    from workers.models.named import OnnxGraph

    graph = OnnxGraph(data, "sha", torch.device("cpu")).torch_graph("output_probability")
    kinds = {type(m).__name__ for m in graph.modules()} - {"GraphModule", "GraphModuleImpl"}
    assert kinds <= {"Linear", "ReLU", "Sigmoid", "Softmax", "OnnxCopyIdentity", "Identity"}, kinds
    got = graph(torch.from_numpy(x[:16])).detach().numpy()
    np.testing.assert_allclose(got, pipeline.predict_proba(x[:16]), rtol=1e-5, atol=1e-6)


def _model(nodes: list, shape: list, inits: list) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _dense(shape: list) -> onnx.ModelProto:
    r = np.random.default_rng(1)
    inits = [
        nh.from_array(r.standard_normal((4, 3)).astype(np.float32), "w"),
        nh.from_array(r.standard_normal((1, 3)).astype(np.float32), "b"),
    ]
    nodes = [
        oh.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        oh.make_node("MatMul", ["xf", "w"], ["h"]),
        oh.make_node("Add", ["h", "b"], ["y"]),
    ]
    return _model(nodes, shape, inits)


@pytest.mark.parametrize(("shape", "fused"), [(["N", 4], True), (["N", "S", 4], False)])
def test_only_a_product_of_matrices_becomes_a_gemm(shape: list, fused: bool) -> None:
    """Rank 2: one Gemm and no Cast, as onnxruntime computes it; rank 3 (a transformer's activations):
    MatMul and Add as they were, where a Gemm would be undefined."""
    model = _dense(shape)
    x = np.random.default_rng(2).standard_normal([3, 4] if len(shape) == 2 else [3, 5, 4]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fuse_dense_layers(copy)
    ops = [n.op_type for n in copy.graph.node]
    assert ops == (["Gemm"] if fused else ["MatMul", "Add"])  # the no-op Cast's reader reads its input
    rewritten = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(rewritten, want, rtol=1e-6, atol=1e-6)
    got = onnx_to_torch(model)(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_cast_that_changes_the_type_stays() -> None:
    model = _model(
        [
            oh.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
            oh.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT),
        ],
        ["N", 4],
        [],
    )
    assert fuse_dense_layers(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Cast", "Cast"]


def _scaled_and_shifted(
    shapes: dict[str, tuple[int, ...]], ops: str, constants_as_nodes: bool = False
) -> onnx.ModelProto:
    """x (N, ...) -> Relu -> one op per letter of ``ops`` (s: Sub, m: Mul, a: Add, d: Div) by the
    constant of that letter's shape, as Keras writes a batch norm or a Normalization layer."""
    r = np.random.default_rng(2)
    names = {"s": "Sub", "m": "Mul", "a": "Add", "d": "Div"}
    nodes, inits, value = [oh.make_node("Relu", ["x"], ["r"])], [], "r"
    for i, letter in enumerate(ops):
        constant = (r.uniform(0.5, 2.0, shapes[letter]) * r.choice([-1, 1], shapes[letter])).astype(
            np.float32
        )
        tensor = nh.from_array(constant, f"c{i}")
        if constants_as_nodes:
            nodes.append(oh.make_node("Constant", [], [f"c{i}"], value=tensor))
        else:
            inits.append(tensor)
        out = "y" if i == len(ops) - 1 else f"v{i}"
        nodes.append(oh.make_node(names[letter], [value, f"c{i}"], [out]))
        value = out
    return nodes, inits


@pytest.mark.parametrize(
    ("shape", "constants", "ops", "expected"),
    [
        (
            [None, 3, 4, 5],
            {"s": (1, 3, 1, 1), "m": (3, 1, 1), "a": (1, 3, 1, 1)},
            "sma",
            ["BatchNormalization"],
        ),
        (
            [None, 4, 5, 3],
            {"s": (3,), "m": (1, 1, 1, 3), "a": (3,)},
            "sma",
            ["Transpose", "BatchNormalization", "Transpose"],
        ),
        ([None, 6], {"s": (6,), "d": (1, 6)}, "sd", ["BatchNormalization"]),
        ([None, 6], {"s": (6,), "m": (1,), "a": (6,)}, "sma", ["BatchNormalization"]),  # a scalar among them
        ([None, 3, 4, 5], {"a": (1, 3, 1, 1)}, "a", ["Add"]),  # a shift alone: a bias's rule
        ([None, 3, 4, 5], {"m": (3, 1, 1)}, "m", ["Mul"]),  # a scaling alone: a factor's rule
        ([None, 3, 4, 5], {"s": (1,), "m": (1,)}, "sm", ["Sub", "Mul"]),  # no channel axis to read
        ([None, 3, 4, 5], {"s": (3, 4, 5), "m": (3, 1, 1)}, "sm", ["Sub", "Mul"]),  # per element
        ([None, 3, 4, 5], {"s": (1, 1, 4, 1), "m": (1, 1, 4, 1)}, "sm", ["Sub", "Mul"]),  # along the height
    ],
)
@pytest.mark.parametrize("as_nodes", [False, True], ids=["weights", "constant-nodes"])
def test_a_run_of_per_channel_constants_is_the_batch_norm_it_stands_for(
    shape: list, constants: dict, ops: str, expected: list[str], as_nodes: bool
) -> None:
    """Keras writes a batch norm no convolution takes in (after a pooling or a concatenation) as
    Sub, Mul, Add, and its Normalization layer as Sub, Div, with per-channel constants (in Constant
    nodes for the latter): one BatchNormalization (between Transposes where the channels are last),
    with the same values; anything else stays as it is."""
    nodes, inits = _scaled_and_shifted(constants, ops, as_nodes)
    model = _model(nodes, shape, inits)
    original = model.SerializeToString()
    rewritten = fuse_dense_layers(model)
    ops_after = [n.op_type for n in model.graph.node if n.op_type not in ("Relu", "Constant")]
    assert ops_after == expected
    assert rewritten == (1 if "BatchNormalization" in expected else 0)
    x = (
        np.random.default_rng(3)
        .normal(size=(2, *[5 if d is None else d for d in shape[1:]]))
        .astype(np.float32)
    )
    run = lambda data: ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    np.testing.assert_allclose(run(model.SerializeToString()), run(original), rtol=1e-5, atol=1e-6)


class _CastAfterGelu(torch.nn.Module):
    """``h.to(x.dtype)`` after an exact GELU, as transformers' wav2vec2 casts its encoder's input: the
    legacy exporter writes a Cast to float after the GELU it writes out, which the methods' graph
    fuses to one Gelu before this module reads the types."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x)).to(x.dtype))


def test_a_no_op_cast_after_a_fused_gelu_is_dropped_and_lrp_runs() -> None:
    """The type was lost at the fused Gelu (a node of xaudit's domain), the Cast kept, and every LRP
    method refused it ("OnnxCast has no LRP rule")."""
    from tests.models import to_onnx
    from tests.unit.methods._context import context
    from workers.methods import get_method

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    proto = onnx.load_from_string(to_onnx(_CastAfterGelu().eval(), x[:1]))
    assert "Cast" in {n.op_type for n in proto.graph.node}
    assert "Cast" not in {type(m).__name__.removeprefix("Onnx") for m in onnx_to_torch(proto).modules()}
    ctx = context(_CastAfterGelu().eval(), x[:1])
    relevance = get_method("lrp_epsilon").attribute(
        ctx, x.numpy(), np.zeros_like(x.numpy()), np.array([0, 1, 2])
    )
    assert np.isfinite(relevance).all() and np.abs(relevance).max() > 1e-3
