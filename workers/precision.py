"""Full float32 on GPUs: no TF32 in torch, ONNX Runtime, cuBLAS or cuDNN.

Ampere and later GPUs run float32 convolutions (cuDNN, torch's default) and ONNX Runtime's matrix
products in TF32, a 10-bit mantissa. The audit takes float32 rounding as part of a method's noise
floor and judges allocations to 0.05 of the effect mass (docs/science.md 5.4); on an H200 TF32 moved
the digits audit's scores by up to 1e-2 from the CPU's, full float32 by 1e-6 (bench/suite.py, gpu).
"""

from __future__ import annotations

import os

__all__ = ["CUDA_PROVIDER_OPTIONS", "TF32_ENV", "forbid_tf32", "full_float32_torch"]

# NVIDIA's libraries read it when they start: 0 turns TF32 off whatever the framework asks for.
TF32_ENV = "NVIDIA_TF32_OVERRIDE"
# ONNX Runtime's own switch for its CUDA matrix products, and its convolution algorithms taken from
# cuDNN's heuristics, as torch takes them, not from timing each new input shape (its default,
# EXHAUSTIVE): a choice by timing can differ from run to run, and on an H200 the digits game at
# calls of 17,408 and 13,312 rows took 39.7 ms per 65,536 rows with it, 4.6 ms with the heuristics,
# which were as fast or faster at every size measured (README, GPU; bench/game_calls.py).
CUDA_PROVIDER_OPTIONS = {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}


def forbid_tf32(environ: dict[str, str] | None = None) -> None:
    """Before any CUDA library starts in this process; the processes it starts inherit it."""
    env = os.environ if environ is None else environ
    env[TF32_ENV] = "0"


def full_float32_torch() -> None:
    """torch's float32 convolutions and matrix products in IEEE float32 (its cuDNN default is TF32)."""
    import torch

    # The properties torch sets up at run time. A value set on one backend (by a library, through
    # the legacy allow_tf32 flags) outlives the generic setting, so each is set too.
    torch.backends.fp32_precision = "ieee"  # type: ignore[attr-defined]
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # type: ignore[attr-defined]
    torch.backends.cudnn.rnn.fp32_precision = "ieee"  # type: ignore[attr-defined]
