"""ONNX models as exporters write them: external data files, weights in Constant nodes or listed as
graph inputs, operators onnx2torch lacks, and methods judged one by one when a graph cannot be built."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from clients.cli.options import read_model
from workers.models import load_model
from workers.models.onnx_to_torch import onnx_to_torch, unconvertible_nodes
from workers.prepare import prepare
from xaudit.contract.errors import InvalidModel
from xaudit.contract.onnx_checks import parse_onnx
from xaudit.contract.spec import JobSpec

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)


def _model(
    nodes: list, inputs: list, output_shape: list | None, inits: list, opset: int = 17
) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes,
        "g",
        inputs,
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _conv_model(weights_as: str, pool: str = "GlobalMaxPool", opset: int = 11) -> onnx.ModelProto:
    """Conv -> HardSigmoid -> pool -> Flatten -> MatMul -> Softmax, PaddlePaddle style."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    fc = RNG.standard_normal((4, 5)).astype(np.float32)
    inits, nodes = [], []
    if weights_as == "constant":
        nodes.append(oh.make_node("Constant", [], ["conv1_weights"], value=nh.from_array(w, "w")))
        nodes.append(oh.make_node("Constant", [], ["fc_w"], value=nh.from_array(fc, "fc")))
    elif weights_as == "identity":  # the legacy exporter's alias of a shared weight (TorchScript input)
        inits += [nh.from_array(w, "shared"), nh.from_array(fc, "fc_w")]
        nodes.append(oh.make_node("Identity", ["shared"], ["conv1_weights"]))
    else:
        inits += [nh.from_array(w, "conv1_weights"), nh.from_array(fc, "fc_w")]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])]
    if weights_as == "graph_input":
        inputs += [
            oh.make_tensor_value_info("conv1_weights", TensorProto.FLOAT, [4, 3, 3, 3]),
            oh.make_tensor_value_info("fc_w", TensorProto.FLOAT, [4, 5]),
        ]
    nodes += [
        oh.make_node("Conv", ["x", "conv1_weights"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("HardSigmoid", ["c"], ["h"], name="hs", alpha=0.2, beta=0.5),
        oh.make_node(pool, ["h"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flat"),
        oh.make_node("MatMul", ["f", "fc_w"], ["z"], name="fc"),
        oh.make_node("Softmax", ["z"], ["y"], name="softmax", axis=1),
    ]
    return _model(nodes, inputs, [-1, 5], inits, opset)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("weights_as", ["initializer", "constant", "graph_input", "identity"])
def test_weights_that_are_not_plain_initializers_convert(weights_as: str) -> None:
    model = _conv_model(weights_as)
    graph = onnx_to_torch(parse_onnx(model.SerializeToString()))
    np.testing.assert_allclose(graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), atol=1e-5)


@pytest.mark.parametrize(
    "consts",
    [
        {"st": [1, -4], "en": [3, 100], "ax": [1, 3], "sp": [1, 1]},
        {"st": [1, -1], "en": [3, -7], "ax": [1, -1], "sp": [1, -2]},  # a negative step: a flip
        # The exporters' "to the end" and "to the start": int64's extremes (dynamo: BERT, ViT)
        {"st": [0, 2], "en": [2**63 - 1, 2**63 - 1], "ax": [0, 2], "sp": [1, 1]},
        {"st": [2**63 - 1, -2], "en": [-(2**63), -(2**63)], "ax": [1, 3], "sp": [-1, -1]},
        {"st": [-(2**63), 7], "en": [2, 9], "ax": [2, 3], "sp": [1, 1]},  # a start past the end: empty
    ],
)
def test_slices_match_onnxruntime_without_torchs_list_index_warning(consts: dict[str, list[int]]) -> None:
    """onnx2torch indexed with a list of slices, which torch deprecated: a later torch would read it as
    a tensor index and give another result (workers/models/onnx_converters.py indexes with a tuple)."""

    nodes = [
        oh.make_node("Constant", [], [k], value=nh.from_array(np.array(v, np.int64), k))
        for k, v in consts.items()
    ]
    nodes += [oh.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]), oh.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [])
    graph = onnx_to_torch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = graph(torch.from_numpy(X)).detach().numpy()
    np.testing.assert_array_equal(out, _ort(model, X))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceL2"])
def test_opset18_reductions_with_axes_as_input_match_onnxruntime(op: str) -> None:
    nodes = [
        oh.make_node("Constant", [], ["axes"], value=nh.from_array(np.array([2, 3], np.int64), "a")),
        oh.make_node(op, ["x", "axes"], ["r"], keepdims=0),
        oh.make_node("Relu", ["r"], ["y"]),
    ]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [], 18)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(
        graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-5, atol=1e-5
    )


