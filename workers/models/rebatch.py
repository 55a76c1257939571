"""Models exported with a fixed batch of 1, re-batched where the graph allows it.

Exporters without dynamic axes write the example's batch size into the input (``(1, 3, 224, 224)``).
Most such graphs compute row by row anyway; then declaring the batch dim symbolic lets one call
evaluate many rows (and gives rule methods a plain graph). Whether the graph really allows it is
checked, not assumed: the re-batched model must give, on two different rows at once, what the
original gives on each row alone. Otherwise the model is evaluated one row per call. The constant
shapes an exporter wrote the batch of 1 into are rewritten first where the plain declaration is not
enough (workers/models/pinned_shapes.py); the check decides there too.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from workers.models.batch_coupling import rows_coupled_by
from workers.models.ort_options import session_options
from workers.models.pinned_shapes import unpin_constant_shapes
from workers.models.row_indices import count_rows_in_indices

__all__ = ["Rebatched", "batch_pinned_by_outputs", "rebatched"]

logger = logging.getLogger(__name__)

_BATCH = "xaudit_batch"


@dataclass(frozen=True)
class Rebatched:
    """The widened model's bytes, and how many of its nodes were rewritten (0: its batch declared
    symbolic, nothing else), which the report states."""

    data: bytes
    rewritten_nodes: int


def _symbolic(
    model: onnx.ModelProto, explained: str, batched: Collection[str], size: int, rewrites: int
) -> tuple[onnx.ModelProto, int] | None:
    """A copy of ``model`` with the batch of the inputs ``batched`` (``explained`` among them) and of
    the outputs declared symbolic, and the number of nodes rewritten. ``rewrites`` 1: its constant
    shapes that pin the batch are rewritten too (workers/models/pinned_shapes.py); 2: its constant
    row indices as well (workers/models/row_indices.py); None where those find nothing to rewrite."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rewritten = 0
    if rewrites >= 2:
        indices = count_rows_in_indices(copy, explained)
        if not indices:
            return None
        rewritten += indices
    if rewrites >= 1:
        for value in copy.graph.input:
            if value.name in batched and len(value.type.tensor_type.shape.dim) > 0:
                value.type.tensor_type.shape.dim[0].dim_value = size  # static for the shapes' inference
        rewritten += unpin_constant_shapes(copy, explained, set(batched) - {explained})
        if not rewritten:
            return None
    outputs = {value.name for value in copy.graph.output}
    for value in (*copy.graph.input, *copy.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 0 and (value.name in batched or (value.name in outputs and dims[0].dim_value == size)):
            dims[0].dim_param = _BATCH  # clears dim_value (a oneof)
    del copy.graph.value_info[:]  # inferred shapes carried the fixed batch
    return copy, rewritten


def batch_pinned_by_outputs(model: onnx.ModelProto) -> bool:
    """Whether a one-input graph whose input batch is declared symbolic still pins it to 1: every
    output is declared with a leading dim of exactly 1. torch.onnx.export (dynamo) writes such graphs
    when torch.export specialised the batch to the example's 1 (``Dim.AUTO`` on torchvision's ViT):
    the input is named ``s77`` but a ``Reshape`` inside fixes the batch, and more rows fail."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1 or not model.graph.output:
        return False
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) == 0 or dims[0].HasField("dim_value"):
        return False
    for output in model.graph.output:
        out = output.type.tensor_type.shape.dim
        if len(out) == 0 or not out[0].HasField("dim_value") or out[0].dim_value != 1:
            return False
    return True


def rebatched(
    model: onnx.ModelProto,
    explained: str,
    feed: Mapping[str, np.ndarray],
    batched: Collection[str],
    original: ort.InferenceSession,
) -> Rebatched | None:
    """``model`` with a symbolic batch on the inputs ``batched`` (the explained one among them), or
    None when the graph does not compute row by row: it has an operator known to couple a batch's
    rows (workers/models/batch_coupling.py; two rows may agree within the check below and still be
    coupled), or its two-row check fails.

    ``feed`` holds a value for every input of the model: one row (1, ...) of each batched input, the
    others as they are held. The check varies the explained input's rows and repeats one value of the
    other batched inputs: every call xaudit makes holds them at one sample's values for all its rows
    (workers/models/named.py), which is all the widened model is asked to honour. (The dynamo
    exporter writes BERT's attention mask, from a one-row example, as a gather of row 0's mask.)
    """
    if rows_coupled_by(model) is not None:
        return None
    declared = {i.name: i.shape[0] if i.shape else None for i in original.get_inputs()}
    if set(declared) != set(feed) or any(isinstance(declared[n], int) and declared[n] != 1 for n in batched):
        return None  # a symbolic input batch comes with outputs pinned to 1 (batch_pinned_by_outputs)
    first = feed[explained]
    second = np.roll(first, 1, axis=-1) if first.dtype.kind in "iub" else first * 0.5 + 0.25
    rows = {
        name: np.concatenate([first, second.astype(first.dtype)])
        if name == explained
        else (np.concatenate([value, value]) if name in batched else value)
        for name, value in feed.items()
    }
    try:
        alone = [original.run(None, {**feed, explained: rows[explained][i : i + 1]}) for i in range(2)]
    except Exception as exc:  # the model's own error comes again, precisely, where it is used
        logger.info("fixed-batch model fails on one row: %s", str(exc).splitlines()[0][:160])
        return None
    # The declared batch alone; then with the shapes that pin it rewritten; then with its row indices.
    for rewrites in range(3):
        widened = _symbolic(model, explained, batched, 1, rewrites)
        if widened is not None:
            data, rewritten = widened[0].SerializeToString(), widened[1]
            del widened  # the copy's weights go before the check's session is built
            if _rows_kept(data, rows, alone):
                return Rebatched(data, rewritten)
    return None


def _rows_kept(data: bytes, rows: Mapping[str, np.ndarray], alone: list[list[np.ndarray]]) -> bool:
    """Whether the widened model gives, on ``rows`` at once, what the original gave on each alone."""
    try:
        options = session_options()
        options.log_severity_level = 4  # a graph that pins the batch fails here by design: logged below
        session = ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
        both = session.run(None, dict(rows))
    except Exception as exc:  # the graph pins the batch somewhere (a Reshape to (1, -1)...)
        logger.info("fixed-batch model cannot be re-batched: %s", str(exc).splitlines()[0][:160])
        return False
    for k, out in enumerate(both):
        single = np.concatenate([alone[0][k], alone[1][k]])
        if np.shape(out) != single.shape or not np.allclose(out, single, rtol=1e-4, atol=1e-5):
            logger.info("fixed-batch model mixes rows when re-batched: evaluated one row per call")
            return False
    return True
