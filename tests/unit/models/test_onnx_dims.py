"""Negative declared dimensions (``make_tensor_value_info(name, type, [-1, 12])``) are read as unknown
before onnx's shape inference, whose C++ assertion otherwise aborts the process on a Slice of such an
axis: the CLI died with SIGABRT, and the service's sandboxed model process took the whole job with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from workers.models.onnx_dims import negative_dims_unknown

ROOT = Path(__file__).resolve().parents[3]


def _in_a_child(code: str, model: onnx.ModelProto, folder: Path) -> str:
    """``code`` run in a fresh interpreter on ``model``, saved in ``folder`` (its path is argv[1]): a
    crash fails the test, not the test runner. Its standard output, stripped."""
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-1500:]}"
    return done.stdout.strip()


def _sliced_batch_model() -> onnx.ModelProto:
    """x (batch declared as dimension value -1, 12) -> Slice of the batch to its end -> Relu -> MatMul."""
    consts = {"st": [0], "en": [2**63 - 1], "ax": [0], "sp": [1]}
    nodes = [
        oh.make_node("Constant", [], [k], value=nh.from_array(np.array(v, np.int64), k))
        for k, v in consts.items()
    ]
    nodes += [
        oh.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
        oh.make_node("Relu", ["s"], ["r"]),
        oh.make_node("MatMul", ["r", "w"], ["y"]),
    ]
    weight = nh.from_array(np.random.default_rng(0).standard_normal((12, 3)).astype(np.float32), "w")
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 12])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
        initializer=[weight],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_sliced_axis_declared_minus_one_converts_in_a_process_that_survives(tmp_path: Path) -> None:
    # Without the fix the conversion aborts its process.
    child = (
        "import sys, numpy as np, onnx, onnxruntime as ort, torch\n"
        "from workers.models.onnx_to_torch import onnx_to_torch\n"
        "model = onnx.load(sys.argv[1])\n"
        "x = np.random.default_rng(1).standard_normal((4, 12)).astype(np.float32)\n"
        "got = onnx_to_torch(model)(torch.from_numpy(x)).detach().numpy()\n"
        "session = ort.InferenceSession(model.SerializeToString(), providers=['CPUExecutionProvider'])\n"
        "np.testing.assert_allclose(got, session.run(None, {'x': x})[0], rtol=1e-5, atol=1e-6)\n"
        "print('converted')\n"
    )
    assert _in_a_child(child, _sliced_batch_model(), tmp_path) == "converted"


def _token_model() -> onnx.ModelProto:
    """ids (batch declared -1, 6 tokens) -> Gather from an embedding table -> Slice of the batch to its
    end -> Flatten -> MatMul: a token model whose embedding the methods cut at."""
    rng = np.random.default_rng(2)
    consts = {"st": [0], "en": [2**63 - 1], "ax": [0], "sp": [1]}
    nodes = [
        oh.make_node("Constant", [], [k], value=nh.from_array(np.array(v, np.int64), k))
        for k, v in consts.items()
    ]
    nodes += [
        oh.make_node("Gather", ["table", "ids"], ["e"]),
        oh.make_node("Slice", ["e", "st", "en", "ax", "sp"], ["s"]),
        oh.make_node("Flatten", ["s"], ["f"]),
        oh.make_node("MatMul", ["f", "w"], ["y"]),
    ]
    inits = [
        nh.from_array(rng.standard_normal((10, 4)).astype(np.float32), "table"),
        nh.from_array(rng.standard_normal((24, 3)).astype(np.float32), "w"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("ids", TensorProto.INT64, [-1, 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_token_model_declared_minus_one_is_cut_at_its_embedding_in_a_process_that_survives(
    tmp_path: Path,
) -> None:
    child = (
        "import sys, numpy as np\n"
        "from workers.explain import explain\n"
        "from workers.prepare import prepare\n"
        "from xaudit.contract.spec import JobSpec\n"
        "spec = JobSpec(kind='attribution', players='tokens', baseline='token:0', device='cpu')\n"
        "ids = np.array([[1, 2, 3, 4, 5, 6]])\n"
        "prep = prepare(spec, open(sys.argv[1], 'rb').read(), None, {'inputs': ids})\n"
        "found = explain(prep, ('gradient_x_input',)).attributions['gradient_x_input']\n"
        "assert found.shape == (1, 6) and np.abs(found).sum() > 0, found\n"
        "print('attributed')\n"
    )
    assert _in_a_child(child, _token_model(), tmp_path) == "attributed"


def test_negative_dimensions_become_unknown_everywhere_and_the_rest_stay() -> None:
    model = _sliced_batch_model()
    body = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["z"])],
        "body",
        [],
        [oh.make_tensor_value_info("z", TensorProto.FLOAT, [-1, "n", 12])],
    )
    model.graph.node.append(oh.make_node("If", ["cond"], ["branch"], then_branch=body, else_branch=body))
    model.graph.value_info.append(
        oh.make_value_info(
            "seq", oh.make_sequence_type_proto(oh.make_tensor_type_proto(TensorProto.FLOAT, [-2, 5]))
        )
    )
    assert negative_dims_unknown(model) == 5  # input, output, both branches' outputs, the sequence
    dims = [
        [
            d.WhichOneof("value") and (d.dim_value if d.HasField("dim_value") else d.dim_param)
            for d in shape.dim
        ]
        for shape in (
            model.graph.input[0].type.tensor_type.shape,
            model.graph.output[0].type.tensor_type.shape,
            model.graph.node[-1].attribute[0].g.output[0].type.tensor_type.shape,
            model.graph.value_info[0].type.sequence_type.elem_type.tensor_type.shape,
        )
    ]
    assert dims == [[None, 12], [None, 3], [None, "n", 12], [None, 5]]
    assert negative_dims_unknown(model) == 0