def test_unconvertible_operator_is_named_with_its_node() -> None:
    model = _conv_model("initializer", pool="GlobalLpPool")
    assert unconvertible_nodes(model) == ["'GlobalLpPool' (node 'pool')"]
    with pytest.raises(
        InvalidModel, match=r"no torch conversion for operator 'GlobalLpPool' \(node 'pool'\)"
    ):
        onnx_to_torch(model)


def test_an_unnamed_node_beside_the_legacy_exporters_names_converts() -> None:
    """onnx2torch names an unnamed node by its type and counts repeats, so an unnamed Add (a rewrite
    adds such nodes) before the legacy exporter's ``/Add`` and ``/Add_1`` made two modules
    ``Add_1``, and the conversion failed ("unexpected input value type")."""
    graph = oh.make_graph(
        [
            oh.make_node("Add", ["x", "x"], ["a"]),
            oh.make_node("Add", ["a", "x"], ["b"], name="/Add"),
            oh.make_node("Add", ["b", "x"], ["y"], name="/Add_1"),
        ],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    x = np.arange(3, dtype=np.float32)[None]
    np.testing.assert_array_equal(onnx_to_torch(model)(torch.from_numpy(x)).numpy(), 4 * x)


def test_methods_are_judged_alone_when_the_graph_cannot_be_converted() -> None:
    """Gradient and rule methods are not_applicable naming the operator; perturbation methods still
    run on onnxruntime and are judged; the audit itself succeeds."""
    from workers.audit import run_audit

    model = _conv_model("constant", pool="GlobalLpPool").SerializeToString()
    spec = JobSpec(kind="audit", players="grid:2x2", methods=("gradient_x_input", "occlusion_1", "grad_cam",
                   "shapley_value", "lrp_epsilon"), device="cpu", target="class:0")  # fmt: skip
    result = run_audit(prepare(spec, model, None, {"inputs": X[:1]}))
    verdicts = {m["name"]: m for m in result.report["methods"]}
    for name in ("gradient_x_input", "grad_cam", "lrp_epsilon"):
        assert verdicts[name]["verdict"] == "not_applicable"
        assert "'GlobalLpPool' (node 'pool')" in verdicts[name]["reason"]
    for name in ("occlusion_1", "shapley_value"):
        assert verdicts[name]["verdict"] != "not_applicable"


def _contrib_model(domain: str, op: str = "FastGelu") -> onnx.ModelProto:
    """x (batch, 3*6*6) -> Flatten -> ``domain``.``op``(x, bias): a GELU of x + bias as
    onnxruntime's contrib operators write it (FastGelu: the tanh approximation)."""
    bias = nh.from_array(RNG.standard_normal(108).astype(np.float32), "bias")
    nodes = [
        oh.make_node("Flatten", ["x"], ["f"], name="flat"),
        oh.make_node(op, ["f", "bias"], ["y"], name="contrib_gelu", domain=domain),
    ]
    model = _model(
        nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])], ["n", 108], [bias]
    )
    model.opset_import.append(oh.make_opsetid(domain, 1))
    return model


def test_onnxruntimes_contrib_operators_run_and_other_domains_are_refused() -> None:
    """com.microsoft is onnxruntime's own (its transformer optimizer and quantizer write it): the game
    runs it; where the methods' torch graph has no conversion, the reason names the operator. Any other
    domain needs a custom-op library and is refused."""
    from workers.audit import run_audit

    contrib = _contrib_model("com.microsoft")
    data = contrib.SerializeToString()
    parse_onnx(data)
    f = X.reshape(len(X), -1) + nh.to_array(contrib.graph.initializer[0])
    gelu = torch.nn.functional.gelu(torch.from_numpy(f), approximate="tanh").numpy()
    np.testing.assert_allclose(load_model(data, "onnx", "cpu").predict(X), gelu, rtol=1e-4, atol=1e-5)
    spec = JobSpec(
        players="grid:2x2", methods=("shapley_value", "gradient_x_input"), device="cpu", target="class:0"
    )
    verdicts = {
        m["name"]: m for m in run_audit(prepare(spec, data, None, {"inputs": X[:1]})).report["methods"]
    }
    assert verdicts["shapley_value"]["verdict"] == "reliable"
    assert verdicts["gradient_x_input"]["verdict"] == "not_applicable"
    assert "'com.microsoft.FastGelu' (node 'contrib_gelu')" in verdicts["gradient_x_input"]["reason"]
    with pytest.raises(InvalidModel, match=r"custom operator domains \['com.evil'\]; they are refused"):
        parse_onnx(_contrib_model("com.evil").SerializeToString())


def _external(tmp_path: Path) -> Path:
    model = _conv_model("initializer", pool="GlobalAveragePool", opset=17)
    path = tmp_path / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    assert (tmp_path / "model.onnx.data").is_file()
    return path


