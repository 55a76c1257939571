"""ONNX models with several named inputs, a chosen output, or integer (token id) inputs.

One input is *explained*: its elements are the players' units and every method sees only it, as
float32 rows. The other inputs (state tensors, masks, metadata) are held at their given values.
Each one's batch axis is read from the graph (:func:`batch_axis`: the dim named like the explained
input's batch dim, e.g. axis 1 of an RNN state); values that differ per sample along it bind rows
of one call to one sample (:meth:`NamedOnnxModel.for_sample`), inputs without one (a scalar sample
rate) are fed as given. Integer inputs travel through the core as float32 (ids below
2^24 are exact) and are cast back when fed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import onnx
import onnxruntime as ort
import torch

from workers.metrics import count_forward
from workers.models.base import DEFAULT_BATCH_SIZE, ModelAdapter, ModelInfo, filled_to
from workers.models.batch_coupling import rows_coupled_by
from workers.models.onnx_model import _session
from workers.models.onnx_outputs import explained_output, maps_as_tensors
from workers.models.onnx_to_torch import method_graph
from workers.models.rebatch import batch_pinned_by_outputs
from xaudit.contract.errors import InvalidInput, InvalidModel, NotApplicable
from xaudit.contract.onnx_checks import parse_onnx

__all__ = ["InputSpec", "NamedOnnxModel", "OnnxGraph", "SampleBound", "batch_axis", "held_row"]

logger = logging.getLogger(__name__)

_ORT_DTYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(bool)": np.dtype(np.bool_),
}


Dim = int | str | None  # a declared dimension: fixed size, symbolic name, or unknown


@dataclass(frozen=True)
class InputSpec:
    """A model input as the model declares it; None for a dynamic or unknown dimension."""

    name: str
    dtype: np.dtype
    sample_shape: tuple[int | None, ...] | None
    fixed_batch: int | None
    dims: tuple[Dim, ...] | None = None  # every declared dimension, symbolic names kept

    @property
    def integer(self) -> bool:
        return self.dtype.kind in "iub"

    @property
    def declared(self) -> str:
        """The declared shape as written in messages, e.g. ``(batch, 3, 224, 224)`` or ``()``."""
        if self.dims is None:
            return "(unknown shape)"
        parts = ["?" if d is None else str(d) for d in self.dims]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def batch_axis(spec: InputSpec, explained: InputSpec) -> int | None:
    """The axis of ``spec`` that runs over samples, read from the graph: the axis whose symbolic
    dim is the explained input's batch dim (RNN state ``(layers, batch, hidden)`` gives 1), else
    none (a scalar, a batch-less table): such inputs are held as given for every sample. Without
    dim names (unnamed dynamic batch), a leading unknown dim is taken as the batch axis. A graph
    exported from a one-row example without dynamic axes declares every input's batch 1 (BERT's
    ``(1, 8)`` ids and attention mask): where the explained input's batch is a fixed 1, a leading 1
    is taken as the batch axis, so a mask may be given per sample (or one for all, sized 1)."""
    if spec.name == explained.name:
        return 0
    if not spec.dims or not explained.dims:
        return None
    lead = explained.dims[0]
    if lead == 1 and spec.dims[0] == 1:
        return 0
    if isinstance(lead, str) and lead:
        return spec.dims.index(lead) if lead in spec.dims else None
    if lead is None and not isinstance(spec.dims[0], int):
        return 0
    return None


class OnnxGraph:
    """One parsed ONNX model, its ORT session and (lazily) its torch graph, shared by every binding."""

    def __init__(self, data: bytes, sha256: str, device: torch.device, proto: onnx.ModelProto | None = None):
        self.proto = proto if proto is not None else parse_onnx(data)
        # A classifier's probabilities behind a ZipMap, read as a tensor (workers/models/onnx_outputs.py).
        self.unzipped = maps_as_tensors(self.proto)
        if self.unzipped:
            data = self.proto.SerializeToString()
        self.sha256 = sha256
        self.device = device
        self.session: ort.InferenceSession = _session(data, device)
        self.inputs: tuple[InputSpec, ...] = tuple(_spec(i) for i in self.session.get_inputs())
        if batch_pinned_by_outputs(self.proto):  # a symbolic input batch the graph does not honour
            self.inputs = (replace(self.inputs[0], fixed_batch=1),)
        # An operator that couples a batch's rows: one row per call (workers/models/batch_coupling.py).
        self.rows_coupled_by = rows_coupled_by(self.proto)
        if self.rows_coupled_by is not None:
            self.inputs = tuple(replace(spec, fixed_batch=1) for spec in self.inputs)
        self.outputs: tuple[str, ...] = tuple(o.name for o in self.session.get_outputs())
        # Set where this graph widens a model declared with a batch of 1 (workers/inputs.py): how many
        # of its nodes were rewritten for it (workers/models/pinned_shapes.py), for the report.
        self.rebatched: int | None = None
        self._torch: dict[str, torch.nn.Module | InvalidModel] = {}

    def input(self, name: str) -> InputSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise InvalidInput(f"the model has no input '{name}' (inputs: {', '.join(self.input_names)})")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def torch_graph(self, output: str) -> torch.nn.Module:
        """The methods' graph of ``output`` alone (one tensor out: workers.models.onnx_outputs)."""
        if output not in self._torch:  # converted once: every gradient method gets the same answer
            try:
                self._torch[output] = method_graph(self.proto, self.device, output)
            except InvalidModel as exc:
                self._torch[output] = exc
        graph = self._torch[output]
        if isinstance(graph, InvalidModel):
            raise graph
        return graph


