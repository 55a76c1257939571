"""Attribution methods, registered by canonical name in one table.

Each method lives in its own module with one class implementing :class:`Method`; modules are
imported on first use so that asking for one method does not load every library.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from functools import cache

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method, derived_seed
from workers.methods.references import choose_references
from xaudit.contract.errors import NotApplicable, UnknownMethod
from xaudit.contract.spec import ALL_METHODS, resolve_method_names

__all__ = [
    "ALL_METHODS",
    "AttributionContext",
    "Capabilities",
    "Method",
    "attribute",
    "derived_seed",
    "get_method",
    "release_derived",
    "resolve_method_names",
]

# name -> "module:Class" (module under workers.methods)
_TABLE: dict[str, str] = {
    "gradient_x_input": "gradient_x_input:GradientXInput",
    "occlusion_1": "occlusion:Occlusion1",
    "occlusion_patch": "occlusion:OcclusionPatch",
    "prediction_difference": "prediction_difference:PredictionDifference",
    "grad_cam": "grad_cam:GradCam",
    "integrated_gradients": "integrated_gradients:IntegratedGradients",
    "expected_gradients": "expected_gradients:ExpectedGradients",
    "shapley_value": "shapley_value:ShapleyValue",
    "lrp_epsilon": "lrp:LrpEpsilon",
    "lrp_alpha_beta": "lrp:LrpAlphaBeta",
    "deep_taylor": "lrp:DeepTaylor",
    "deeplift_rescale": "deeplift:DeepLiftRescale",
    "deepshap": "deeplift:DeepShap",
    "deeplift_revealcancel": "deeplift_revealcancel:DeepLiftRevealCancel",
    "saliency": "saliency:Saliency",
    "smoothgrad": "saliency:SmoothGrad",
}
assert set(_TABLE) == set(ALL_METHODS)


# Modules that keep weights derived from a model's layers for the model's life (each has a
# ``release_derived()``).
_DERIVING = ("_lrp_rules", "deeplift_revealcancel")


def release_derived() -> None:
    """Let go of the weights the methods derived from a model's layers (LRP's stacked blocks,
    RevealCancel's float64 plans). An audit runs one method at a time, and kept together they held
    3.1 GB beside VGG11's 0.5 GB of weights; a method that runs again derives them again."""
    for name in _DERIVING:
        module = sys.modules.get(f"workers.methods.{name}")
        if module is not None:  # never loaded: nothing derived
            module.release_derived()


@cache
def get_method(name: str) -> Method:
    """The method registered under ``name``; :class:`UnknownMethod` otherwise."""
    entry = _TABLE.get(name)
    if entry is None:
        raise UnknownMethod(f"unknown method '{name}'; known: {', '.join(ALL_METHODS)}")
    module_name, class_name = entry.split(":")
    module = importlib.import_module(f"workers.methods.{module_name}")
    method: Method = getattr(module, class_name)()
    return method


def attribute(
    method: Method,
    ctx: AttributionContext,
    inputs: np.ndarray,
    baselines: np.ndarray,
    classes: np.ndarray,
    background: np.ndarray | None = None,
) -> np.ndarray:
    """Run ``method``; distribution-baseline methods average their constituents over ``background``."""
    from workers.methods._embedding import run_method  # loads the model stack only when computing

    if ctx.model.per_sample:  # held-fixed inputs differ per sample: one sample per call
        rows = [slice(s, s + 1) for s in range(len(inputs))]
        return np.concatenate(
            [
                attribute(
                    method,
                    replace(ctx, model=ctx.model.for_sample(r.start)),
                    inputs[r],
                    baselines[r],
                    classes[r],
                    background,
                )
                for r in rows
            ]
        )
    if method.capabilities.baseline != "distribution":
        return run_method(method, ctx, inputs, baselines, classes)
    if background is None:
        raise NotApplicable(method.name, "it needs a background set of samples (--background)")
    references = choose_references(background, ctx.seed).references
    # Parameters that follow from the background (Expected Gradients' steps), unless the job's
    # parameters were bound already (workers.explain.job_params): then unchanged.
    params = method.bind(ctx.params, inputs, (baselines, background))
    total = np.zeros(inputs.shape, dtype=np.float64)
    for m, reference in enumerate(references):
        sub = AttributionContext(ctx.model, ctx.players, ctx.target, params, derived_seed(ctx.seed, "bg", m))
        refs = np.broadcast_to(reference[None], inputs.shape)
        total += run_method(method, sub, inputs, refs, classes)
    return (total / len(references)).astype(np.float32)