def test_external_data_is_read_from_the_models_directory(tmp_path: Path) -> None:
    path = _external(tmp_path)
    with pytest.raises(InvalidModel, match=r"external data files \(model.onnx.data\).*xaudit CLI or client"):
        load_model(path.read_bytes(), "onnx", "cpu")
    data = read_model(path)
    expected = _ort(onnx.load(path), X)
    np.testing.assert_allclose(load_model(data, "onnx", "cpu").predict(X), expected, atol=1e-6)


def test_external_data_outside_the_directory_or_through_symlinks_is_refused(tmp_path: Path) -> None:
    path = _external(tmp_path)
    original = path.read_bytes()
    moved = tmp_path / "sub"
    moved.mkdir()
    (tmp_path / "model.onnx.data").rename(moved / "real.data")
    os.symlink(moved / "real.data", tmp_path / "model.onnx.data")
    with pytest.raises(InvalidModel, match="symlink"):
        read_model(path)
    (tmp_path / "model.onnx.data").unlink()
    with pytest.raises(InvalidModel, match=r"missing: keep it next to the \.onnx file"):
        read_model(path)
    for location in ("../model.onnx.data", "/etc/passwd", "sub/../../x"):
        path.write_bytes(_relocated(original, location))
        with pytest.raises(InvalidModel, match="only files inside the model's own directory"):
            read_model(path)


def _relocated(data: bytes, location: str) -> bytes:
    model = onnx.load_model_from_string(data)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    return model.SerializeToString()


def test_external_data_size_cap(tmp_path: Path) -> None:
    from xaudit.contract.errors import ResourceExhausted
    from xaudit.contract.onnx_external import inline_external_data

    path = _external(tmp_path)
    with pytest.raises(ResourceExhausted, match="external data exceeds"):
        inline_external_data(path, path.read_bytes(), max_bytes=64)