def _spec(arg: ort.NodeArg) -> InputSpec:
    dtype = _ORT_DTYPES.get(arg.type)
    if dtype is None:
        # skl2onnx's export of a pandas DataFrame: one input per column, categories as strings.
        advice = (
            "; a scikit-learn pipeline exported from a DataFrame has one input per column: xaudit "
            "explains the units of one input, so export it from one numeric array holding every feature "
            "(categories encoded as numbers)"
            if arg.type == "tensor(string)"
            else ""
        )
        raise InvalidModel(f"model input '{arg.name}' has type {arg.type}, which is not supported{advice}")
    shape = arg.shape
    sample = tuple(d if isinstance(d, int) else None for d in shape[1:]) if shape else None
    fixed = shape[0] if shape and isinstance(shape[0], int) else None
    dims = (
        tuple(d if isinstance(d, (int, str)) and d != "" else None for d in shape)
        if shape is not None
        else None
    )
    return InputSpec(arg.name, dtype, sample, fixed, dims)


def held_row(value: np.ndarray, axis: int | None, sample: int) -> np.ndarray:
    """Sample ``sample``'s slice of a held input (its batch axis kept, size 1); as given without one."""
    if axis is None:
        return value
    index = sample if value.shape[axis] > 1 else 0
    return np.take(value, [index], axis=axis)


def _repeat(row: np.ndarray, axis: int | None, k: int) -> np.ndarray:
    if axis is None:
        return row
    shape = list(row.shape)
    shape[axis] = k
    return np.ascontiguousarray(np.broadcast_to(row, shape))


class SampleBound(Protocol):
    """Something that holds per-sample values and binds to one sample (an embedding view)."""

    @property
    def width(self) -> int:
        """Floats the embedding gives each token: what a row's activations scale with."""
        ...

    def for_sample(self, index: int) -> SampleBound: ...


def _held_value(value: torch.Tensor, rows: int, axis: int | None) -> torch.Tensor:
    """A held input expanded to ``rows`` on its batch axis (as given without one). Floats require
    gradients while they are on: Captum's DeepLift hooks every nonlinearity's input and needs it,
    also on branches fed only by held inputs; those gradients are unused."""
    if axis is not None:
        shape = list(value.shape)
        shape[axis] = rows
        value = value.expand(*shape)
    if value.is_floating_point() and torch.is_grad_enabled():
        value = value.clone().requires_grad_(True)
    return value


