"""Inputs bound from the graph's declared shapes: the batch axis found by dim name, scalars held
as given, errors naming the input, its declared shape and what was given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.models.zoo.builders import ZooModel, speech_lstm
from workers.inputs import input_key
from workers.prepare import prepare
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> ZooModel:
    return speech_lstm(tmp_path_factory.mktemp("speech"))


def _prepare(zoo: ZooModel, audio: np.ndarray, state: np.ndarray, sr: np.ndarray):  # type: ignore[no-untyped-def]
    tensors = {"inputs": audio, input_key("state"): state, input_key("sr"): sr}
    spec = JobSpec(players="windows:4", explain="audio", device="cpu")
    return prepare(spec, zoo.model.read_bytes(), None, tensors)


def test_state_is_batched_on_axis_one_and_the_scalar_is_held(speech: ZooModel) -> None:
    rng = np.random.default_rng(0)
    audio = rng.standard_normal((3, 64)).astype(np.float32)
    state = rng.standard_normal((2, 3, 16)).astype(np.float32)
    sr = np.array(8000, np.int64)
    prep = _prepare(speech, audio, state, sr)
    assert prep.model.axes == {"state": 1, "sr": None}
    session = ort.InferenceSession(str(speech.model), providers=["CPUExecutionProvider"])
    alone = [
        session.run(["output"], {"audio": audio[i : i + 1], "state": state[:, i : i + 1], "sr": sr})[0]
        for i in range(3)
    ]
    np.testing.assert_allclose(prep.full_outputs, np.concatenate(alone), rtol=1e-5, atol=1e-6)
    # One state for every sample: given without the batch axis, or with it sized 1.
    one = _prepare(speech, audio, state[:, 0], sr)
    np.testing.assert_allclose(one.full_outputs[0], alone[0][0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("state", "sr", "message"),
    [
        (
            np.zeros((2, 3, 16)),
            np.array([16000]),
            r"input 'sr': the model declares \(\) \(it has no batch axis",
        ),
        (
            np.zeros((2, 2, 16)),
            np.array(16000),
            r"'state' holds 2 samples on its batch axis 1 \(declared \(2, batch, 16\)\)",
        ),
        (
            np.zeros((3, 3, 16)),
            np.array(16000),
            r"input 'state': the model declares \(2, batch, 16\) .*given \(3, 3, 16\)",
        ),
    ],
)
def test_errors_name_the_input_its_declared_shape_and_what_was_given(
    speech: ZooModel, state: np.ndarray, sr: np.ndarray, message: str, tmp_path: Path
) -> None:
    audio = np.zeros((3, 64), np.float32)
    with pytest.raises(InvalidInput, match=message):
        _prepare(speech, audio, state.astype(np.float32), sr.astype(np.int64))


def test_client_uploads_external_data_inlined(tmp_path: Path) -> None:
    import onnx
    import torch

    from clients.client import _self_contained
    from tests.models import relu_cnn, to_onnx

    path = tmp_path / "model.onnx"
    exported = onnx.load_model_from_string(to_onnx(relu_cnn(1), torch.zeros(1, 1, 8, 8)))
    first = onnx.numpy_helper.to_array(exported.graph.initializer[0])
    onnx.save(exported, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    model = onnx.load_model_from_string(_self_contained(path))
    assert all(len(t.external_data) == 0 and t.raw_data for t in model.graph.initializer)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(model.graph.initializer[0]), first)
