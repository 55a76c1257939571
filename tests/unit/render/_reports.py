"""Fresh audit results through the real pipeline, small enough for tests (a few seconds each).

Image: the shipped digits CNN on two inputs with 8 grid patches. Tabular: a 6-feature ReLU MLP,
with every feature a player or with three named groups. Text: the negation transformer on two
sentences, its tokens the players (training it takes the longest, ~15 s).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_METHODS", "TABULAR_METHODS", "Audited", "image_audit", "tabular_audit", "text_audit"]

ASSETS = Path(__file__).resolve().parents[3] / "workers" / "assets"
IMAGE_METHODS = ("occlusion_1", "integrated_gradients", "shapley_value", "grad_cam")
# grad_cam is not applicable to an MLP: the page must say so rather than show an empty heatmap.
TABULAR_METHODS = ("gradient_x_input", "integrated_gradients", "shapley_value", "grad_cam")
GROUPS = np.array([0, 0, 1, 1, 1, 2])
GROUP_NAMES = ("income", "history", "age")


@dataclass(frozen=True)
class Audited:
    report: dict  # type: ignore[type-arg]
    report_bytes: bytes
    attributions: dict[str, np.ndarray]
    inputs: np.ndarray
    player_labels: np.ndarray


@functools.cache
def image_audit() -> Audited:
    from workers.audit import run_audit
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    inputs = np.load(ASSETS / "digits_inputs.npy")[:2]
    spec = JobSpec(
        players="grid:2x4",
        device="cpu",
        methods=IMAGE_METHODS,
        method_params={"integrated_gradients": {"steps": 16}},
    )
    tensors = {"inputs": inputs, "background": np.load(ASSETS / "digits_background.npy")}
    prep = prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), None, tensors)
    result = run_audit(prep)
    return Audited(result.report, result.report_bytes, result.attributions, inputs, prep.players.labels)


@functools.cache
def tabular_audit(groups: bool = False) -> Audited:
    from tests.models import relu_mlp, to_onnx
    from workers.audit import run_audit
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(3, 6)).astype(np.float32)
    import torch

    model = to_onnx(relu_mlp(), torch.from_numpy(inputs))
    tensors: dict[str, np.ndarray] = {"inputs": inputs}
    if groups:
        spec = JobSpec(
            players="groups:groups.json", device="cpu", methods=TABULAR_METHODS, group_names=GROUP_NAMES
        )
        tensors["player_groups"] = GROUPS
    else:
        spec = JobSpec(players="features", device="cpu", methods=TABULAR_METHODS)
    prep = prepare(spec, model, None, tensors)
    result = run_audit(prep)
    return Audited(result.report, result.report_bytes, result.attributions, inputs, prep.players.labels)


@functools.cache
def text_audit() -> Audited:
    from tests.unit.multi_input.models import NEGATION_VOCAB, negation_classifier
    from workers.audit import run_audit
    from workers.inputs import input_key
    from workers.prepare import prepare
    from workers.tokens import token_names
    from xaudit.contract.spec import JobSpec

    data, _, _ = negation_classifier(epochs=40)
    index = {w: i for i, w in enumerate(NEGATION_VOCAB)}
    sentences = (("the", "movie", "was", "not", "good"), ("the", "movie", "was", "very", "awful"))
    ids = np.array([[index[w] for w in s] + [0] for s in sentences], dtype=np.int64)
    spec = JobSpec(
        players="tokens",
        explain="ids",
        baseline="token:0",
        device="cpu",
        methods=("occlusion_1", "integrated_gradients", "shapley_value", "gradient_x_input", "grad_cam"),
        group_names=token_names(ids, list(NEGATION_VOCAB)),
    )
    prep = prepare(spec, data, None, {"inputs": ids, input_key("mask"): (ids != 0).astype(np.int64)})
    result = run_audit(prep)
    return Audited(result.report, result.report_bytes, result.attributions, ids, prep.players.labels)