class _Feed(torch.nn.Module):
    """The graph as a function of the explained input alone, the other inputs bound to one sample;
    a graph with a fixed batch size is called once per chunk of that size."""

    def __init__(
        self,
        graph: torch.nn.Module,
        order: Sequence[str],
        explained: str,
        fixed: Mapping[str, torch.Tensor],
        axes: Mapping[str, int | None],
        fixed_batch: int | None = None,
    ) -> None:
        super().__init__()
        self.graph = graph  # of one output (OnnxGraph.torch_graph)
        self.order = tuple(order)
        self.explained = explained
        self.fixed = dict(fixed)
        self.axes = dict(axes)
        self.fixed_batch = fixed_batch

    @property
    def shared_graph(self) -> torch.nn.Module:
        """The graph every sample's binding shares (a new _Feed binds each sample): what saves the
        same bytes per row for all of them (workers.methods._passes)."""
        return self.graph

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[0]
        args = [x if n == self.explained else _held_value(self.fixed[n], k, self.axes[n]) for n in self.order]
        out: torch.Tensor = self.graph(*args)
        return out.reshape(k, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step = self.fixed_batch
        if step is None or x.shape[0] == step:
            return self._call(x)
        outs = []
        for chunk in torch.split(x, step):
            outs.append(self._call(filled_to(step, chunk))[: len(chunk)])
        return torch.cat(outs)


def _bound_graph(
    graph: torch.fx.GraphModule,
    order: Sequence[str],
    explained: str,
    fixed: Mapping[str, torch.Tensor],
    axes: Mapping[str, int | None],
) -> torch.fx.GraphModule:
    """``graph`` with its held inputs replaced by constants of one sample: one placeholder left, so
    rule-based methods can plan it node by node (and name the operator they have no rule for)."""
    new = torch.fx.Graph()
    x = new.placeholder("x")
    rows = new.call_method("size", (x, 0))
    attrs: dict[str, object] = {}
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for index, (node, name) in enumerate(zip(placeholders, order, strict=True)):
        if name == explained:
            values[node] = x
            continue
        attrs[f"xaudit_held_{index}"] = fixed[name]
        held = new.get_attr(f"xaudit_held_{index}")
        values[node] = new.call_function(_held_value, (held, rows, axes[name]))
    for node in graph.graph.nodes:
        if node.op == "call_module":
            attrs[str(node.target)] = graph.get_submodule(str(node.target))
        elif node.op == "get_attr":
            value: object = graph
            for part in str(node.target).split("."):
                value = getattr(value, part)
            attrs[str(node.target)] = value
    new.output(new.graph_copy(graph.graph, values))  # one output: OnnxGraph.torch_graph
    return torch.fx.GraphModule(attrs, new)


class NamedOnnxModel(ModelAdapter):
    """``explained`` fed from the rows, every other input held: sample ``s``'s slice on its batch
    axis (found from the graph, :func:`batch_axis`), or as given when it has none.

    ``fixed`` holds the arrays as the model wants them (the batch axis sized B or 1), in the
    model's dtypes; unbound (``sample`` None) a model with per-sample inputs refuses to run, so a
    caller that mixes samples fails loudly instead of silently using the wrong state. A model with
    a fixed batch size (often 1) is evaluated one chunk of that size per call.
    """

    def __init__(
        self,
        graph: OnnxGraph,
        explained: str,
        fixed: Mapping[str, np.ndarray],
        output: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        sample: int | None = None,
    ) -> None:
        self.graph = graph
        self.explained = graph.input(explained)
        self.fixed = dict(fixed)
        self.axes = {name: batch_axis(graph.input(name), self.explained) for name in self.fixed}
        self.output = explained_output(graph.proto, output)
        self.device = graph.device
        self.batch_size = batch_size
        self.sample = sample
        self.per_sample = sample is None and any(
            axis is not None and self.fixed[name].shape[axis] > 1 for name, axis in self.axes.items()
        )
        self.info = ModelInfo("onnx", graph.sha256, explained, self.explained.sample_shape, self.output)
        # Filled by workers.methods._embedding for token inputs: where gradients are taken instead.
        self.embedding: SampleBound | None = None
        # Why gradient methods cannot run on integer inputs, when no embedding was found.
        self.no_embedding = ""

    @property
    def execution_providers(self) -> list[str]:
        return list(self.graph.session.get_providers())

    @property
    def takes_ids(self) -> bool:
        return self.explained.integer

    def for_sample(self, index: int) -> NamedOnnxModel:
        if not self.per_sample:
            return self
        bound = NamedOnnxModel(
            self.graph, self.explained.name, self.fixed, self.output, self.batch_size, index
        )
        bound.embedding = self.embedding.for_sample(index) if self.embedding is not None else None
        bound.no_embedding = self.no_embedding
        return bound

    def _fixed_row(self, name: str) -> np.ndarray:
        if self.per_sample:
            raise RuntimeError("a model with per-sample held inputs must be bound to a sample (for_sample)")
        return held_row(self.fixed[name], self.axes[name], self.sample or 0)

    def rows_per_call(self, sample_elements: int) -> int:
        """As :meth:`ModelAdapter.rows_per_call`, counting a token's embedding for each id: a token
        model's activations grow with its width, not with the ids."""
        width = self.embedding.width if self.embedding is not None else 1
        return super().rows_per_call(sample_elements * width)

    def predict(self, x: np.ndarray) -> np.ndarray:
        step = self.explained.fixed_batch or self.rows_per_call(math.prod(x.shape[1:]))
        outs = []
        rows_held = {name: self._fixed_row(name) for name in self.fixed}
        for start in range(0, x.shape[0], step):
            chunk = x[start : start + step]
            rows = chunk.shape[0]
            if self.explained.fixed_batch and rows < step:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], step - rows, axis=0)])
            feed = {self.explained.name: np.ascontiguousarray(chunk).astype(self.explained.dtype)}
            for name, row in rows_held.items():
                feed[name] = _repeat(row, self.axes[name], len(chunk))
            out = self.graph.session.run([self.output], feed)[0]
            outs.append(np.asarray(out).reshape(len(chunk), -1)[:rows])
        count_forward(x.shape[0], len(outs))
        return np.concatenate(outs).astype(np.float32)

    def _feed_module(self, method: str) -> _Feed:
        if self.explained.integer:
            reason = self.no_embedding or "which have no gradient"
            raise NotApplicable(method, f"input '{self.explained.name}' holds integer ids, {reason}")
        fixed = {
            name: torch.as_tensor(np.ascontiguousarray(self._fixed_row(name)), device=self.device)
            for name in self.fixed
        }
        return _Feed(
            self.graph.torch_graph(self.output), self.graph.input_names, self.explained.name, fixed,
            self.axes, self.explained.fixed_batch,
        )  # fmt: skip

    def torch_differentiable(self) -> torch.nn.Module:
        return self._feed_module("gradient methods")

    @property
    def hook_batch(self) -> int | None:
        return self.explained.fixed_batch

    def torch_hookable(self, method: str, row_by_row: bool = False) -> torch.nn.Module:
        plain = not self.fixed and len(self.graph.inputs) == 1
        if self.explained.fixed_batch is not None and not row_by_row:
            # Hooks see one chunk per graph call: a layer's activations for all rows never exist at once.
            raise NotApplicable(
                method,
                f"the model declares a fixed batch of {self.explained.fixed_batch} for input "
                f"'{self.explained.name}' and could not be re-batched, so it runs one chunk per call and "
                "this method has no single graph call over all rows (the LRP methods and Grad-CAM run "
                "it chunk by chunk); export it with a dynamic batch axis",
            )
        if plain:
            return self.graph.torch_graph(self.output)  # the plain fx graph: rule-based methods can plan it
        feed = self._feed_module(method)
        if not isinstance(feed.graph, torch.fx.GraphModule):
            return feed
        return _bound_graph(feed.graph, feed.order, feed.explained, feed.fixed, self.axes)