def _fixed_batch(flatten: str, batch: int | str = 1, rowwise_twin: bool = False) -> bytes:
    """(1, 3, 6, 6) -> Conv -> Relu -> flatten -> MatMul, the flatten row-wise (``Flatten``), a
    ``Reshape`` to (1, -1) as some exporters write it (at batch 1 the same model as one to (-1, 32):
    re-batched so, workers/models/pinned_shapes.py), ``Token``: the flattened row and a constant
    (1, 4) row concatenated, as a class token is at batch 1 (expanded to the rows, re-batched), or
    ``Fold``: the row's 32 values folded to (4, 8), a Reshape with no size of 1, turned to (8, 4) and
    multiplied by a (4, 5) weight: at two rows the fold can only put them inside the 4, which the
    weight contracts, so the batch stays pinned for good (``rowwise_twin``: folded to (-1, 4, 8) and
    turned within each row, the same model at batch 1, which does not pin it).
    ``batch="s77"``: the input's batch declared symbolic but the output's fixed at 1, as
    torch.onnx.export (dynamo) writes a graph whose batch torch.export specialised (``Dim.AUTO`` on
    torchvision's ViT)."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((36 if flatten == "Token" else 32, 3)).astype(np.float32)
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        oh.make_node("Relu", ["c"], ["r"], name="relu"),
        oh.make_node("Reshape", ["r", "shape"], ["f"], name="flat")
        if flatten == "Reshape"
        else oh.make_node("Flatten", ["r"], ["f"], name="flat"),
        oh.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
    ]
    inits = [
        nh.from_array(w, "w"),
        nh.from_array(fc, "fc"),
        nh.from_array(np.array([1, -1], np.int64), "shape"),
    ]
    if flatten == "Token":
        nodes[2:] = [
            oh.make_node("Flatten", ["r"], ["rows"], name="flat"),
            oh.make_node("Concat", ["token", "rows"], ["f"], name="with_token", axis=1),
            oh.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
        ]
        inits.append(nh.from_array(rng.standard_normal((1, 4)).astype(np.float32), "token"))
    if flatten == "Fold":
        folded, turn, unfolded = (
            ([-1, 4, 8], [0, 2, 1], [-1, 40]) if rowwise_twin else ([4, 8], [1, 0], [1, 40])
        )
        nodes[2:] = [
            oh.make_node("Flatten", ["r"], ["rows"], name="flat"),
            oh.make_node("Reshape", ["rows", "folded"], ["fold"], name="fold"),
            oh.make_node("Transpose", ["fold"], ["turned"], name="turn", perm=turn),
            oh.make_node("MatMul", ["turned", "mix"], ["mixed"], name="mix"),
            oh.make_node("Reshape", ["mixed", "unfolded"], ["f"], name="unfold"),
            oh.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
        ]
        inits[1] = nh.from_array(rng.standard_normal((40, 3)).astype(np.float32), "fc")
        inits += [nh.from_array(rng.standard_normal((4, 5)).astype(np.float32), "mix")]
        inits += [
            nh.from_array(np.array(v, np.int64), n) for v, n in ((folded, "folded"), (unfolded, "unfolded"))
        ]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])]
    return _model(nodes, inputs, [1, 3], inits).SerializeToString()


@pytest.mark.parametrize("batch", [1, "s77"])
@pytest.mark.parametrize("flatten", ["Flatten", "Reshape", "Token", "Fold"])
def test_fixed_batch_one_is_rebatched_when_the_graph_allows_it_else_looped(
    flatten: str, batch: int | str
) -> None:
    model = _fixed_batch(flatten, batch)
    prep = prepare(JobSpec(players="grid:2x2", device="cpu"), model, None, {"inputs": X})
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    alone = np.concatenate([session.run(None, {"x": X[i : i + 1]})[0] for i in range(len(X))])
    np.testing.assert_allclose(prep.full_outputs, alone, rtol=1e-5, atol=1e-6)
    # Re-batched: one call for both rows; looped: one call per row (the graph pins the batch).
    assert (prep.model.explained.fixed_batch is None) == (flatten != "Fold")
    graph = prep.model.torch_differentiable()
    np.testing.assert_allclose(graph(torch.from_numpy(X)).detach().numpy(), alone, rtol=1e-4, atol=1e-5)
    if flatten == "Fold":  # hooks would see one row per call: said, not attempted
        from xaudit.contract.errors import NotApplicable

        with pytest.raises(
            NotApplicable, match=r"fixed batch of 1 for input 'x' and could not be re-batched"
        ):
            prep.model.torch_hookable("deeplift_rescale")
        # ... except by the methods that call the graph one row at a time: the same numbers as on the
        # twin whose graph takes both rows in one call.
        from workers.methods import AttributionContext, get_method
        from workers.players import parse_players
        from workers.targets import Target

        twin_model = _fixed_batch("Fold", batch, rowwise_twin=True)
        twin = prepare(JobSpec(players="grid:2x2", device="cpu"), twin_model, None, {"inputs": X})
        assert prep.model.hook_batch == 1 and twin.model.hook_batch is None
        classes = alone.argmax(1)
        for name in ("lrp_epsilon", "lrp_alpha_beta", "grad_cam"):
            got, want = (
                get_method(name).attribute(
                    AttributionContext(p.model, parse_players("grid:2x2", X.shape[1:]), Target(), {}),
                    X, np.zeros_like(X), classes,
                )
                for p in (prep, twin)
            )  # fmt: skip
            assert np.abs(want).max() > 1e-4, name
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("flatten", ["Reshape", "Fold"])
def test_inspect_says_whether_a_fixed_batch_was_rebatched_and_how_to_export_one_that_was_not(
    flatten: str,
) -> None:
    from workers.inspect_model import inspect_model

    text = inspect_model(_fixed_batch(flatten)).text()
    if flatten == "Reshape":
        assert "re-batched, many rows per call" in text and "dynamic_shapes" not in text
        assert "(1, 3, 6, 6)" in text and "xaudit_batch" not in text  # shapes as exported, not as widened
    else:
        assert "fixed batch size 1: evaluated 1 row(s) per model call" in text
        assert 'an example of two rows and dynamic_shapes={0: torch.export.Dim("batch")}' in text


@pytest.mark.parametrize(
    ("op", "opset", "attrs"),
    [
        ("Gelu", 20, {}),
        ("Gelu", 20, {"approximate": "tanh"}),
        ("AveragePool", 19, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ("GlobalMaxPool", 21, {}),
        ("Equal", 19, {}),
    ],
)
def test_added_converters_match_onnxruntime(op: str, opset: int, attrs: dict) -> None:
    """Operators onnx2torch lacks at the opsets torch's exporters write (vit_b_16 and densenet121 at
    opset 20-21 use Gelu, Equal and AveragePool-19)."""
    if op == "Equal":  # Equal -> Cast float, on a float input compared with itself rounded
        nodes = [
            oh.make_node("Round", ["x"], ["r"]),
            oh.make_node("Equal", ["x", "r"], ["e"]),
            oh.make_node("Cast", ["e"], ["c"], to=TensorProto.FLOAT),
            oh.make_node("Add", ["x", "c"], ["y"]),
        ]
    else:
        nodes = [oh.make_node(op, ["x"], ["y"], **attrs)]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [], opset)
    x = np.round(X * 2) / 2  # some exact integers for Equal
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(
        graph(torch.from_numpy(x)).detach().numpy(), _ort(model, x), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("axis", "parts", "sections"),
    [(1, 3, None), (2, 4, None), (2, 3, None), (1, 2, [1, 2])],
    ids=["even", "uneven-last-smaller", "even-spatial", "sections-input"],
)
def test_opset18_split_matches_onnxruntime(axis: int, parts: int, sections: list[int] | None) -> None:
    """Split with ``num_outputs`` (opset 18), which torch's dynamo exporter writes for ``chunk``
    (shufflenet_v2's channel split): onnx2torch has no opset-18 converter."""
    names = [f"p{i}" for i in range(parts if sections is None else len(sections))]
    inits, split_inputs, attrs = [], ["x"], {"axis": axis}
    if sections is None:
        attrs["num_outputs"] = parts
    else:
        inits.append(nh.from_array(np.array(sections, np.int64), "sections"))
        split_inputs.append("sections")
    # Each part scaled differently, so parts swapped or cut elsewhere would show.
    nodes = [oh.make_node("Split", split_inputs, names, **attrs)]
    for i, name in enumerate(names):
        inits.append(nh.from_array(np.array(i + 1.0, np.float32), f"k{i}"))
        nodes.append(oh.make_node("Mul", [name, f"k{i}"], [f"s{i}"]))
    nodes.append(oh.make_node("Concat", [f"s{i}" for i in range(len(names))], ["y"], axis=axis))
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 18)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-6)


