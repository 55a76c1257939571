"""Which output of an ONNX model the game and the methods explain, and the scores a ZipMap hides.

Classifiers exported from scikit-learn (skl2onnx), LightGBM and XGBoost (onnxmltools) give two
outputs, the predicted label first (int64) and the class probabilities second; skl2onnx and the
LightGBM converter wrap the probabilities in a ``ZipMap`` by default, a sequence of one
{label: probability} map per row. Reading "the first output" audited the label, a step function
of the input, and naming the probabilities failed on the maps. So:

- the explained output is the one the target names (``output:NAME``), else the model's first
  output with floating-point values; an integer or string output (a label) is never one;
- a graph output made by ``ZipMap`` is read as the probabilities the ZipMap takes (its input, a
  (rows, classes) float tensor), under the output's own name: the ZipMap is removed.

docs/science.md, section 2 ("What is explained"), says why a label is not a score.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from xaudit.contract.errors import InvalidInput, InvalidModel

__all__ = ["explained_output", "maps_as_tensors", "needs_output_choice", "only_output"]

# An output whose element type is not declared (UNDEFINED) may be scores: onnxruntime says at run time.
_SCORES = {
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.UNDEFINED,
}
_ML_DOMAIN = "ai.onnx.ml"


def _score_maps(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The ZipMaps that make a graph output of their own: read by no node, and their tensor no output
    itself (no other export is known)."""
    outputs = {o.name for o in graph.output}
    read = {name for node in graph.node for name in node.input}
    return [
        node
        for node in graph.node
        if node.op_type == "ZipMap" and node.domain == _ML_DOMAIN and len(node.output) == 1
        and node.output[0] in outputs and node.output[0] not in read and node.input[0] not in outputs
    ]  # fmt: skip


def maps_as_tensors(model: onnx.ModelProto) -> list[str]:
    """Rewrite in place every graph output made by a ZipMap (:func:`_score_maps`) into the (rows,
    classes) float tensor the ZipMap takes, renamed to the output's name (so that the output is that
    tensor, as an operator's output the methods' planners can recognise); the names of the outputs
    rewritten."""
    graph = model.graph
    outputs = {o.name: o for o in graph.output}
    zipmaps = _score_maps(graph)
    for zipmap in zipmaps:
        scores, name = zipmap.input[0], zipmap.output[0]
        labels = next(
            (len(a.ints) or len(a.strings) for a in zipmap.attribute if a.name.startswith("classlabels")),
            None,
        )
        graph.node.remove(zipmap)
        for node in graph.node:  # the scores tensor takes the output's name wherever it appears
            for names in (node.input, node.output):
                for i, value in enumerate(names):
                    if value == scores:
                        names[i] = name
        outputs[name].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", labels]))
    return [zipmap.output[0] for zipmap in zipmaps]


def _elem_type(value: onnx.ValueInfoProto) -> int | None:
    return value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else None


def _describe(value: onnx.ValueInfoProto) -> str:
    elem = _elem_type(value)
    kind = value.type.WhichOneof("value") if elem is None else TensorProto.DataType.Name(elem).lower()
    return f"'{value.name}' ({kind})"


def needs_output_choice(model: onnx.ModelProto) -> bool:
    """Whether the explained output must be chosen: several outputs, or one that gives no scores
    (a ZipMap's maps read as their tensor count as scores)."""
    outputs = model.graph.output
    if len(outputs) != 1:
        return True
    zipped = {node.output[0] for node in _score_maps(model.graph)}
    return outputs[0].name not in zipped and _elem_type(outputs[0]) not in _SCORES


def explained_output(model: onnx.ModelProto, named: str | None = None) -> str:
    """The output explained (after :func:`maps_as_tensors`): ``named``, checked to give scores, else
    the first output that does."""
    outputs = list(model.graph.output)
    scores = [o.name for o in outputs if _elem_type(o) in _SCORES]
    if named is not None:
        given = next((o for o in outputs if o.name == named), None)
        if given is None:
            raise InvalidInput(
                f"the model has no output '{named}' (outputs: {', '.join(o.name for o in outputs)})"
            )
        if named not in scores:
            others = f"; explain {', '.join(repr(s) for s in scores)}" if scores else ""
            raise InvalidInput(
                f"output {_describe(given)} holds no scores to attribute (a label or an index is a step "
                f"function of the input){others}"
            )
        return named
    if not scores:
        raise InvalidModel(
            "the model has no output with floating-point scores to explain (outputs: "
            f"{', '.join(_describe(o) for o in outputs)})"
        )
    return scores[0]


def only_output(model: onnx.ModelProto, output: str) -> None:
    """Keep in place only ``output`` and the nodes it needs (subgraphs' reads included), so that an
    operator feeding only another output (a label's ArgMax and lookup) cannot make the methods'
    torch conversion fail. Every graph input stays: the methods feed them all by position."""
    graph = model.graph
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output}
    keep: set[int] = set()
    stack = [output]
    while stack:
        index = producer.get(stack.pop())
        if index is None or index in keep:
            continue
        keep.add(index)
        stack.extend(_reads(graph.node[index]))
    kept = [node for i, node in enumerate(graph.node) if i in keep]
    del graph.node[:]
    graph.node.extend(kept)
    chosen = [o for o in graph.output if o.name == output]
    del graph.output[:]
    graph.output.extend(chosen)


def _reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads, including outer-scope names its subgraphs read."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in sub.node:
                names.extend(_reads(inner))
    return names
