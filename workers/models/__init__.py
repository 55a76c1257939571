"""Model adapters: one interface over ONNX and TorchScript."""

from __future__ import annotations

import hashlib

from workers.allocator import keep_freed_memory
from workers.models.base import DEFAULT_BATCH_SIZE, ModelAdapter, ModelInfo
from workers.models.devices import resolve_device
from workers.threads import apply as apply_thread_policy
from xaudit.contract.errors import InvalidInput, InvalidModel
from xaudit.contract.onnx_checks import detect_format

__all__ = ["DEFAULT_BATCH_SIZE", "ModelAdapter", "ModelInfo", "detect_format", "load_model", "resolve_device"]


def load_model(
    data: bytes, model_format: str | None = None, device: str = "auto", batch_size: int = DEFAULT_BATCH_SIZE
) -> ModelAdapter:
    """Load untrusted model bytes. TorchScript can run code: callers on a server do this in a sandbox."""
    if not data:
        raise InvalidModel("the model file is empty")
    fmt = (model_format or detect_format(data)).lower()
    sha256 = hashlib.sha256(data).hexdigest()
    apply_thread_policy()  # before the first session or graph: workers.threads
    keep_freed_memory()  # tensors reuse freed memory instead of faulting in fresh pages
    torch_device = resolve_device(device)
    if fmt == "onnx":
        from workers.models.onnx_model import OnnxModel

        return OnnxModel(data, sha256, torch_device, batch_size)
    if fmt in ("torchscript", "pt", "ts"):
        from workers.models.torchscript_model import TorchScriptModel

        return TorchScriptModel(data, sha256, torch_device, batch_size)
    raise InvalidInput(f"unknown model format '{model_format}' (use onnx or torchscript)")