@pytest.mark.parametrize("width", [6, "w"], ids=["known", "symbolic"])
def test_layer_normalization_over_a_symbolic_size_matches_onnxruntime(width: int | str) -> None:
    """onnx2torch sized its LayerNorm from the graph's recorded shape, reading a symbolic size as 0
    (swin_t from the legacy exporter failed in every gradient method: "normalized_shape = [0]")."""
    rng = np.random.default_rng(3)
    inits = [
        nh.from_array(rng.standard_normal(6).astype(np.float32), "scale"),
        nh.from_array(rng.standard_normal(6).astype(np.float32), "bias"),
    ]
    nodes = [oh.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5)]
    shape = [-1, 3, 6, width]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, shape)], None, inits, 17)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(
        graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("opset", "mode", "pads", "axes"),
    [
        (20, "constant", [0, 0, 1, 2, 0, 0, 3, 0], None),  # torch's dynamo exporter (swin_t)
        (18, "constant", [1, 2, 0, 1], [2, -1]),
        (19, "reflect", [0, 0, 1, 1, 0, 0, 2, 1], None),
        (21, "edge", [2, 1, 0, 2], [-2, 3]),
    ],
    ids=["opset20", "axes", "reflect", "edge-axes-opset21"],
)
def test_pad_from_opset18_matches_onnxruntime(
    opset: int, mode: str, pads: list[int], axes: list[int] | None
) -> None:
    inits = [nh.from_array(np.array(pads, np.int64), "pads")]
    names = ["x", "pads"]
    if axes is not None:
        inits.append(nh.from_array(np.array(axes, np.int64), "axes"))
        names += ["", "axes"]
    nodes = [oh.make_node("Pad", names, ["y"], mode=mode)]
    model = _model(
        nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, opset
    )
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-6)


@pytest.mark.parametrize("opset", [11, 13, 16, 18])
@pytest.mark.parametrize(
    "index",
    [
        [[0, 1], [1, 2]],  # (row, channel): whole 6x6 maps replaced
        [[1], [0]],  # whole rows
        [[0, 2, 5, 1], [1, -1, 0, -2]],  # single elements, negative indices among them
        [[[0, 0]], [[1, 1]]],  # index tuples in a batch of their own
    ],
)
def test_scatter_nd_matches_onnxruntime_without_torchs_list_index_warning(
    opset: int, index: list[list[int]]
) -> None:
    """ScatterND (torch's dynamo exporter writes it for slice assignment). onnx2torch's indexed with a
    list of lists, which torch warns will change meaning: any warning fails here."""
    indices = np.array(index, np.int64)
    depth = indices.shape[-1]
    updates_shape = (*indices.shape[:-1], *X.shape[depth:])
    updates = nh.from_array(RNG.standard_normal(updates_shape).astype(np.float32), "updates")
    nodes = [oh.make_node("ScatterND", ["x", "indices", "updates"], ["y"])]
    x_info = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])
    model = _model(nodes, [x_info], None, [nh.from_array(indices, "indices"), updates], opset)
    graph = onnx_to_torch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = graph(torch.from_numpy(X)).detach().numpy()
    np.testing.assert_array_equal(got, _ort(model, X))


