"""A batch-1 export with the exporter's defaults (torch.onnx.export, dynamo, no dynamic axes) writes
the batch of 1 into its constant shapes; xaudit rewrites them and re-batches the model only where
two rows at once give what each gives alone (workers/models/pinned_shapes.py, rebatch.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from torch import nn

from tests.unit.models._default_exports import default_and_dynamic, rebatched_as_the_twin
from workers.inputs import held_inputs_section
from workers.methods import AttributionContext, get_method
from workers.models.pinned_shapes import unpin_constant_shapes
from workers.models.rebatch import rebatched
from workers.players import parse_players
from workers.prepare import prepare
from workers.targets import Target
from xaudit.contract.spec import JobSpec

X = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
METHODS = ("integrated_gradients", "lrp_epsilon", "deeplift_rescale")


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _ConvNeXtHead(nn.Module):
    """convnext's last block and head at a 1x1 map: a channels-last residual branch, the pool, a
    LayerNorm2d and ``torch.flatten``. The dynamo exporter writes the pool's result as an identity
    ``as_strided`` (Reshape to (-1,), Gather at arange laid out (1, 8, 1, 1)) and the flatten as
    ``Reshape(x, (1, 8))``: both pin the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 8)
        self.mix = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8, 1, 1), 0.5))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = _LayerNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x))
        x = x + self.scale * self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.fc(torch.flatten(self.norm(self.pool(x)), 1))


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The head exported from a one-row example with the defaults, and with a dynamic batch."""
    torch.manual_seed(0)
    return default_and_dynamic(_ConvNeXtHead().eval(), X, tmp_path_factory.mktemp("pinned"))


def test_the_defaults_pin_the_batch_in_constant_shapes(exports: dict[str, bytes]) -> None:
    """What the rewrite is for, as torch 2.14 writes it: declared symbolic alone, two rows in give
    one row out, the first row's (the Gather reads the first row's 8 values only)."""
    proto = onnx.load_from_string(exports["defaults"])
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 8, 8]
    ops = [n.op_type for n in proto.graph.node]
    assert "Gather" in ops and ops.count("Reshape") == 2
    symbolic = onnx.load_from_string(exports["defaults"])
    symbolic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    del symbolic.graph.value_info[:]
    session = ort.InferenceSession(symbolic.SerializeToString(), providers=["CPUExecutionProvider"])
    both = session.run(None, {"x": X[:2]})[0]
    first = session.run(None, {"x": X[:1]})[0]
    assert both.shape == (1, 4)
    np.testing.assert_allclose(both, first, rtol=1e-6)


def test_a_default_export_is_rebatched_and_runs_every_method_as_its_dynamic_twin(
    exports: dict[str, bytes],
) -> None:
    spec = JobSpec(players="grid:2x2", device="cpu")
    pinned, twin = (prepare(spec, exports[k], None, {"inputs": X}) for k in ("defaults", "dynamic"))
    assert pinned.model.explained.fixed_batch is None  # re-batched: many rows per call
    session = ort.InferenceSession(exports["defaults"], providers=["CPUExecutionProvider"])
    alone = np.concatenate([session.run(None, {"x": X[i : i + 1]})[0] for i in range(len(X))])
    np.testing.assert_allclose(pinned.full_outputs, alone, rtol=1e-5, atol=1e-6)
    assert "Gather" not in {
        n.op_type for n in pinned.model.graph.proto.graph.node
    }  # the identity as_strided is gone
    # The report says so: the flatten's Reshape and the Gather rewritten; the twin needs nothing.
    assert held_inputs_section(pinned.model)["rebatched"] == {"declared_batch": 1, "rewritten_nodes": 2}
    assert "rebatched" not in held_inputs_section(twin.model)
    players = parse_players("grid:2x2", X.shape[1:])
    classes = alone.argmax(1)
    # DeepLIFT feeds its inputs and references in one call: before, not applicable on this export.
    for name in ("deeplift_rescale", "lrp_epsilon", "integrated_gradients", "grad_cam"):
        got, want = (
            get_method(name).attribute(
                AttributionContext(p.model, players, Target(), {}), X, np.zeros_like(X), classes
            )
            for p in (pinned, twin)
        )
        assert np.abs(want).max() > 1e-4, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def _transposed_flatten() -> onnx.ModelProto:
    """x (1, 4, 3) -> Transpose (4, 1, 3) -> Reshape (1, 12) -> MatMul: the Reshape's leading 1 is
    not the batch. Rewritten to (-1, 12), two rows would mix: row 0 would read both rows' values."""
    rng = np.random.default_rng(5)
    nodes = [
        oh.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        oh.make_node("Constant", [], ["shape"], value=nh.from_array(np.array([1, 12], np.int64))),
        oh.make_node("Reshape", ["t", "shape"], ["f"]),
        oh.make_node("MatMul", ["f", "w"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        initializer=[nh.from_array(rng.standard_normal((12, 2)).astype(np.float32), "w")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_a_rewrite_that_would_mix_rows_is_refused_by_the_two_row_check() -> None:
    model = _transposed_flatten()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert unpin_constant_shapes(rewritten, "x", ()) == 1  # rewritten, so only the check stands in the way
    assert not any(n.op_type == "Constant" for n in rewritten.graph.node)  # the replaced shape dropped
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rows = np.random.default_rng(6).standard_normal((1, 4, 3)).astype(np.float32)
    assert rebatched(model, "x", {"x": rows}, {"x"}, session) is None
    inputs = np.random.default_rng(7).standard_normal((3, 4, 3)).astype(np.float32)
    prep = prepare(
        JobSpec(players="windows:3", device="cpu"), model.SerializeToString(), None, {"inputs": inputs}
    )
    assert prep.model.explained.fixed_batch == 1  # evaluated one row per call, and right
    alone = np.concatenate([session.run(None, {"x": inputs[i : i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(prep.full_outputs, alone, rtol=1e-6)


def test_a_gather_that_is_not_the_identity_is_kept() -> None:
    """Gather of a flattened tensor at reversed indices reorders it: not rewritten."""
    nodes = [
        oh.make_node("Reshape", ["x", "flat"], ["f"]),
        oh.make_node("Gather", ["f", "order"], ["y"], axis=0),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        initializer=[
            nh.from_array(np.array([-1], np.int64), "flat"),
            nh.from_array(np.arange(6, dtype=np.int64)[::-1].reshape(1, 6).copy(), "order"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    assert unpin_constant_shapes(model, "x", ()) == 0
    assert [n.op_type for n in model.graph.node] == ["Reshape", "Gather"]


class _TextRnn(nn.Module):
    """Token ids -> nn.Embedding -> nn.LSTM or nn.GRU (batch first) -> Linear on the last step, as a
    text classifier is built from torch's own layers."""

    def __init__(self, cell: str, bidirectional: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 8)
        self.rnn = getattr(nn, cell)(8, 12, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(24 if bidirectional else 12, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embed(ids))
        return self.out(states[:, -1])


@pytest.mark.parametrize(("cell", "bidirectional"), [("LSTM", False), ("GRU", True)])
def test_a_default_export_of_a_text_rnn_is_rebatched_as_its_dynamic_twin(
    cell: str, bidirectional: bool, tmp_path: Path
) -> None:
    """The dynamo exporter writes the default initial state as constant zeros sized (directions, 1,
    hidden) and the time-major outputs' Reshape as (T, 1, H): both pin the batch. Before, such a
    model ran one row per call: `--methods all` on one sentence of 10 tokens took 461 s (Integrated
    Gradients 406 s), DeepLIFT not applicable; re-batched, 6.7 s."""
    torch.manual_seed(1)
    ids = np.random.default_rng(2).integers(1, 40, (3, 10)).astype(np.int64)
    exports = default_and_dynamic(_TextRnn(cell, bidirectional).eval(), ids, tmp_path, "ids")
    proto = onnx.load_from_string(exports["defaults"])
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [1, 10]
    assert cell in {n.op_type for n in proto.graph.node}
    spec = JobSpec(kind="attribution", players="tokens", baseline="token:0", device="cpu", methods=METHODS)
    rebatched_as_the_twin(exports, ids, spec, floor=1e-3)


@pytest.mark.parametrize("state", [0.0, 0.5])
def test_only_a_zero_initial_state_is_left_to_the_operator(state: float) -> None:
    """An initial state of zeros is the operator's default at any batch; any other is the model's."""
    rng = np.random.default_rng(4)
    weights = [
        nh.from_array(rng.standard_normal((1, 6, 3)).astype(np.float32), "w"),
        nh.from_array(rng.standard_normal((1, 6, 2)).astype(np.float32), "r"),
        nh.from_array(np.full((1, 1, 2), state, np.float32), "h0"),
    ]
    graph = oh.make_graph(
        [oh.make_node("GRU", ["x", "w", "r", "", "", "h0"], ["y", "h"], hidden_size=2)],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 3])],
        [oh.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, 2])],
        initializer=weights,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((5, 1, 3)).astype(np.float32)
    want = before.run(None, {"x": x})[0]
    assert unpin_constant_shapes(model, "x", ()) == (1 if state == 0.0 else 0)
    assert (model.graph.node[0].input[5] == "") == (state == 0.0)
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(after.run(None, {"x": x})[0], want, rtol=1e-6)


class _UpsamplingHead(nn.Module):
    """Features at a quarter of the image, upsampled to a fixed size (``F.interpolate(x, size=...)``,
    as LRASPP's head does), then a 1x1 convolution and a mean: a segmentation head, one score."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 4, 4, stride=4)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = nn.functional.interpolate(torch.relu(self.down(x)), size=(8, 8), mode="bilinear")
        return self.out(up).mean((2, 3))


def test_a_resize_to_a_fixed_size_is_rebatched_as_its_dynamic_twin(tmp_path: Path) -> None:
    """The dynamo exporter writes the interpolation as Resize to sizes (1, 4, 8, 8): it pinned the
    batch (torchvision's lraspp_mobilenet_v3_large exported with the defaults ran one row per call)."""
    torch.manual_seed(2)
    exports = default_and_dynamic(_UpsamplingHead().eval(), X, tmp_path)
    resize = next(n for n in onnx.load_from_string(exports["defaults"]).graph.node if n.op_type == "Resize")
    assert resize.input[3]  # to sizes, not scales
    spec = JobSpec(kind="attribution", players="grid:2x2", device="cpu", methods=METHODS)
    rebatched_as_the_twin(exports, X, spec, floor=1e-4)


class _HfVit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(
            image_size=8, patch_size=4, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, num_labels=3, initializer_range=0.3,
        )  # fmt: skip
        self.vit = ViTForImageClassification(config).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=x).logits


def test_a_default_export_of_transformers_vit_is_rebatched_as_its_dynamic_twin(tmp_path: Path) -> None:
    """From one row the exporter drops the class token's expansion to the batch and concatenates the
    (1, 1, 32) parameter itself to the patches: the token is expanded to the rows again."""
    torch.manual_seed(3)
    exports = default_and_dynamic(_HfVit().eval(), X, tmp_path)
    ops = [n.op_type for n in onnx.load_from_string(exports["defaults"]).graph.node]
    assert "Concat" in ops and "Expand" not in ops
    spec = JobSpec(kind="attribution", players="grid:2x2", device="cpu", methods=METHODS)
    rebatched_as_the_twin(exports, X, spec, floor=1e-4)
