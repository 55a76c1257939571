"""Named model inputs: one explained (its units are the players), the others held at their values.

Tensors travel as ``inputs`` (the explained input, as for one-input models) and ``input:NAME``
for every other named input, so everything that reads ``inputs`` (digests, signatures, renders)
keeps working. Names, shapes and dtypes are read from the model and checked here, with one-line
errors naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.contract.inputs import INPUT_PREFIX, check_names, held_inputs, input_key, onnx_input_names

if TYPE_CHECKING:  # the client library imports this module: no torch or onnxruntime at import
    from workers.models.base import ModelAdapter
    from workers.models.named import InputSpec, NamedOnnxModel, OnnxGraph

__all__ = [
    "INPUT_PREFIX",
    "add_batch_axis",
    "check_names",
    "held_inputs",
    "held_inputs_section",
    "input_key",
    "load_named",
    "needs_named_model",
    "onnx_input_names",
    "predict_samples",
    "rebatched_graph",
]

_MAX_ELEMENTS = 64 * 1024 * 1024


def needs_named_model(
    explain: str, target_output: str | None, tensors: Mapping[str, np.ndarray], data: bytes
) -> bool:
    """Whether a job needs :class:`NamedOnnxModel`: named inputs, a named output, or an ONNX model
    whose one input is not a float tensor, has a fixed batch (declared, or pinned by the outputs),
    or that has several inputs, several outputs or one without scores (workers.models.onnx_outputs),
    or whose operators couple a batch's rows (one row per call)."""
    if explain or target_output or held_inputs(tensors):
        return True
    import onnx

    from workers.models import detect_format

    if detect_format(data) != "onnx":
        return False
    try:
        proto = onnx.load_model_from_string(data)
    except Exception:
        return False  # the plain loader says what is wrong with it
    from workers.models.batch_coupling import rows_coupled_by
    from workers.models.onnx_outputs import needs_output_choice
    from workers.models.rebatch import batch_pinned_by_outputs

    initializers = {i.name for i in proto.graph.initializer}
    graph_inputs = [i for i in proto.graph.input if i.name not in initializers]
    if len(graph_inputs) != 1 or needs_output_choice(proto):
        return True
    tensor_type = graph_inputs[0].type.tensor_type
    dims = tensor_type.shape.dim
    fixed_batch = len(dims) > 0 and dims[0].HasField("dim_value") and dims[0].dim_value > 0
    pinned = fixed_batch or batch_pinned_by_outputs(proto) or rows_coupled_by(proto) is not None
    return bool(tensor_type.elem_type != onnx.TensorProto.FLOAT or pinned)


def add_batch_axis(array: np.ndarray, declared: tuple[int | None, ...] | None) -> np.ndarray:
    """``array`` with a batch axis added when it is exactly one sample of the declared shape."""
    if (
        declared is not None
        and array.ndim == len(declared)
        and all(d is None or d == g for d, g in zip(declared, array.shape, strict=True))
    ):
        return array[None]
    return array


def _with_batch(name: str, array: np.ndarray, spec: InputSpec) -> np.ndarray:
    declared = spec.sample_shape
    array = add_batch_axis(array, declared)
    if array.ndim < 1:
        raise InvalidInput(
            f"input '{name}' is a scalar, but the model declares it {spec.declared}: give (samples, ...)"
        )
    if declared is not None and (
        array.ndim - 1 != len(declared)
        or any(d is not None and d != g for d, g in zip(declared, array.shape[1:], strict=True))
    ):
        raise InvalidInput(
            f"input '{name}': the model declares {spec.declared}, given {tuple(array.shape)} (samples first)"
        )
    return array


def _as_declared(name: str, array: np.ndarray, spec: InputSpec, axis: int | None) -> np.ndarray:
    """A held input as the model wants it: its declared rank and fixed sizes; on its batch axis
    (if any) one value per sample or one for all. One sample given without that axis gets it."""
    dims = spec.dims
    if dims is None:
        return array
    if axis is not None and array.ndim == len(dims) - 1:
        array = np.expand_dims(array, axis)
    fits = array.ndim == len(dims) and all(
        not isinstance(d, int) or d == g or k == axis
        for k, (d, g) in enumerate(zip(dims, array.shape, strict=True))
    )
    if not fits:
        where = (
            f"its batch axis is {axis}" if axis is not None else "it has no batch axis: it is held as given"
        )
        raise InvalidInput(
            f"input '{name}': the model declares {spec.declared} ({where}), given {tuple(array.shape)}"
        )
    return array


def _checked(name: str, value: np.ndarray, spec: InputSpec) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiub":
        raise InvalidInput(f"input '{name}': dtype {arr.dtype} is not numeric")
    if arr.size > _MAX_ELEMENTS:
        raise ResourceExhausted(f"input '{name}': {arr.size} elements exceed the cap of {_MAX_ELEMENTS}")
    if arr.size == 0:
        raise InvalidInput(f"input '{name}' is empty")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise InvalidInput(f"input '{name}' contains NaN or Inf")
    if spec.integer and arr.dtype.kind == "f" and not (arr == np.round(arr)).all():
        raise InvalidInput(f"input '{name}' holds integers ({spec.dtype}) but was given fractional values")
    return arr