def test_scatter_nd_passes_gradients_to_the_data_it_keeps_and_to_the_updates() -> None:
    indices = nh.from_array(np.array([[0, 1], [1, 2]], np.int64), "indices")
    nodes = [oh.make_node("ScatterND", ["x", "indices", "u"], ["y"])]
    inputs = [
        oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6]),
        oh.make_tensor_value_info("u", TensorProto.FLOAT, [2, 6, 6]),
    ]
    graph = onnx_to_torch(_model(nodes, inputs, None, [indices], 18))
    x = torch.from_numpy(X).requires_grad_(True)
    u = torch.ones(2, 6, 6, requires_grad=True)
    graph(x, u).sum().backward()
    assert x.grad is not None and u.grad is not None
    expected = torch.ones_like(x)
    expected[0, 1] = expected[1, 2] = 0  # overwritten: no gradient to the data
    assert torch.equal(x.grad, expected) and torch.equal(u.grad, torch.ones_like(u))


def test_reshape_with_allowzero_and_a_shape_computed_at_run_time_matches_onnxruntime() -> None:
    """torch's dynamo exporter writes allowzero=1 on every Reshape; with a shape computed from the
    input (BERT's heads at a dynamic batch and sequence) onnx2torch refused it."""
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Slice", ["shape", "zero", "two", "zero"], ["lead"]),
        oh.make_node("Concat", ["lead", "minus_one"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["r"], allowzero=1),
        oh.make_node("Mul", ["r", "r"], ["y"]),
    ]
    inits = [
        nh.from_array(np.array([0], np.int64), "zero"),
        nh.from_array(np.array([2], np.int64), "two"),
        nh.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 19)
    graph = onnx_to_torch(model)
    out = graph(torch.from_numpy(X)).detach().numpy()
    assert out.shape == (2, 3, 36)
    np.testing.assert_allclose(out, _ort(model, X), rtol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 2])
def test_one_hot_matches_onnxruntime(axis: int) -> None:
    """onnx2torch has no OneHot, so a model with one (GC ViT's relative position bias) converted
    for no method at all. Indices from the input, some negative (counted from the end) and some out
    of range (all off values)."""
    nodes = [
        oh.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=0),
        oh.make_node("Add", ["a", "offsets"], ["i"]),
        oh.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis),
    ]
    inits = [
        nh.from_array(np.array([-3, -1, 0, 2, 4, 7], np.int64), "offsets"),
        nh.from_array(np.array(5, np.int64), "depth"),
        nh.from_array(np.array([-0.5, 2.0], np.float32), "values"),
    ]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 11)
    out = onnx_to_torch(model)(torch.from_numpy(X)).detach().numpy()
    want = _ort(model, X)
    assert out.shape == want.shape and (want == -0.5).all(axis=axis).any()  # out-of-range rows exist
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("axis", [1, 2, 4, -1, 0])
def test_flatten_at_any_axis_matches_onnxruntime(axis: int) -> None:
    """onnx2torch's Flatten failed at axis = rank (transformers' BERT from the legacy exporter)."""
    nodes = [oh.make_node("Flatten", ["x"], ["y"], axis=axis)]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [], 13)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X))


def test_comparisons_and_nan_checks_of_newer_opsets_match_onnxruntime() -> None:
    """GreaterOrEqual-16 and IsNaN-20 only admit more types; transformers' BERT builds its
    attention mask with them (every gradient method was not applicable)."""
    nodes = [
        oh.make_node("GreaterOrEqual", ["x", "half"], ["ge"]),
        oh.make_node("LessOrEqual", ["x", "half"], ["le"]),
        oh.make_node("Div", ["x", "x"], ["ratio"]),  # 0/0: NaN where x is 0
        oh.make_node("IsNaN", ["ratio"], ["nan"]),
        oh.make_node("IsInf", ["ratio"], ["inf"]),
        *[oh.make_node("Cast", [b], [b + "_f"], to=TensorProto.FLOAT) for b in ("ge", "le", "nan", "inf")],
        oh.make_node("Sum", ["ge_f", "le_f", "nan_f", "inf_f", "x"], ["y"]),
    ]
    inits = [nh.from_array(np.array(0.5, np.float32), "half")]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 20)
    x = np.where(np.abs(X) < 0.3, 0.0, X).astype(np.float32)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(graph(torch.from_numpy(x)).detach().numpy(), _ort(model, x))


