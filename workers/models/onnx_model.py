"""ONNX models: onnxruntime for forward passes, onnx2torch for gradients and rules."""

from __future__ import annotations

import ctypes
import logging
import math
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
import torch

from workers.device_budget import equal_parts
from workers.metrics import count_forward, record_onnx_session
from workers.models.base import DEFAULT_BATCH_SIZE, ModelAdapter, ModelInfo
from workers.models.onnx_to_torch import method_graph
from workers.models.ort_options import session_options
from workers.precision import CUDA_PROVIDER_OPTIONS
from xaudit.contract.errors import InvalidModel
from xaudit.contract.onnx_checks import parse_onnx

if TYPE_CHECKING:
    import onnx

__all__ = ["OnnxModel", "cuda_fallback_reason", "parse_onnx", "session_providers"]

logger = logging.getLogger(__name__)


def session_providers(device: torch.device) -> list[str | tuple[str, dict[str, str]]]:
    """The providers an ``InferenceSession`` on ``device`` asks for, CUDA's in full float32."""
    if device.type == "cuda":
        return [("CUDAExecutionProvider", dict(CUDA_PROVIDER_OPTIONS)), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _session(data: bytes, device: torch.device) -> ort.InferenceSession:
    wanted = session_providers(device)
    options = session_options()  # threads, spinning, subnormals: workers/models/ort_options.py
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(data, sess_options=options, providers=wanted)
    except Exception as exc:
        raise InvalidModel(f"onnxruntime cannot load the model: {str(exc).splitlines()[0][:200]}") from None
    got = session.get_providers()
    record_onnx_session(device.type, got)
    if device.type == "cuda" and "CUDAExecutionProvider" not in got:
        # ORT falls back to the CPU without raising; say so, and why.
        logger.warning("CUDA requested but onnxruntime runs on %s: %s", got, cuda_fallback_reason())
    return session


def cuda_fallback_reason() -> str:
    """Why a session that asked for CUDA got the CPU: a CPU build of onnxruntime, or a CUDA build whose
    provider did not load (onnxruntime logs its own error; the driver's absence is named here)."""
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        return (
            f"this onnxruntime {ort.__version__} has no CUDA provider (available: {available}); "
            "install xaudit[gpu] (onnxruntime-gpu) instead of xaudit[cpu] on GPU machines"
        )
    try:  # dlopen, as onnxruntime's provider does; no subprocess (ctypes.util.find_library runs ldconfig)
        ctypes.CDLL("libcuda.so.1")
        driver = ""
    except OSError:
        driver = "; this machine has no NVIDIA driver library (libcuda.so.1)"
    return (
        f"onnxruntime-gpu {ort.__version__}'s CUDA provider did not load{driver} (it needs the NVIDIA "
        "driver and the CUDA and cuDNN libraries of its build, which torch's CUDA wheels bring: "
        "onnxruntime's own error above names the one missing)"
    )


def _joined(outs: list[np.ndarray], rows: int) -> np.ndarray:
    """One forward's outputs, call by call, as one (rows, C) float32 array; the calls counted."""
    count_forward(rows, len(outs))
    out = outs[0] if len(outs) == 1 else np.concatenate(outs)
    return out.astype(np.float32, copy=False)


def _quantized(model: onnx.ModelProto | None) -> bool:
    """``model`` quantizes its activations (QDQ pairs or QOperator nodes)."""
    return model is not None and any(
        node.op_type == "QuantizeLinear" or node.op_type.startswith("QLinear") or node.op_type == "QGemm"
        for node in model.graph.node
    )


class OnnxModel(ModelAdapter):
    def __init__(self, data: bytes, sha256: str, device: torch.device, batch_size: int = DEFAULT_BATCH_SIZE):
        self._proto: onnx.ModelProto | None = parse_onnx(data)  # until the torch graph is built
        self._session = _session(data, device)
        self.device = device
        self.batch_size = batch_size
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise InvalidModel(f"model has {len(inputs)} inputs {names}; this entry point takes one input")
        declared = inputs[0].shape
        self._fixed_batch = declared[0] if declared and isinstance(declared[0], int) else None
        sample = tuple(d if isinstance(d, int) else None for d in declared[1:]) if declared else None
        self.info = ModelInfo("onnx", sha256, inputs[0].name, sample, self._session.get_outputs()[0].name)
        self._torch: torch.nn.Module | None = None
        self._torch_error: InvalidModel | None = None
        # A quantized model's bytes, for a session that runs each node as ONNX defines it (onnxruntime
        # fuses quantized nodes into integer kernels that round otherwise): workers/methods/_conversion_check.py.
        self._defined: bytes | ort.InferenceSession | None = data if _quantized(self._proto) else None
        # Rows on the GPU are bound where they lie: a session on CUDA, float32 rows of any number.
        self._device_rows = (
            "CUDAExecutionProvider" in self._session.get_providers()
            and inputs[0].type == "tensor(float)"
            and self._fixed_batch is None
        )

    @property
    def execution_providers(self) -> list[str]:
        return list(self._session.get_providers())

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._predict(self._session, x)

    def predict_as_defined(self, x: np.ndarray) -> np.ndarray | None:
        if self._defined is None:
            return None
        if isinstance(self._defined, bytes):
            options = session_options()
            options.log_severity_level = 3
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._defined = ort.InferenceSession(
                self._defined, sess_options=options, providers=self._session.get_providers()
            )
        return self._predict(self._defined, x)

    def _predict(self, session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        step = self._fixed_batch or self.rows_per_call(math.prod(x.shape[1:]))
        outs = []
        for start in range(0, x.shape[0], step):
            chunk = x[start : start + step]
            rows = chunk.shape[0]
            if self._fixed_batch and rows < step:
                chunk = np.concatenate([chunk, np.zeros((step - rows, *chunk.shape[1:]), np.float32)])
            out = session.run([self.info.output_name], {self.info.input_name: chunk})[0]
            outs.append(out.reshape(out.shape[0], -1)[:rows])
        return _joined(outs, x.shape[0])

    @property
    def takes_device_rows(self) -> bool:
        return self._device_rows

    def predict_rows(self, x: torch.Tensor) -> np.ndarray:
        """Rows bound where they lie (ONNX Runtime's I/O binding): on a GPU, sub-inputs built there
        need no trip through the host; only the (rows, outputs) result comes back."""
        if self._fixed_batch or x.dtype != torch.float32:
            return super().predict_rows(x)
        step = equal_parts(x.shape[0], self.rows_per_call(math.prod(x.shape[1:])))
        outs = [self._run_bound(x[start : start + step].contiguous()) for start in range(0, x.shape[0], step)]
        return _joined(outs, x.shape[0])

    def _run_bound(self, x: torch.Tensor) -> np.ndarray:
        binding = self._session.io_binding()
        index = (
            (torch.cuda.current_device() if x.device.index is None else x.device.index) if x.is_cuda else 0
        )
        kind = "cuda" if x.is_cuda else "cpu"
        binding.bind_input(self.info.input_name, kind, index, np.float32, tuple(x.shape), x.data_ptr())
        binding.bind_output(self.info.output_name)  # on the host: onnxruntime copies it back
        if x.is_cuda:  # torch wrote x on its own stream, onnxruntime reads it on another
            torch.cuda.current_stream(x.device).synchronize()
        self._session.run_with_iobinding(binding)
        out: np.ndarray = binding.copy_outputs_to_cpu()[0]
        return out.reshape(out.shape[0], -1)

    def _graph(self) -> torch.nn.Module:
        if self._torch_error is not None:  # converted once: every gradient method gets the same answer
            raise self._torch_error
        if self._torch is None:
            assert self._proto is not None
            try:
                self._torch = method_graph(self._proto, self.device)
            except InvalidModel as exc:
                self._torch_error = exc
                raise
            finally:
                # Converted, or refused for good: the parsed model, weights and all (VGG's: 0.5 GB),
                # is not needed again.
                if self._torch is not None or self._torch_error is not None:
                    self._proto = None
        return self._torch

    def torch_differentiable(self) -> torch.nn.Module:
        return self._graph()

    def torch_hookable(self, method: str, row_by_row: bool = False) -> torch.nn.Module:
        return self._graph()

    @property
    def hook_batch(self) -> int | None:
        return self._fixed_batch
