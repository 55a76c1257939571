"""Turn a job spec, model bytes and attached tensors into validated compute objects."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from workers.inputs import add_batch_axis, load_named, needs_named_model, predict_samples
from workers.models import ModelAdapter, load_model, resolve_device
from workers.players import Players, parse_players
from workers.references import check_background, make_baselines
from workers.targets import Target, parse_target
from workers.tokens import check_token_baselines, pin_skipped
from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.contract.spec import JobSpec

__all__ = ["MAX_INPUT_ELEMENTS", "Prepared", "check_tensor", "prepare"]

logger = logging.getLogger(__name__)

MAX_INPUT_ELEMENTS = 64 * 1024 * 1024


@dataclass(frozen=True)
class Prepared:
    spec: JobSpec
    model: ModelAdapter
    inputs: np.ndarray  # (B, *sample_shape) float32
    baselines: np.ndarray  # (B, *sample_shape)
    background: np.ndarray | None  # (M, *sample_shape)
    players: Players
    target: Target
    classes: np.ndarray  # (B,)
    full_outputs: np.ndarray  # (B, C) model outputs for the full inputs

    @property
    def target_values(self) -> np.ndarray:
        return self.target.values(self.full_outputs, self.classes)


def check_tensor(name: str, array: np.ndarray) -> np.ndarray:
    """Numeric, finite, bounded; returned as float32."""
    arr = np.asarray(array)
    if arr.dtype.kind not in "fiub":
        raise InvalidInput(f"{name}: dtype {arr.dtype} is not numeric")
    if arr.size > MAX_INPUT_ELEMENTS:
        raise ResourceExhausted(f"{name}: {arr.size} elements exceed the cap of {MAX_INPUT_ELEMENTS}")
    if arr.size == 0:
        raise InvalidInput(f"{name} is empty")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise InvalidInput(f"{name} contains NaN or Inf")
    return arr


def _load_plain(
    spec: JobSpec, model_bytes: bytes, model_format: str | None, tensors: Mapping[str, np.ndarray]
) -> tuple[ModelAdapter, np.ndarray]:
    model = load_model(model_bytes, model_format, spec.device)
    inputs = check_tensor("input", tensors["inputs"])
    inputs = add_batch_axis(inputs, model.info.sample_shape)
    if inputs.ndim < 2:
        raise InvalidInput(f"input shape {inputs.shape}: expected (samples, ...) with a batch axis first")
    model.check_sample(inputs)
    return model, inputs


def _load_named(
    spec: JobSpec, model_bytes: bytes, tensors: Mapping[str, np.ndarray], target: Target
) -> tuple[ModelAdapter, np.ndarray]:
    import hashlib

    from workers.methods._embedding import attach_embedding

    device = resolve_device(spec.device)
    sha256 = hashlib.sha256(model_bytes).hexdigest()
    model, inputs = load_named(spec.explain, target.output, model_bytes, sha256, device, tensors)
    if inputs.ndim < 2:
        raise InvalidInput(f"input shape {inputs.shape}: expected (samples, ...) with a batch axis first")
    if model.explained.integer:
        try:
            attach_embedding(model, spec.embedding_tensor, inputs)
        except InvalidInput as exc:
            if spec.embedding_tensor:  # named by the user: a wrong name is their error to fix
                raise
            # Perturbation methods still run on the tokens; gradient methods say why they cannot.
            model.no_embedding = f"and the graph gives no float tensor to take gradients at ({exc})"
    return model, inputs


def prepare(
    spec: JobSpec, model_bytes: bytes, model_format: str | None, tensors: Mapping[str, np.ndarray]
) -> Prepared:
    if "inputs" not in tensors:
        raise InvalidInput("no input tensor given")
    target = parse_target(spec.target)
    if needs_named_model(spec.explain, target.output, tensors, model_bytes):
        model, inputs = _load_named(spec, model_bytes, tensors, target)
    else:
        model, inputs = _load_plain(spec, model_bytes, model_format, tensors)
    sample_shape = tuple(inputs.shape[1:])
    players = parse_players(
        spec.players,
        sample_shape,
        player_mask=tensors.get("player_mask"),
        player_groups=tensors.get("player_groups"),
        group_names=spec.group_names,
    )
    baselines = make_baselines(spec.baseline, inputs, tensors.get("baseline"))
    background = tensors.get("background")
    if background is not None:
        background = check_background(background, sample_shape)
    if getattr(model, "embedding", None) is not None:
        check_token_baselines(spec.baseline, baselines)
    baselines, background = pin_skipped(spec.players, inputs, baselines, background)
    outputs = predict_samples(model, inputs)
    if not np.isfinite(outputs).all():
        raise InvalidInput("the model's output on the given input contains NaN or Inf")
    classes = target.resolve_classes(outputs)
    return Prepared(spec, model, inputs, baselines, background, players, target, classes, outputs)