class _Recurrent(torch.nn.Module):
    def __init__(self, kind: str, bidirectional: bool) -> None:
        super().__init__()
        rnn = torch.nn.LSTM if kind == "LSTM" else torch.nn.GRU
        self.rnn = rnn(5, 4, num_layers=2, bidirectional=bidirectional)
        self.kind = kind

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        state = (h0, torch.zeros_like(h0)) if self.kind == "LSTM" else h0
        out, _ = self.rnn(x, state)
        return out[-1]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_convert_and_match_onnxruntime(kind: str, bidirectional: bool) -> None:
    import io

    torch.manual_seed(0)
    module = _Recurrent(kind, bidirectional).eval()
    x, h0 = torch.randn(6, 3, 5), torch.randn(4 if bidirectional else 2, 3, 4)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x, h0), buffer, dynamo=False, opset_version=17, input_names=["x", "h0"])
    model = onnx.load_model_from_string(buffer.getvalue())
    assert kind in {n.op_type for n in model.graph.node} and not unconvertible_nodes(model)
    graph = onnx_to_torch(model)
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x.numpy(), "h0": h0.numpy()})[0]
    xg = x.clone().requires_grad_(True)
    out = graph(xg, h0)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    reference = x.clone().requires_grad_(True)
    module(reference, h0).sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "attrs", [{}, {"reverse": 1}, {"exclusive": 1}, {"exclusive": 1, "reverse": 1}, {"reverse": 0}]
)
@pytest.mark.parametrize("axis", [1, -1, 2])
def test_cumsum_with_onnx_defaults_matches_onnxruntime(attrs: dict, axis: int) -> None:
    """onnx2torch read a missing ``reverse`` as 1: the legacy exporter's RoBERTa, which leaves it out of
    its position ids' running count, converted to a graph with other logits than the model."""
    inits = [oh.make_tensor("axis", TensorProto.INT32, [], [axis])]
    nodes = [oh.make_node("CumSum", ["x", "axis"], ["y"], **attrs)]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 14)
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(
        graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu_matches_onnxruntime(upper: int, k: int | None) -> None:
    """onnx2torch has no Trilu, which every torch exporter before opset 23 writes for a causal
    ``scaled_dot_product_attention`` (nanoGPT's): no gradient or rule method ran on such a decoder."""
    inits = [] if k is None else [oh.make_tensor("k", TensorProto.INT64, [], [k])]
    nodes = [oh.make_node("Trilu", ["x", *(["k"] if k is not None else [])], ["y"], upper=upper)]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 14)
    np.testing.assert_allclose(onnx_to_torch(model)(torch.from_numpy(X)).detach().numpy(), _ort(model, X))


def test_unsqueeze_with_one_axis_as_a_number_matches_onnxruntime() -> None:
    """torch's dynamo exporter writes ``enable_gqa``'s repeated keys with a 0-d axes constant, on which
    onnx2torch's Unsqueeze failed ("'int' object is not iterable")."""
    inits = [oh.make_tensor("axes", TensorProto.INT64, [], [2])]
    nodes = [oh.make_node("Unsqueeze", ["x", "axes"], ["u"]), oh.make_node("Flatten", ["u"], ["y"], axis=2)]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 20)
    np.testing.assert_allclose(onnx_to_torch(model)(torch.from_numpy(X)).detach().numpy(), _ort(model, X))


@pytest.mark.parametrize(
    ("bounds", "module"), [(["lo", ""], "OnnxClip"), (["", "hi"], "OnnxClip"), (["zero", "six"], "ReLU6")]
)
def test_clip_with_an_empty_bound_matches_onnxruntime(bounds: list[str], module: str) -> None:
    """The legacy exporter writes F.normalize's clamp(min=eps) as Clip(x, eps, "") (torchvision's
    swin_v2_t); onnx2torch took "" for a bound computed at run time, and no gradient method ran."""
    consts = {"lo": -0.3, "hi": 0.4, "zero": 0.0, "six": 6.0}
    nodes = [
        oh.make_node("Constant", [], [name], value=nh.from_array(np.array(consts[name], np.float32), name))
        for name in bounds
        if name
    ]
    nodes.append(oh.make_node("Clip", ["x", *bounds], ["y"], name="clip"))
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [], 13)
    graph = onnx_to_torch(model)
    assert module in {type(m).__name__ for m in graph.modules()}
    np.testing.assert_allclose(graph(torch.from_numpy(X * 5)).detach().numpy(), _ort(model, X * 5))


