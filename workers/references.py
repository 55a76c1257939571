"""References (baselines): what "absent" means for a unit."""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter

from xaudit.contract.errors import InvalidInput
from xaudit.contract.layout import channels_last, is_volume, spatial_axes
from xaudit.contract.subspecs import parse_baseline

__all__ = ["check_background", "make_baselines"]


def make_baselines(spec: str, inputs: np.ndarray, tensor: np.ndarray | None = None) -> np.ndarray:
    """Per-sample references (B, *sample_shape) float32 for ``zeros``, ``mean``, ``blur[:SIGMA]``,
    ``constant:V``, ``token:ID`` or ``tensor`` (the attached ``baseline`` array, one sample or one per input).
    The string's syntax and bounds are the contract's (xaudit.contract.subspecs.parse_baseline)."""
    parsed = parse_baseline(spec)
    kind = parsed.kind
    sample_shape = inputs.shape[1:]
    if kind == "zeros":
        out = np.zeros_like(inputs)
    elif kind == "constant":
        out = np.full_like(inputs, parsed.value)
    elif kind == "token":
        # Token ids: "absent" is a reference id (pad, mask, unk) in every position.
        if inputs.dtype.kind in "iu" and parsed.token > np.iinfo(inputs.dtype).max:
            raise InvalidInput(
                f"baseline '{spec}': token id {parsed.token} does not fit the input's {inputs.dtype}"
            )
        out = np.full_like(inputs, parsed.token)
    elif kind == "mean":
        if inputs.ndim >= 3:
            # Per sample and channel (axis 1, or the last of an (H, W, C) image), over the other axes.
            axes = (
                tuple(range(1, inputs.ndim - 1))
                if channels_last(sample_shape)
                else tuple(range(2, inputs.ndim))
            )
            out = np.broadcast_to(inputs.mean(axis=axes, keepdims=True), inputs.shape).copy()
        else:
            # Tabular: per-feature mean over the given samples.
            out = np.broadcast_to(inputs.mean(axis=0, keepdims=True), inputs.shape).copy()
    elif kind == "blur":  # over the spatial axes (xaudit.contract.layout), never the channels
        count = 3 if is_volume(sample_shape) else min(2, len(sample_shape))
        axes = spatial_axes(sample_shape, count)
        sigma = parsed.sigma if parsed.sigma is not None else max(1.0, min(sample_shape[a] for a in axes) / 8)
        sigmas = tuple(sigma if axis - inputs.ndim in axes else 0.0 for axis in range(inputs.ndim))
        out = gaussian_filter(inputs.astype(np.float64), sigma=sigmas, mode="nearest")
    elif kind == "tensor":
        if tensor is None:
            raise InvalidInput(f"baseline '{spec}' needs its baseline tensor")
        arr = np.asarray(tensor, dtype=np.float32)
        if tuple(arr.shape) == tuple(sample_shape):
            out = np.broadcast_to(arr[None], inputs.shape).copy()
        elif arr.shape == inputs.shape:
            out = arr.copy()
        else:
            raise InvalidInput(
                f"baseline tensor shape {tuple(arr.shape)} fits neither one sample {tuple(sample_shape)} "
                f"nor the inputs {tuple(inputs.shape)}"
            )
    else:
        raise InvalidInput(
            f"unknown baseline '{spec}' (use zeros, mean, blur[:SIGMA], constant:V, token:ID or a .npy file)"
        )
    out = np.asarray(out, dtype=np.float32)
    if not np.isfinite(out).all():
        raise InvalidInput(f"baseline '{spec}' contains NaN or Inf")
    return out


def check_background(background: np.ndarray, sample_shape: tuple[int, ...]) -> np.ndarray:
    """A background set (M, *sample_shape), finite, float32."""
    arr = np.asarray(background)
    if arr.ndim != len(sample_shape) + 1 or tuple(arr.shape[1:]) != tuple(sample_shape):
        raise InvalidInput(
            f"background shape {tuple(arr.shape)} is not (samples, {', '.join(map(str, sample_shape))})"
        )
    if arr.shape[0] < 1:
        raise InvalidInput("background set is empty")
    if arr.dtype.kind not in "fiu":
        raise InvalidInput(f"background dtype {arr.dtype} is not numeric")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise InvalidInput("background contains NaN or Inf")
    return arr
