"""TorchScript models: gradients on the scripted module; hookable graphs through an ONNX export."""

from __future__ import annotations

import io
import logging
import math
import warnings

import numpy as np
import torch

from workers.metrics import count_forward
from workers.models.base import DEFAULT_BATCH_SIZE, ModelAdapter, ModelInfo, owned_float32
from workers.models.native_output import captured_native_output
from workers.models.torchscript_check import check_archive, check_module
from xaudit.contract.errors import InvalidInput, InvalidModel, NotApplicable

__all__ = ["IDS_NO_GRADIENTS", "IDS_NO_HOOKS", "TorchScriptModel"]

# Why the gradient and the hook methods cannot run on a module fed token ids (the audit's reasons,
# which `xaudit inspect` predicts from the graph).
IDS_NO_GRADIENTS = (
    "the TorchScript model takes integer token ids; gradient methods need the embedding's output, "
    "which xaudit finds in an ONNX export of the model (torch.onnx.export)"
)
IDS_NO_HOOKS = "takes integer token ids (export the model to ONNX: xaudit finds its embedding)"

logger = logging.getLogger(__name__)


class TorchScriptModel(ModelAdapter):
    def __init__(self, data: bytes, sha256: str, device: torch.device, batch_size: int = DEFAULT_BATCH_SIZE):
        if not data.startswith(b"PK"):
            raise InvalidModel(
                "not a TorchScript archive (a TorchScript file is a zip written by torch.jit.save)"
            )
        check_archive(data)  # no code that runs while loading
        try:
            self._module = torch.jit.load(io.BytesIO(data), map_location=device).eval()  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise InvalidModel(
                f"TorchScript model cannot be loaded: {str(exc).splitlines()[0][:200]}"
            ) from None
        check_module(self._module)  # only allowed tensor operators, before the first call
        for p in self._module.parameters():
            p.requires_grad_(False)
        self.device = device
        self.batch_size = batch_size
        self.info = ModelInfo("torchscript", sha256, "input", None, "output")
        self._hookable: torch.nn.Module | None = None
        self._hookable_error: str | None = None
        self._example: np.ndarray | None = None
        self.token_ids = False  # fed as int64 (check_sample decides)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._forward(torch.from_numpy(owned_float32(x)))

    @property
    def takes_ids(self) -> bool:
        return self.token_ids

    @property
    def takes_device_rows(self) -> bool:
        return self.device.type == "cuda" and not self.token_ids

    def predict_rows(self, x: torch.Tensor) -> np.ndarray:
        """Rows on the device go in as they are: the module runs there."""
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> np.ndarray:
        """(k, C) float32 outputs for rows ``x`` (on the host or the device), :meth:`rows_per_call` at a time."""
        outs = []
        step = self.rows_per_call(math.prod(x.shape[1:]))
        with torch.inference_mode():
            for start in range(0, x.shape[0], step):
                chunk = self._typed(x[start : start + step]).to(self.device)
                try:
                    out = self._module(chunk)
                except Exception as exc:
                    raise InvalidInput(
                        f"the model rejected an input of shape {tuple(x.shape[1:])}"
                        f"{' (as int64 token ids)' if self.token_ids else ''}: {_cause(exc)}"
                    ) from None
                if not isinstance(out, torch.Tensor):
                    raise InvalidModel("the TorchScript model must return one tensor")
                outs.append(out.reshape(out.shape[0], -1).float().cpu().numpy())
        count_forward(x.shape[0], len(outs))
        return np.concatenate(outs)

    def check_sample(self, x: np.ndarray) -> None:
        """Run the example once. A module declares no input types: whole-number inputs it refuses as
        float32 (an embedding's ids) are fed as int64 from then on."""
        self._example = x[:1].astype(np.float32)
        try:
            self.predict(self._example)
        except InvalidInput as as_floats:
            if not np.array_equal(x, np.round(x)):
                raise
            self.token_ids = True
            try:
                self.predict(self._example)
            except InvalidInput:
                self.token_ids = False
                raise as_floats from None

    def input_feeds_embedding(self) -> bool:
        """Whether ``forward``'s input is the indices of an ``aten::embedding``: token ids, known
        from the graph before any input is seen (``xaudit inspect``; the audit decides from the
        input itself, check_sample)."""
        graph = self._module.inlined_graph
        first = next((v for v in list(graph.inputs())[1:] if v.type().kind() == "TensorType"), None)
        if first is None:
            return False
        return any(use.user.kind() == "aten::embedding" and use.offset == 1 for use in first.uses())

    def _typed(self, chunk: torch.Tensor) -> torch.Tensor:
        return chunk.to(torch.int64) if self.token_ids else chunk

    def torch_differentiable(self) -> torch.nn.Module:
        if self.token_ids:
            raise InvalidModel(IDS_NO_GRADIENTS)
        return self._module

    def torch_hookable(self, method: str, row_by_row: bool = False) -> torch.nn.Module:
        if self._hookable is None and self._hookable_error is None:
            self._hookable, self._hookable_error = self._convert()
        if self._hookable is None:
            raise NotApplicable(
                method, f"needs a hookable graph and the TorchScript model {self._hookable_error}"
            )
        return self._hookable

    def _convert(self) -> tuple[torch.nn.Module | None, str | None]:
        """TorchScript -> ONNX (legacy exporter, which understands scripted modules) -> torch graph."""
        from workers.models.onnx_to_torch import method_graph
        from xaudit.contract.onnx_checks import parse_onnx

        if self._example is None:
            return None, "has no example input to trace the export"
        if self.token_ids:
            return None, IDS_NO_HOOKS
        buffer = io.BytesIO()
        example = torch.from_numpy(self._example)
        printed: list[str] = []
        try:
            with warnings.catch_warnings(), captured_native_output() as printed:
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    self._module.cpu(),
                    (example,),
                    buffer,  # type: ignore[arg-type]
                    dynamo=False,
                    opset_version=17,
                    input_names=["input"],
                    output_names=["output"],
                    dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                )
            graph = method_graph(parse_onnx(buffer.getvalue()), self.device)
        except Exception as exc:
            logger.info("TorchScript -> ONNX conversion failed: %s", exc)
            logger.debug("the exporter printed: %s", "".join(printed)[:4000])
            return (
                None,
                f"could not be converted to ONNX ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
            )
        finally:
            self._module.to(self.device)
        return graph, None


def _cause(exc: Exception) -> str:
    """The line of a TorchScript interpreter error that names the cause (its first line only says
    that an operation failed in the interpreter)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if "Error:" in line]
    return (causes[-1] if causes else lines[0] if lines else type(exc).__name__)[:200]
