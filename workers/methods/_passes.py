"""Rows per forward+backward pass: what bounds the activations a pass stores, for the gradient
methods (workers.methods._autograd) and the rule methods (LRP, DeepLIFT, Zennit's) alike.

Two budgets, the smaller wins. Input elements: a fixed count of rows did not bound activations
(resnet18 at 224x224 holds about 17 MB per row, so the 512 rows per backward pass the gradient
methods took held about 9 GB). And the bytes a row's forward saves for its backward, measured on the
graph: a transformer saves far more per input element than a CNN (a BERT of width 256 at 128 tokens
saved 11.4 MB per row of 32,768 elements, 7.2 MB since workers.models.gelu_fusion; resnet18 at
224x224 11.6 MB per row of 150,528), so the element budget let 128 rows of that BERT share a pass:
2.6 GB, and slower than passes of 32.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

from workers.device_budget import budget_scale, equal_parts

if TYPE_CHECKING:
    import torch

__all__ = ["CHUNK", "ELEMENTS", "SAVED_BYTES", "elements_per_pass", "rows_per_pass", "saved_bytes_per_row"]

# Most rows per pass, input elements per pass and bytes saved for the backward per pass (times
# workers.device_budget's scale on a GPU).
CHUNK = 1024
ELEMENTS = 2**22
SAVED_BYTES = 2**28

# graph -> (row shape, dtype, device) -> bytes: one probe per graph and input shape.
_probed: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[object, ...], int]] = (
    weakref.WeakKeyDictionary()
)


def elements_per_pass(device: torch.device) -> int:
    """Input elements one pass may hold on ``device``: ELEMENTS, scaled up on a GPU."""
    return ELEMENTS * budget_scale(device)


def rows_per_pass(inputs: torch.Tensor, graph: torch.nn.Module | None = None) -> int:
    """Rows of ``inputs`` per forward+backward pass through ``graph`` (None: the element budget
    alone); more on a GPU (workers.device_budget). Passes of equal size: 512 rows at most 473 per
    pass are two passes of 256, not 473 and a pass of 39 that costs a GPU nearly as much."""
    most = max(1, min(CHUNK, elements_per_pass(inputs.device) // max(1, math.prod(inputs.shape[1:]))))
    if graph is not None and len(inputs) > 1:
        per_row = saved_bytes_per_row(graph, inputs)
        if per_row > 0:
            most = max(1, min(most, SAVED_BYTES * budget_scale(inputs.device) // per_row))
    return equal_parts(len(inputs), most)


def saved_bytes_per_row(graph: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Bytes ``graph``'s forward saves for its backward per row of ``inputs``: the saved storages of
    a two-row forward less those of a one-row forward (the weights both save cancel). 0 where the
    probe cannot run (a graph that takes a fixed batch): the element budget alone then applies."""
    key = (tuple(inputs.shape[1:]), inputs.dtype, inputs.device)
    # A model with held inputs binds each sample in a new module around one shared graph.
    known = _probed.setdefault(getattr(graph, "shared_graph", graph), {})
    if key not in known:
        try:
            one, two = _saved_bytes(graph, inputs[:1]), _saved_bytes(graph, inputs[:2])
        except Exception:  # only a probe: the method's own pass reports what the model rejects
            one = two = 0
        known[key] = max(0, two - one)
    return known[key]


def _saved_bytes(graph: torch.nn.Module, rows: torch.Tensor) -> int:
    import torch

    storages: dict[int, int] = {}

    def pack(saved: torch.Tensor) -> torch.Tensor:
        storage = saved.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return saved

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        graph(rows.detach().clone().requires_grad_(True))
    return sum(storages.values())
