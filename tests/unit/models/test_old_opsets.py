"""Models at opsets 7 to 9, as the ONNX Model Zoo's classic models are (workers/models/onnx_to_torch.py,
``_upgrade_opset``).

onnx2torch has no converter for BatchNormalization-7, Gemm-7, Flatten-1, MaxPool-1, Dropout-7,
Slice-1 or Upsample, so every gradient and rule method was refused on such a model while the game
ran it. The methods' graph is now built from the model upgraded to opset 13 by onnx's version
converter, and gives the attributions of the same network exported at opset 17. Two more things
the old exports wrote: max pools padded at their far ends (ceil-mode pools before opset 10) and the
former experimental ImageScaler."""

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
from workers.models import load_model
from workers.models.ceil_mode_pools import ceil_mode_pools
from workers.models.onnx_shapes import SHAPE_BYTES, nbytes
from workers.models.onnx_to_torch import _upgrade_opset, onnx_to_torch, unconvertible_nodes
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(31))


class _Classic(nn.Module):
    """Conv, an unfolded batch norm, max pooling, a nearest upsampling, a slice, dropout and a Linear
    head: the operators whose old versions onnx2torch lacks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(32)
        self.conv1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.pool, self.up = nn.MaxPool2d(2), nn.Upsample(size=(8, 8), mode="nearest")
        self.conv2, self.drop = nn.Conv2d(8, 4, 1), nn.Dropout(0.2)
        self.fc = nn.Sequential(
            nn.Linear(4 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, 3)
        )  # a weight over 64 KB
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.3, 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.bn(self.conv1(x))))
        h = torch.relu(self.conv2(self.up(h)))[:, :, 1:, 1:]
        return self.fc(self.drop(torch.flatten(h, 1)))


def _exported(opset: int) -> bytes:
    """The legacy exporter at ``opset`` from a one-row example, with no dynamic axes (Upsample's
    export at opsets 7 and 8 takes none), batch norms unfolded (training mode off, as exported)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Classic().eval(),
            (X[:1],),
            buffer,
            dynamo=False,
            opset_version=opset,
            input_names=["input"],
            do_constant_folding=False,
        )
    return buffer.getvalue()


def _context(data: bytes) -> AttributionContext:
    model = load_model(data, "onnx", "cpu")
    return AttributionContext(model, parse_players("grid:2x2", (3, 8, 8)), Target(), {})


@pytest.mark.parametrize("opset", [7, 8])
def test_the_old_operators_are_upgraded_for_the_methods_graph(opset: int) -> None:
    model = onnx.load_from_string(_exported(opset))
    ops = {node.op_type for node in model.graph.node}
    assert {"BatchNormalization", "Upsample", "Gemm", "Flatten", "MaxPool"} <= ops
    assert unconvertible_nodes(model), "the case needs operators onnx2torch lacks at this opset"
    upgraded = onnx.ModelProto()
    upgraded.CopyFrom(model)
    assert _upgrade_opset(upgraded) == opset
    assert not unconvertible_nodes(upgraded)
    assert "Resize" in {node.op_type for node in upgraded.graph.node}
    graph = onnx_to_torch(model)
    want = _Classic().eval()(X).detach().numpy()
    np.testing.assert_allclose(graph(X).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_model_the_upgrade_cannot_help_is_kept_as_sent() -> None:
    """A plain CNN at opset 9 converts as it is; a Scan, which onnx2torch converts at no opset, is not converted by
    the upgrade either, so the model stays as sent and the refusal names the Scan."""
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    model = onnx.load_from_string(to_onnx(plain, X[:1], opset=9))
    sent = model.SerializeToString()
    assert _upgrade_opset(model) is None
    loop = onnx.helper.make_node("Scan", ["s", "input"], ["t", "u"], num_scan_inputs=1)
    model.graph.node.append(loop)
    assert _upgrade_opset(model) is None
    del model.graph.node[-1]
    assert model.SerializeToString() == sent


@pytest.mark.parametrize("weights_as_inputs", [False, True], ids=["ir7", "ir3"])
def test_the_weights_come_back_whole_after_the_upgrade(weights_as_inputs: bool) -> None:
    """The version converter is given the model without its large weights (as shapes); they are put
    back unchanged, also where the model lists them as graph inputs too (IR 3, as CNTK and Caffe2
    wrote them), and onnxruntime runs the upgraded model to the original's outputs."""
    model = onnx.load_from_string(_exported(7))
    if weights_as_inputs:
        model.ir_version = 3
        model.graph.input.extend(
            onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
            for t in model.graph.initializer
        )
    large = {t.name: t.SerializeToString() for t in model.graph.initializer if nbytes(t) > SHAPE_BYTES}
    assert large, "the case needs a weight the converter is not given"
    upgraded = onnx.ModelProto()
    upgraded.CopyFrom(model)
    assert _upgrade_opset(upgraded) == 7
    found = {t.name: t.SerializeToString() for t in upgraded.graph.initializer}
    assert all(found.get(name) == data for name, data in large.items())
    x = X.numpy()

    def run(proto: onnx.ModelProto) -> np.ndarray:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))])

    np.testing.assert_allclose(run(upgraded), run(model), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["gradient_x_input", "lrp_epsilon", "deeplift_rescale", "grad_cam"])
def test_an_opset_7_model_gets_the_attributions_of_its_opset_17_export(method: str) -> None:
    old, new = _context(_exported(7)), _context(to_onnx(_Classic().eval(), X[:1]))
    x = X.numpy()
    classes = new.model.predict(x).argmax(1)
    got = get_method(method).attribute(old, x, np.zeros_like(x), classes)
    assert "upgraded from opset 7 to 13" in str(get_method(method).described_implementation(old.model))
    assert "upgraded" not in str(get_method(method).described_implementation(new.model))
    want = get_method(method).attribute(new, x, np.zeros_like(x), classes)
    assert np.abs(want).max() > 1e-5
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


