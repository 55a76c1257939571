"""Where the rows stand at a mean or a sum over axis 0, for the rule methods' plan.

The plan (workers/methods/_fx_plan.py) takes a ReduceMean or ReduceSum over axes other than the
batch's as pooling within each row, and refuses one over axis 0, which it takes for the batch. A
model whose activations are laid out sequence first pools over the positions with ``mean(0)``
(``nn.TransformerEncoder`` without ``batch_first``, then ``.mean(0)``): axis 0 holds the positions
and the rows stand in axis 1. workers/models/batch_placement.py follows the rows through the graph;
where it finds them off axis 0 at such a reduction, the converted module says so
(``xaudit_rows_axis``) and the plan pools it as any other.
"""

from __future__ import annotations

import onnx
import torch

from workers.models.batch_placement import rows_axes
from workers.models.onnx_nodes import attributes, constant_tensors, reduced_axes

__all__ = ["ROWS_AXIS", "mark_pooled_rows", "rows_at_axis_0_pools"]

ROWS_AXIS = "xaudit_rows_axis"  # the converted module's attribute: the axis of its input's rows
_POOLS = ("ReduceMean", "ReduceSum")


def rows_at_axis_0_pools(model: onnx.ModelProto) -> dict[str, int]:
    """The axis that holds the rows in the input of each ReduceMean or ReduceSum over axis 0 (by the
    input's name), where the walk follows them there; empty where there is no such reduction."""
    constants = constant_tensors(model.graph)
    producers = {out: node for node in model.graph.node for out in node.output}
    pooled = set()
    for node in model.graph.node:
        if node.op_type not in _POOLS or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        stacked = producers.get(node.input[0])
        if stacked is not None and stacked.op_type == "Concat" and attributes(stacked).get("axis") == 0:
            continue  # torch.stack(parts).sum(0): the plan takes it as the parts' sum already
        if 0 in (reduced_axes(node, constants) or []):
            pooled.add(node.input[0])
    if not pooled:
        return {}
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    if not inputs:
        return {}
    found = rows_axes(model, inputs[0], inputs[1:])
    return {name: found[name] for name in pooled if name in found}


def mark_pooled_rows(module: torch.nn.Module, rows: dict[str, int]) -> None:
    """Say on each converted module (onnx2torch's, converted with its ONNX mapping) whose input is
    one of ``rows`` where that input's rows stand."""
    if not rows:
        return
    for part in module.modules():
        mapping = getattr(part, "onnx_mapping", None)
        if mapping is not None and mapping.inputs and mapping.inputs[0] in rows:
            setattr(part, ROWS_AXIS, rows[mapping.inputs[0]])
