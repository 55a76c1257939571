"""Gradient and rule-based methods on token inputs: attribute at the embedding output.

Token ids have no gradient. The ONNX graph is cut at the embedding output E (the tensor a Gather
produces from the ids, else the first float tensor computed from them such as a one-hot, found in
the graph or named by the job): ``embed`` maps ids to E, ``head``
maps E (plus the held inputs) to the output. A method runs on ``head`` with E(x) as the input and
E(reference ids) as the reference, its players spread over the embedding axis, and its
attributions are summed over that axis back onto the token positions. Because E is positionwise,
E of a masked sub-input is E(x) at present tokens and E(reference) at absent ones: the game's
masking and the methods' reference mean the same "absent".

The head still receives the original ids where it reads them beyond the embedding (e.g. their
shape for positional encodings); a model that derives other values from the ids themselves would
see the unmasked ids there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx.shape_inference
import onnx.utils

from workers.methods._base import AttributionContext, Method
from workers.methods._conversion_check import check_graph_matches_model
from workers.models.base import ModelAdapter
from workers.models.named import NamedOnnxModel, OnnxGraph
from workers.models.onnx_to_torch import methods_copy
from workers.players import Players
from xaudit.contract.errors import InvalidInput, NotApplicable

__all__ = ["EmbeddingView", "attach_embedding", "attributed_elements", "find_embedding", "run_method"]

# Operators that pass ids through unchanged on their way to the embedding lookup.
_ID_PASSTHROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"}


# Operators whose output depends on the ids' shape only, never on their values.
_SHAPE_ONLY = {"Shape", "Size"}
_FLOATS = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


def find_embedding(proto: onnx.ModelProto, ids: str) -> str:
    """Where gradients on token ids are taken: the first Gather that looks up a constant float table
    with (a cast of) ``ids``; else the first float tensor computed from the ids' values (a one-hot
    by Equal+Cast or OneHot, as JAX and TF exporters write it; an int8 table's dequantized rows).
    ``proto`` is shape-inferred."""
    constants = {i.name for i in proto.graph.initializer}
    constants |= {n.output[0] for n in proto.graph.node if n.op_type == "Constant"}
    types = {v.name: v.type.tensor_type.elem_type for v in (*proto.graph.value_info, *proto.graph.output)}
    passed, derived = {ids}, {ids}
    first_float = ""
    for node in proto.graph.node:  # nodes are topologically sorted
        if (
            node.op_type == "Gather"
            and len(node.input) > 1
            and node.input[1] in passed
            and node.input[0] in constants
            # a quantized table (onnxruntime's quantize_dynamic) looks up integers: its float is later
            and types.get(node.output[0], onnx.TensorProto.FLOAT) in _FLOATS
        ):
            return str(node.output[0])
        if node.op_type in _ID_PASSTHROUGH and node.input and node.input[0] in passed:
            passed.update(node.output)
        if node.op_type not in _SHAPE_ONLY and any(i in derived for i in node.input):
            derived.update(node.output)
            floats = [o for o in node.output if types.get(o) in _FLOATS]
            if floats and not first_float:
                first_float = floats[0]
    if first_float:
        return first_float
    raise InvalidInput(
        f"no float tensor computed from the token input '{ids}' (an embedding lookup, a one-hot) was "
        "found in the model; name one with --embedding-tensor"
    )


def _inputs_needed(proto: onnx.ModelProto, output: str, stop: str) -> list[str]:
    """Graph inputs that ``output`` depends on, not looking past ``stop``."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    graph_inputs = [i.name for i in proto.graph.input]
    seen, stack, found = set(), [output], set()
    while stack:
        name = stack.pop()
        if name in seen or name == stop:
            continue
        seen.add(name)
        if name in graph_inputs:
            found.add(name)
        node = producer.get(name)
        if node is not None:
            stack.extend(i for i in node.input if i)
    return [n for n in graph_inputs if n in found]


def _extract(proto: onnx.ModelProto, inputs: list[str], output: str) -> bytes:
    extractor = onnx.utils.Extractor(proto)
    sub = extractor.extract_model(inputs, [output])
    return sub.SerializeToString()


def _batch_named_like_ids(
    proto: onnx.ModelProto, name: str, ids_dims: tuple[int | str | None, ...] | None
) -> None:
    """Name the embedding tensor's first axis as the ids' batch axis is named where shape inference
    left it unnamed (transformers' GPT-2 from the legacy exporter: ``unk__0``): a lookup's rows
    follow its ids, and the head finds the batch axis of the inputs it holds (the ids, the mask) by
    that name. Unnamed, they were held with one row while the embeddings came in many, and every
    gradient method failed ("index 8 is out of bounds for dimension 0 with size 8")."""
    batch = ids_dims[0] if ids_dims else None
    value = next((v for v in proto.graph.value_info if v.name == name), None)
    if not isinstance(batch, str) or value is None or not value.type.HasField("tensor_type"):
        return
    shape = value.type.tensor_type.shape
    if not shape.dim:
        return
    first = shape.dim[0]
    if not first.HasField("dim_value") and (not first.dim_param or first.dim_param.startswith("unk__")):
        first.dim_param = batch


@dataclass(frozen=True)
class EmbeddingView:
    """``embed``: ids -> E (rows of one sample); ``head``: E -> output; ``tensor``: E's name;
    ``width``: E's floats per id."""

    tensor: str
    embed: NamedOnnxModel
    head: NamedOnnxModel
    width: int

    def for_sample(self, index: int) -> EmbeddingView:
        return EmbeddingView(
            self.tensor, self.embed.for_sample(index), self.head.for_sample(index), self.width
        )

    def embeddings(self, ids: np.ndarray) -> np.ndarray:
        """E(ids) (k, positions, dim) float32 for float-carried ids (k, positions)."""
        flat = self.embed.predict(ids)
        return flat.reshape(len(ids), *ids.shape[1:], -1)