class _NormedLast(nn.Module):
    """A CNN whose last convolution is followed by a batch norm with a shift: the exporters fold it
    into the convolution from opset 9, and leave it after the convolution at opset 7 and 8."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(33)
        self.conv1, self.conv2, self.bn = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 5, 3), nn.BatchNorm2d(5)
        self.fc = nn.Linear(5, 3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.bias.uniform_(-1.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv2(torch.relu(self.conv1(x)))))
        return self.fc(h.mean((2, 3)))


def test_grad_cam_weighs_the_same_map_whether_the_norm_was_folded_or_not() -> None:
    """Grad-CAM's map is the last convolution's output with the batch norm that follows it, so that
    an export that keeps the norm (opset 7) and one that folds it (opset 17) give the same maps.
    Without that, the norm's shift moved every map."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _NormedLast().eval(), (X[:1],), buffer, dynamo=False, opset_version=7, input_names=["input"]
        )
    unfolded = onnx.load_from_string(buffer.getvalue())
    assert "BatchNormalization" in {node.op_type for node in unfolded.graph.node}
    old, new = _context(buffer.getvalue()), _context(to_onnx(_NormedLast().eval(), X[:1]))
    x = X.numpy()
    classes = new.model.predict(x).argmax(1)
    got = get_method("grad_cam").attribute(old, x, np.zeros_like(x), classes)
    want = get_method("grad_cam").attribute(new, x, np.zeros_like(x), classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def _ceil_pooled() -> nn.Sequential:
    """A pool that rounds up (torch's ceil_mode, Caffe's pools): written before opset 10 as a pool
    padded at its far ends."""
    torch.manual_seed(34)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(6, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 2 * 2, 3),
    ).eval()  # fmt: skip


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("method", ["lrp_epsilon", "deeplift_rescale", "deeplift_revealcancel"])
def test_a_far_end_padded_pool_is_a_ceil_mode_pool_for_the_rule_methods(method: str, opset: int) -> None:
    """onnx2torch pads such a pool with -inf, which the rule methods refused; as the ceil-mode pool
    it is, they give the attributions of the opset-17 export. At opset 9 every other operator
    converts, and the model is upgraded for the pool alone (MaxPool has ceil_mode from opset 10)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _ceil_pooled(), (X[:1],), buffer, dynamo=False, opset_version=opset, input_names=["input"]
        )
    pools = [n for n in onnx.load_from_string(buffer.getvalue()).graph.node if n.op_type == "MaxPool"]
    assert [list(a.ints) for n in pools for a in n.attribute if a.name == "pads"] == [[0, 0, 2, 2]]
    old, new = _context(buffer.getvalue()), _context(to_onnx(_ceil_pooled(), X[:1]))
    x = X.numpy()
    classes = new.model.predict(x).argmax(1)
    got = get_method(method).attribute(old, x, np.zeros_like(x), classes)
    want = get_method(method).attribute(new, x, np.zeros_like(x), classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(("end", "rewritten"), [(1, 1), (3, 0)])
def test_only_a_pool_with_a_ceil_mode_pools_windows_is_rewritten(end: int, rewritten: int) -> None:
    """On 8 positions a 3-wide pool with stride 2 has 4 windows in ceil mode: padded by 1 at the far
    end it has the same 4; padded by 3 it has a fifth, which no ceil-mode pool has."""
    node = onnx.helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, end, end]
    )
    graph = onnx.helper.make_graph(
        [node],
        "pool",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    assert ceil_mode_pools(model) == rewritten
    assert any(a.name == "pads" for a in model.graph.node[0].attribute) == (rewritten == 0)


def _image_scaler_model() -> tuple[bytes, nn.Module]:
    """An opset-8, IR-3 model as CNTK and Caffe2 wrote them (every initializer also a graph input)
    that normalises its input with ``ImageScaler``, and its torch twin."""
    from onnx import TensorProto, helper, numpy_helper

    torch.manual_seed(35)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    scale, bias = 0.5, [0.1, -0.2, 0.3]
    weights = {"W": conv.weight.detach().numpy(), "B": conv.bias.detach().numpy()}
    nodes = [
        helper.make_node("ImageScaler", ["x"], ["s"], scale=scale, bias=bias),
        helper.make_node("Conv", ["s", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape))
        for name, value in weights.items()
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 3

    class Twin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = conv
            self.register_buffer("bias", torch.tensor(bias).reshape(1, 3, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x * scale + self.bias)).mean((2, 3))

    return model.SerializeToString(), Twin().eval()


@pytest.mark.parametrize("method", ["gradient_x_input", "lrp_epsilon", "deeplift_rescale"])
def test_an_image_scaler_is_the_scale_and_shift_it_computes(method: str) -> None:
    """onnx no longer defines ImageScaler, so neither the torch conversion nor the opset upgrade
    knew it; written as a Mul and an Add, the model gets its twin's attributions."""
    data, twin = _image_scaler_model()
    old, new = _context(data), _context(to_onnx(twin, X[:1]))
    x = X.numpy()
    np.testing.assert_allclose(old.model.predict(x), twin(X).detach().numpy(), rtol=1e-5, atol=1e-6)
    classes = new.model.predict(x).argmax(1)
    got = get_method(method).attribute(old, x, np.zeros_like(x), classes)
    want = get_method(method).attribute(new, x, np.zeros_like(x), classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