def test_shapes_are_inferred_without_the_weights_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx2torch's shape inference serialised the whole model twice more (VGG11: 2 GB at the peak);
    the conversion's now sees the weights' types and dimensions only, and finds the same shapes."""
    from workers.models.onnx_shapes import SHAPE_BYTES, infer_shapes_light

    weight = RNG.standard_normal((108, 512)).astype(np.float32)  # 221 KB: a weight
    nodes = [
        oh.make_node("Flatten", ["x"], ["f"], axis=1),
        oh.make_node("MatMul", ["f", "w"], ["h"]),
        oh.make_node("Reshape", ["h", "shape"], ["r"]),  # reads a small initializer's values
        oh.make_node("ReduceMean", ["r"], ["y"], axes=[2], keepdims=0),
    ]
    inits = [nh.from_array(weight, "w"), nh.from_array(np.array([-1, 8, 64], np.int64), "shape")]
    model = _model(nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, inits, 17)
    whole = onnx.shape_inference.infer_shapes(model)
    light = infer_shapes_light(copy_of(model))
    assert {v.name: v.type for v in light.graph.value_info} == {
        v.name: v.type for v in whole.graph.value_info
    }
    assert light.graph.output[0].type == whole.graph.output[0].type
    assert len(light.graph.initializer) == 2  # the model keeps its weights

    seen: list[int] = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(
        onnx.shape_inference, "infer_shapes", lambda m, **k: seen.append(m.ByteSize()) or infer(m, **k)
    )
    graph = onnx_to_torch(model)
    assert seen and max(seen) < SHAPE_BYTES < weight.nbytes
    np.testing.assert_allclose(
        graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-5, atol=1e-5
    )


def copy_of(model: onnx.ModelProto) -> onnx.ModelProto:
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    return twin


@pytest.mark.parametrize("opset", [18, 19])
@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel", "antialias": 0},
    ],
    ids=["nearest", "bilinear", "bilinear-pytorch"],
)
def test_resize_from_opset18_matches_onnxruntime(opset: int, attrs: dict) -> None:
    """HRNet's and MobileViT's upsampling from both of torch's exporters at opset 18: onnx2torch stops
    at Resize 13, and every gradient method refused those models."""
    scales = nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [oh.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)]
    model = _model(
        nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [scales], opset
    )
    graph = onnx_to_torch(model)
    np.testing.assert_allclose(
        graph(torch.from_numpy(X)).detach().numpy(), _ort(model, X), rtol=1e-5, atol=1e-5
    )


def test_resize_with_what_torch_cannot_do_is_refused_by_name() -> None:
    scales = nh.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    nodes = [oh.make_node("Resize", ["x", "", "scales"], ["y"], name="shrink", mode="linear", antialias=1)]
    model = _model(
        nodes, [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 6, 6])], None, [scales], 18
    )
    with pytest.raises(InvalidModel, match=r"antialias.*'shrink'"):
        onnx_to_torch(model)


# Cast's saturate (19) and round_mode (24) only apply to float8 targets
_FLOAT8_ONLY = {("Cast", "saturate"), ("Cast", "round_mode")}


def _signature(
    op: str, version: int
) -> tuple[list[tuple[str, str, bool]], list[tuple[str, object]], list[tuple[str, object]]]:
    """The attributes (but those that only apply to float8), inputs and outputs of ``op``-``version``."""
    schema = onnx.defs.get_schema(op, version)
    attributes = sorted(
        (name, str(a.type), a.required)
        for name, a in schema.attributes.items()
        if (op, name) not in _FLOAT8_ONLY
    )
    return (
        attributes,
        [(i.name, i.option) for i in schema.inputs],
        [(o.name, o.option) for o in schema.outputs],
    )


def test_type_only_updates_change_nothing_but_types() -> None:
    """Each later version a converter is registered for as a type-only update has the attributes,
    inputs and outputs of the version it was written for."""
    from workers.models.onnx_to_torch import _NEWEST_OPSET, _TYPE_ONLY_UPDATES

    for op, old in _TYPE_ONLY_UPDATES.items():
        for opset in range(old, _NEWEST_OPSET + 1):
            since = onnx.defs.get_schema(op, opset).since_version
            assert _signature(op, since) == _signature(op, old), (op, since)


@pytest.mark.parametrize("opset", [22, 23])
def test_a_cnn_exported_at_the_newest_opsets_gets_the_attributions_of_its_opset_20_export(opset: int) -> None:
    """torch.onnx.export(..., opset_version=22 or 23) writes Conv-22, MaxPool-22, Reshape-23 ...: the
    same operators with more types, which the torch conversion refused."""
    from tests.models import to_onnx
    from workers.methods import AttributionContext, get_method
    from workers.players import parse_players
    from workers.targets import Target

    torch.manual_seed(61)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 4, 3), torch.nn.Hardswish(), torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2, 3),
    ).eval()  # fmt: skip
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(62))
    newest = onnx.load_from_string(to_onnx(model, x[:2], opset=opset, dynamo=True))
    assert newest.opset_import[0].version == opset
    assert {n.op_type for n in newest.graph.node} >= {"Conv", "MaxPool"}
    contexts = [
        AttributionContext(
            load_model(data, "onnx", "cpu"), parse_players("grid:2x2", (3, 8, 8)), Target(), {}
        )
        for data in (newest.SerializeToString(), to_onnx(model, x[:2], opset=20, dynamo=True))
    ]
    classes = np.array([0, 1, 2])
    for name in ("gradient_x_input", "lrp_epsilon", "deeplift_rescale"):
        got, want = (
            get_method(name).attribute(c, x.numpy(), np.zeros_like(x.numpy()), classes) for c in contexts
        )
        assert np.abs(want).max() > 1e-4
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