def attach_embedding(model: NamedOnnxModel, tensor: str, ids_values: np.ndarray) -> None:
    """Cut ``model``'s graph at the embedding output and attach the two halves to it."""
    proto = onnx.shape_inference.infer_shapes(methods_copy(model.graph.proto))  # a fused lookup written back
    ids = model.explained.name
    produced = {o for n in proto.graph.node for o in n.output}
    name = tensor or find_embedding(proto, ids)
    if name not in produced:
        raise InvalidInput(f"--embedding-tensor '{name}' is not a tensor the model computes")
    known = {v.name for v in proto.graph.value_info}
    if name not in known:  # shape inference could not type it: float of unknown shape
        proto.graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    _batch_named_like_ids(proto, name, model.explained.dims)
    embed_inputs = _inputs_needed(proto, name, stop="")
    head_inputs = _inputs_needed(proto, model.output, stop=name)
    if ids not in embed_inputs:
        raise InvalidInput(f"embedding tensor '{name}' does not depend on the token input '{ids}'")
    device = model.device
    try:
        embed_graph = OnnxGraph(_extract(proto, embed_inputs, name), model.graph.sha256, device)
        head_graph = OnnxGraph(
            _extract(proto, [name, *head_inputs], model.output), model.graph.sha256, device
        )
    except Exception as exc:
        raise InvalidInput(
            f"cannot cut the model at embedding tensor '{name}': {str(exc).splitlines()[0][:160]}"
        ) from None
    held = dict(model.fixed)
    held[ids] = ids_values.astype(model.explained.dtype)
    embed = NamedOnnxModel(embed_graph, ids, {n: held[n] for n in embed_inputs if n != ids})
    head = NamedOnnxModel(head_graph, name, {n: held[n] for n in head_inputs})
    first = embed.for_sample(0) if embed.per_sample else embed
    ids_row = ids_values[:1].astype(np.float32)
    width = int(first.predict(ids_row).size) // max(1, ids_row.size)  # one lookup: rarely declared
    model.embedding = EmbeddingView(name, embed, head, max(1, width))
    # The halves hold the ids of each sample: bind per sample even without other inputs.
    model.per_sample = model.sample is None and (model.per_sample or embed.per_sample or head.per_sample)


def graph_model(model: ModelAdapter) -> ModelAdapter:
    """The adapter whose torch graph gradient and hook methods run on: for token inputs, the head
    after the embedding lookup; otherwise ``model`` itself. Where held inputs differ per sample, the
    first sample's binding (the graph is the same for every sample; only the held values differ)."""
    bound = model.for_sample(0) if model.per_sample else model
    view = getattr(bound, "embedding", None)
    return view.head if isinstance(view, EmbeddingView) else bound


def attributed_elements(method: Method, model: ModelAdapter, inputs: np.ndarray) -> int:
    """Elements of one sample of ``inputs`` that ``method`` computes on: for a gradient method on
    token inputs, the embedding output's (one id stands for a whole embedding row, 256 or 768 floats
    that every pass carries); otherwise the input's. Budgets that count a row's elements read this."""
    elements = int(np.prod(inputs.shape[1:]))
    view = getattr(model, "embedding", None)
    if not isinstance(view, EmbeddingView) or not method.capabilities.gradients:
        return elements
    return elements * view.width


def _spread_players(players: Players, dim: int) -> Players:
    labels = np.repeat(players.labels[..., None], dim, axis=-1)
    return Players(labels, players.names, players.spec, players.layout)


def run_method(
    method: Method, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
) -> np.ndarray:
    """``method.attribute``, at the embedding output for gradient methods on token inputs. Attributions
    with a NaN or an infinity make the method not applicable to this model: they would otherwise
    reach a map, a score and a verdict as numbers."""
    attributions = _attribute(method, ctx, inputs, baselines, classes)
    finite = np.isfinite(attributions)
    if not finite.all():
        raise non_finite(method, int((~finite.reshape(len(finite), -1)).any(axis=1).sum()), len(finite))
    return attributions


def non_finite(method: Method, rows: int, of: int) -> NotApplicable:
    """The refusal for attributions with a NaN or an infinity in ``rows`` of ``of`` inputs."""
    return NotApplicable(
        method.name,
        f"it gave non-finite attributions (NaN or infinity) for {rows} of {of} inputs on this model's graph",
    )


def _attribute(
    method: Method, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
) -> np.ndarray:
    view = getattr(ctx.model, "embedding", None)
    converted = method.capabilities.gradients or method.capabilities.hooks  # runs on the torch graph
    if view is None or not method.capabilities.gradients:
        if converted:
            check_graph_matches_model(method.name, ctx.model, inputs)
        return method.attribute(ctx, inputs, baselines, classes)
    if not isinstance(view, EmbeddingView):  # pragma: no cover - only attach_embedding sets it
        raise NotApplicable(method.name, "the token input has no embedding to attribute at")
    emb_x, emb_b = view.embeddings(inputs), view.embeddings(baselines)
    check_graph_matches_model(method.name, view.head, emb_x)
    sub = AttributionContext(
        view.head, _spread_players(ctx.players, emb_x.shape[-1]), ctx.target, ctx.params, ctx.seed
    )
    attributions = method.attribute(sub, emb_x, emb_b, classes)
    return attributions.reshape(emb_x.shape).sum(axis=-1).astype(np.float32)
