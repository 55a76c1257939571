"""The methods' torch graph must compute what the model computes, or the methods explain another function.

Gradient and rule methods run on a torch graph converted from the ONNX model (onnx2torch, xaudit's
own converters and rewrites), while the game runs the model itself on onnxruntime. A converter that
computes something else gives maps of another function, which the audit would then judge against
the model's game as if they were the model's: onnx2torch's CumSum read a missing ``reverse`` as 1,
and RoBERTa from the legacy exporter converted to a graph with other logits. Before a gradient or
rule method runs, its graph is evaluated on a few of the rows it explains and compared with the
model's own outputs there; where they differ beyond float32 rounding of a different summation
order (and a float16 model's, which the methods run in float32), the method is not applicable and
says by how much.

A statically quantized model's graph fake-quantizes its activations (workers/models/fake_quantization.py):
its outputs are steps, and a float32 sum in another order than onnxruntime's integer kernels flips a
rounding here and there, which moves an output by a few of its quantization steps (resnet18 in int8:
one output in ten, by up to 4% of the largest). There the check compares more rows and asks that
most outputs match as above and none differ by more than a tenth of the largest: a converter that
computes something else moves most outputs, as does one that dropped the quantization
(docs/science.md 5.9).
"""

from __future__ import annotations

import hashlib
import weakref

import numpy as np
import torch

from workers.models.base import ModelAdapter
from workers.nudge import NUDGE, nudge_test
from xaudit.contract.errors import NotApplicable, XauditError

__all__ = ["check_graph_matches_model", "fake_quantized", "upgraded_from"]

_ROWS = 2  # compared rows: the check must cost next to nothing beside a method's passes
_RELATIVE = 1e-2  # of the outputs' largest magnitude: float16 models round to about 1e-3 of it
_ABSOLUTE = 1e-5
# Fake-quantized graphs: compared rows, the share of outputs that may be rounding flips, and how far.
_QUANTIZED_ROWS = 8
_FLIPPED_SHARE = 0.25
_FLIPPED_RELATIVE = 0.1
# Each model's compared rows (a digest) and what the comparison found (None: they matched). An
# audit's gradient and rule methods explain the same sub-inputs of a sample, so they compare them
# once: on resnet18 at 64x64 a check is a few percent of a method's call.
_CHECKED: weakref.WeakKeyDictionary[ModelAdapter, dict[bytes, str | None]] = weakref.WeakKeyDictionary()


def check_graph_matches_model(method: str, model: ModelAdapter, rows: np.ndarray) -> None:
    """Raise NotApplicable naming ``method`` where ``model``'s torch graph, on the first rows of
    ``rows``, gives other outputs than ``model`` itself. ONNX models only (a TorchScript module is
    its own graph); a model without a torch graph is left to the method, which says why."""
    if model.info.format != "onnx" or not len(rows):
        return
    quantized = fake_quantized(model)
    sample = np.ascontiguousarray(rows[: _QUANTIZED_ROWS if quantized else _ROWS], dtype=np.float32)
    key = hashlib.blake2b(repr(sample.shape).encode() + sample.tobytes(), digest_size=16).digest()
    checked = _CHECKED.setdefault(model, {})
    if key not in checked:
        checked[key] = _mismatch(model, sample, quantized)
    found = checked[key]
    if found is not None:
        raise NotApplicable(method, found)


def _mismatch(model: ModelAdapter, sample: np.ndarray, quantized: bool) -> str | None:
    """How ``model``'s torch graph (fake-quantized where ``quantized``) differs from the model on
    ``sample``; None where it does not (or where the model has no torch graph: the method says why)."""
    graph = _torch_graph(model)
    if graph is None:
        return None
    with torch.no_grad():
        got = graph(torch.from_numpy(sample).to(model.device)).reshape(len(sample), -1).float().cpu().numpy()
    want = model.predict(sample)
    if got.shape != want.shape:
        return (
            f"its torch graph (the model converted for gradients) gives outputs of shape {got.shape[1:]} "
            f"where the model gives {want.shape[1:]}"
        )
    scale = float(np.abs(want).max())
    differences = np.abs(got.astype(np.float64) - want)
    worst = float(differences.max())
    if quantized:
        found = _flips_only(differences, scale)
        return found if found is None else (_kernels_differ(model, sample, got, differences, scale) or found)
    if not worst <= _RELATIVE * scale + _ABSOLUTE:
        noise = _noise(model, sample, want, _RELATIVE * scale + _ABSOLUTE)
        if noise is not None:
            return noise
        return (
            f"its torch graph (the model converted for gradients) computes other outputs than the model "
            f"on the rows it explains (largest difference {worst:.3g} on outputs up to {scale:.3g}): its "
            "attributions would explain another function"
        )
    return None


