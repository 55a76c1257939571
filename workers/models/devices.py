"""Device choice: explicit, with any fallback to CPU logged."""

from __future__ import annotations

import logging

import torch

from workers.metrics import record_cpu_fallback
from workers.precision import full_float32_torch
from xaudit.contract.errors import FailedPrecondition, InvalidInput

__all__ = ["resolve_device"]

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when present, else CPU, said in the log), ``cpu``, ``cuda`` or ``cuda:N``."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            full_float32_torch()
            return torch.device("cuda")
        logger.info("no CUDA device available: computing on the CPU")
        record_cpu_fallback("torch")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise FailedPrecondition(f"device '{name}' requested but CUDA is not available on this machine")
        full_float32_torch()
        return torch.device(name)
    raise InvalidInput(f"unknown device '{name}' (use auto, cpu or cuda)")
