"""Max pools padded at their far end only, as ceil-mode pools written before opset 10, made ceil-mode
pools again for the methods' graph (run by workers/models/onnx_to_torch.py).

MaxPool had no ``ceil_mode`` before opset 10: Caffe's pools (which round up) and torch's
``ceil_mode=True`` were written with extra padding at the end of each spatial axis, padding that a
max ignores (the ONNX Model Zoo's SqueezeNet, GoogLeNet, AlexNet and CaffeNet; torch's legacy
exporter at opsets 7 to 9). onnx2torch converts such a pool as a Pad with -inf followed by the pool,
and the rule methods refused the Pad: a difference of two -inf is not a number. Where the padded
pool has exactly the windows of a ceil-mode pool without padding (each starts inside the input),
the two compute the same maximum, and the pool is written as that.
"""

from __future__ import annotations

import math
from typing import Any

import onnx
from onnx import helper

from workers.models.onnx_nodes import attributes, default_opset
from workers.models.onnx_shapes import inferred_tensors

__all__ = ["ceil_mode_pools", "has_far_end_pads"]


def ceil_mode_pools(model: onnx.ModelProto) -> int:
    """Rewrite each MaxPool (opset 10 or later) padded at its far ends only whose windows are a
    ceil-mode pool's; returns how many were rewritten."""
    opset = default_opset(model)
    pools = [
        node for node in model.graph.node if node.op_type == "MaxPool" and node.domain in ("", "ai.onnx")
    ]
    if opset < 10 or not any(_far_end_padded(node) for node in pools):
        return 0
    sizes = _spatial_sizes(model)
    rewritten = 0
    for node in pools:
        spatial = sizes.get(node.input[0])
        if not _far_end_padded(node) or spatial is None or not _same_windows(attributes(node), spatial):
            continue
        kept = [a for a in node.attribute if a.name not in ("pads", "ceil_mode", "auto_pad")]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.append(helper.make_attribute("ceil_mode", 1))
        rewritten += 1
    return rewritten


def has_far_end_pads(model: onnx.ModelProto) -> bool:
    """``model`` has a max pool that may be a ceil-mode pool written before opset 10."""
    return any(node.op_type == "MaxPool" and _far_end_padded(node) for node in model.graph.node)


def _far_end_padded(node: onnx.NodeProto) -> bool:
    """A max pool (values only) with explicit padding at the far end of some axis and none at the
    near ends, undilated, not in ceil mode already."""
    options = attributes(node)
    pads = list(options.get("pads", []))
    half = len(pads) // 2
    return (
        len(node.output) == 1
        and options.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
        and not options.get("ceil_mode", 0)
        and all(d == 1 for d in options.get("dilations", [1]))
        and any(p > 0 for p in pads[half:])
        and all(p == 0 for p in pads[:half])
    )


def _same_windows(options: dict[str, Any], spatial: list[int]) -> bool:
    """The pool padded by ``pads`` at the far ends has the windows, in number and place, of a
    ceil-mode pool without padding (torch's count: rounded up, less a window that would start past
    the input), and each window holds at least one of the input's values."""
    kernel, pads = list(options["kernel_shape"]), list(options["pads"])
    strides = list(options.get("strides", [1] * len(kernel)))
    if len(spatial) != len(kernel):
        return False
    for size, k, s, end in zip(spatial, kernel, strides, pads[len(kernel) :], strict=True):
        padded = (size + end - k) // s + 1
        ceil = math.ceil((size - k) / s) + 1
        if (ceil - 1) * s >= size:
            ceil -= 1
        if padded != ceil or (padded - 1) * s >= size:
            return False
    return True


def _spatial_sizes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The spatial sizes (every axis after the first two) of each value whose sizes are all known."""
    found: dict[str, list[int]] = {}
    for name, (dims, _) in inferred_tensors(model).items():
        spatial = [size for size in dims[2:] if size is not None]
        if len(dims) > 2 and len(spatial) == len(dims) - 2:
            found[name] = spatial
    return found