def _torch_graph(model: ModelAdapter) -> torch.nn.Module | None:
    """``model``'s torch graph; None where it has none (the methods say why)."""
    try:
        return model.torch_differentiable()
    except XauditError:
        return None


def fake_quantized(model: ModelAdapter) -> bool:
    """``model``'s torch graph fake-quantizes (a statically quantized ONNX model); False where it
    has none."""
    graph = _torch_graph(model)
    if graph is None:
        return False
    from workers.models.onnx_converters import fake_quantizes  # loaded with the graph

    return fake_quantizes(graph)


def upgraded_from(model: ModelAdapter) -> int | None:
    """The opset ``model`` was upgraded from for its torch graph (workers.models.onnx_to_torch); None
    where it was converted as sent."""
    graph = _torch_graph(model)
    if graph is None:
        return None
    from workers.models.onnx_to_torch import UPGRADED_FROM  # loaded with the graph

    # the converted graph itself, or inside the module that feeds it the held inputs
    found = [getattr(part, UPGRADED_FROM) for part in graph.modules() if hasattr(part, UPGRADED_FROM)]
    return int(found[0]) if found else None


def _flipped(differences: np.ndarray, scale: float) -> tuple[float, float]:
    """The share of ``differences`` beyond the plain check's tolerance, and the largest."""
    return float((differences > _RELATIVE * scale + _ABSOLUTE).mean()), float(differences.max())


def _flips_only(differences: np.ndarray, scale: float) -> str | None:
    """Why a fake-quantized graph's ``differences`` from the model are more than rounding flips;
    None where they are not."""
    flipped, worst = _flipped(differences, scale)
    if flipped <= _FLIPPED_SHARE and worst <= _FLIPPED_RELATIVE * scale + _ABSOLUTE:
        return None
    return (
        f"its torch graph (the quantized model converted for gradients, docs/science.md 5.9) computes "
        f"other outputs than the model on the rows it explains ({flipped:.0%} of them differ by more "
        f"than 1% of the largest, {scale:.3g}, and up to {worst:.3g}; rounding flips move a few, by "
        "a few quantization steps): its attributions would explain another function"
    )


def _kernels_differ(
    model: ModelAdapter, sample: np.ndarray, got: np.ndarray, differences: np.ndarray, scale: float
) -> str | None:
    """Why a fake-quantized graph that computes the model as ONNX defines it (onnxruntime with its
    graph optimizations off) still differs from the model as the game runs it: onnxruntime's fused
    integer kernels (a quantized transformer's) round otherwise; None where the graph does not
    match the definition either."""
    defined = model.predict_as_defined(sample)
    if defined is None or _flips_only(np.abs(got.astype(np.float64) - defined), float(np.abs(defined).max())):
        return None
    flipped, worst = _flipped(differences, scale)
    return (
        "its torch graph computes the quantized model as ONNX defines it (each quantization step in "
        "float, as onnxruntime does with its graph optimizations off), but onnxruntime's fused integer "
        f"kernels, which the game runs, give other outputs on the rows it explains ({flipped:.0%} of "
        f"them differ by more than 1% of the largest, {scale:.3g}, and up to {worst:.3g}): "
        "its attributions would explain the model as defined, not as it runs (docs/science.md 5.9)"
    )


def _noise(model: ModelAdapter, sample: np.ndarray, outputs: np.ndarray, tolerance: float) -> str | None:
    """Why no graph can match the model on ``sample`` (where it gives ``outputs``), where the model's
    own output on some row is rounding noise rather than a value (workers.nudge); None where every
    row has a value."""
    size = float(np.abs(sample).max()) or 1.0  # an all-zero row (a zeros reference) has no scale
    nudge = nudge_test(model.predict, sample, 0.0 if model.takes_ids else size, tolerance, at=outputs)
    if not nudge.noise.any():
        return None
    return (
        f"the model's own output on the rows it explains is rounding noise, not a value (it moves by "
        f"{float(nudge.change.max()):.3g} for a step of {NUDGE:g} of their scale, and not ten times as much "
        "for ten times the step), so no graph converted from it can match it there; the game's "
        "reference check says the same of the reference"
    )