def _given(
    explain: str, graph: OnnxGraph, tensors: Mapping[str, np.ndarray]
) -> tuple[str, dict[str, np.ndarray]]:
    """(explained name, name -> array) from the job's tensors, names checked against the model."""
    names = graph.input_names
    held = held_inputs(tensors)
    if not explain:
        if len(names) == 1 and not held:
            return names[0], {names[0]: tensors["inputs"]}
        raise InvalidInput(
            f"the model has {len(names)} inputs ({', '.join(names)}): give each as --input NAME=FILE.npy "
            "and pick the one to explain with --explain NAME"
        )
    check_names(names, explain, tuple(held))
    return explain, {explain: tensors["inputs"], **held}


def rebatched_graph(
    graph: OnnxGraph, explained: str, row: np.ndarray, given: Mapping[str, np.ndarray]
) -> OnnxGraph:
    """``graph`` re-batched where it computes row by row (workers/models/rebatch.py), checked on the
    explained input's first row and the other inputs' first sample; else ``graph`` itself. The
    digest stays the user's model's."""
    from workers.models.named import OnnxGraph, batch_axis
    from workers.models.rebatch import rebatched

    spec = graph.input(explained)
    feed, batched = {explained: row.astype(spec.dtype)}, {explained}
    for name, value in given.items():
        if name == explained:
            continue
        held = graph.input(name)
        axis = batch_axis(held, spec)
        if axis not in (0, None):
            return graph  # a batch on another axis (an RNN's state): evaluated as declared
        array = _as_declared(name, _checked(name, value, held), held, axis).astype(held.dtype)
        if axis == 0:
            batched.add(name)
            array = array[:1]
        feed[name] = array
    widened = rebatched(graph.proto, explained, feed, batched, graph.session)
    if widened is None:
        return graph
    widened_graph = OnnxGraph(widened.data, graph.sha256, graph.device)
    widened_graph.rebatched = widened.rewritten_nodes
    widened_graph.unzipped = graph.unzipped  # written from the rewritten model, which reads them already
    return widened_graph


def load_named(
    explain: str,
    output: str | None,
    data: bytes,
    sha256: str,
    device: object,
    tensors: Mapping[str, np.ndarray],
) -> tuple[NamedOnnxModel, np.ndarray]:
    """The model bound to the held inputs, and the explained input (B, ...) float32."""
    import torch

    from workers.models import detect_format
    from workers.models.named import NamedOnnxModel, OnnxGraph, batch_axis

    if detect_format(data) != "onnx":
        raise InvalidInput("several named inputs, integer inputs and named outputs need an ONNX model")
    assert isinstance(device, torch.device)
    graph = OnnxGraph(data, sha256, device)
    explained, given = _given(explain, graph, tensors)
    spec = graph.input(explained)
    inputs = _with_batch(explained, _checked(explained, given[explained], spec), spec)
    if spec.fixed_batch == 1:
        graph = rebatched_graph(graph, explained, inputs[:1], given)
        spec = graph.input(explained)
    samples = len(inputs)
    fixed = {}
    for name, value in given.items():
        if name == explained:
            continue
        held = graph.input(name)
        axis = batch_axis(held, spec)
        array = _as_declared(name, _checked(name, value, held), held, axis)
        if axis is not None and array.shape[axis] not in (1, samples):
            raise InvalidInput(
                f"input '{name}' holds {array.shape[axis]} samples on its batch axis {axis} "
                f"(declared {held.declared}); '{explained}' holds {samples}"
            )
        fixed[name] = array.astype(held.dtype)
    model = NamedOnnxModel(graph, explained, fixed, output)
    return model, inputs.astype(np.float32)


def predict_samples(model: ModelAdapter, inputs: np.ndarray) -> np.ndarray:
    """Model outputs (B, C) for B samples, each with its own held inputs."""
    if not model.per_sample:
        return model.predict(inputs)
    return np.concatenate([model.for_sample(s).predict(inputs[s : s + 1]) for s in range(len(inputs))])


def held_inputs_section(model: ModelAdapter) -> dict[str, object]:
    """For the report: the explained input's name, and the name, shape and digest of every held
    input (they shape the game as much as the explained one does); empty for one-input models."""
    from workers.models.named import NamedOnnxModel
    from xaudit.contract.spec import tensor_digest

    if not isinstance(model, NamedOnnxModel):
        return {}
    section: dict[str, object] = {"explained": model.explained.name}
    section["held"] = [
        {
            "name": name,
            "shape": list(array.shape),
            "batch_axis": model.axes[name],
            "sha256": tensor_digest(array),
        }
        for name, array in sorted(model.fixed.items())
    ]
    if model.explained.fixed_batch is not None:
        # A fixed batch size costs one model call per chunk of that size: said in the report.
        section["fixed_batch"] = model.explained.fixed_batch
    if model.graph.rows_coupled_by is not None:  # and why it is one row per call
        section["rows_coupled_by"] = model.graph.rows_coupled_by
    if model.graph.rebatched is not None:  # evaluated as a graph with a symbolic batch, checked
        section["rebatched"] = {"declared_batch": 1, "rewritten_nodes": model.graph.rebatched}
    embedding = model.embedding
    if embedding is not None:
        section["embedding_tensor"] = getattr(embedding, "tensor", "")
    return section
