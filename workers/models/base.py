"""The one interface over ONNX and TorchScript models."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from workers.device_budget import budget_scale

if TYPE_CHECKING:  # the catalogue and argument checks load no torch
    import torch

__all__ = ["DEFAULT_BATCH_SIZE", "ModelAdapter", "ModelInfo", "owned_float32", "rows_per_call"]

logger = logging.getLogger(__name__)

# Rows per forward call: bounds peak memory of masked-input batches (the game may need 2^16 rows).
DEFAULT_BATCH_SIZE = 256
# Small inputs get more rows per forward call (the per-call overhead dominates a tiny model), as
# many as fit this many input elements, at most MAX_ROWS_PER_CALL.
ROWS_ELEMENT_BUDGET = 65536
MAX_ROWS_PER_CALL = 4096
# Large inputs get fewer: a call holds at most this many input elements (as a backward pass does,
# workers.methods._passes), for a token model its embedding output's. At 256 rows onnxruntime held
# 1.7 GB of activations for resnet18 at 224x224, and a BERT of width 256 at 512 tokens 4.9 GB at
# 128 rows, where 16 ran 1.5x faster (one thread); resnet18 ran as fast at 16 rows as at 256.
FORWARD_ELEMENTS = 2**22


def rows_per_call(sample_elements: int, batch_size: int = DEFAULT_BATCH_SIZE, scale: int = 1) -> int:
    """Rows per forward call for samples of ``sample_elements`` elements: ``batch_size``, more for
    small inputs, fewer for large ones; the budgets ``scale`` times larger on a GPU
    (workers.device_budget)."""
    elements = max(1, sample_elements)
    by_budget = min(MAX_ROWS_PER_CALL * scale, ROWS_ELEMENT_BUDGET * scale // elements)
    return max(1, min(max(batch_size, by_budget), FORWARD_ELEMENTS * scale // elements))


def filled_to(rows: int, part: torch.Tensor) -> torch.Tensor:
    """``part`` with copies of its last row appended up to ``rows`` rows: the last chunk for a graph
    exported with a fixed batch of ``rows`` (the copies' results are dropped; rows are independent)."""
    import torch

    short = rows - len(part)
    return torch.cat([part, part[-1:].expand(short, *part.shape[1:])]) if short > 0 else part


def owned_float32(array: np.ndarray) -> np.ndarray:
    """``array`` as contiguous float32 that may be handed to torch: a copy where it is read-only
    (decoded from a request, a cached table). torch.from_numpy would share such a buffer, warn on
    the user's terminal, and let a model's in-place operation write into it."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    return array if array.flags.writeable else array.copy()


@dataclass(frozen=True)
class ModelInfo:
    format: str  # "onnx" | "torchscript"
    sha256: str
    input_name: str
    # Shape of one sample as the model declares it; None where a dimension is dynamic or unknown.
    sample_shape: tuple[int | None, ...] | None
    output_name: str


class ModelAdapter(ABC):
    """Forward passes in numpy (fast path for the game), torch graphs for gradient and rule methods."""

    info: ModelInfo
    device: torch.device
    batch_size: int

    @abstractmethod
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Model output for a batch (k, *sample_shape) float32, evaluated in chunks: (k, C) float32."""

    def predict_as_defined(self, x: np.ndarray) -> np.ndarray | None:
        """The outputs of the model as its format defines it, where the runtime that :meth:`predict`
        uses may compute it otherwise (onnxruntime's fused kernels for a quantized ONNX model); None
        where the two are the same."""
        return None

    @abstractmethod
    def torch_differentiable(self) -> torch.nn.Module:
        """A torch module (possibly scripted) whose output is differentiable w.r.t. its input."""

    @abstractmethod
    def torch_hookable(self, method: str, row_by_row: bool = False) -> torch.nn.Module:
        """A plain ``nn.Module`` graph with real submodules, for hook- and rule-based methods.

        Raises :class:`~xaudit.contract.errors.NotApplicable` naming ``method`` when no such graph exists.
        ``row_by_row``: the caller calls the graph with :attr:`hook_batch` rows at a time where that is
        set, so a graph exported with a fixed batch of 1 is returned instead of refused.
        """

    @property
    def hook_batch(self) -> int | None:
        """Rows per call that :meth:`torch_hookable`'s graph takes, where fixed (None: any number)."""
        return None

    @property
    def takes_ids(self) -> bool:
        """Whether the explained input holds integer ids (tokens): values with no neighbours, where
        a change smaller than 1 is another id or none (workers.nudge)."""
        return False

    @property
    def takes_device_rows(self) -> bool:
        """Whether :meth:`predict_rows` reads rows where they lie on a GPU, with no copy through the
        host (the game's sub-inputs: workers.game)."""
        return False

    def predict_rows(self, x: torch.Tensor) -> np.ndarray:
        """As :meth:`predict`, for float32 rows on :attr:`device`."""
        return self.predict(x.cpu().numpy())

    def rows_per_call(self, sample_elements: int) -> int:
        """Rows per forward call for samples of ``sample_elements`` elements (:func:`rows_per_call`)."""
        return rows_per_call(sample_elements, self.batch_size, budget_scale(self.device))

    @property
    def execution_providers(self) -> list[str]:
        """What really runs the forward passes (ORT providers, or the torch device)."""
        return [str(self.device)]

    # True when the model holds other inputs fixed per sample (workers.models.named): rows of one
    # call must then come from one sample, bound with :meth:`for_sample`.
    per_sample: bool = False

    def for_sample(self, index: int) -> ModelAdapter:
        """This model with the held-fixed inputs of sample ``index``; itself for one-input models."""
        return self

    def check_sample(self, x: np.ndarray) -> None:
        """Raise InvalidInput when a batch does not fit the model's declared input shape."""
        from xaudit.contract.errors import InvalidInput

        declared = self.info.sample_shape
        if declared is None:
            return
        got = tuple(x.shape[1:])
        if len(got) != len(declared) or any(
            d is not None and d != g for d, g in zip(declared, got, strict=False)
        ):
            want = "x".join("?" if d is None else str(d) for d in declared)
            have = "x".join(str(g) for g in got)
            raise InvalidInput(
                f"input shape {have} (per sample) does not match the model's input '{self.info.input_name}' {want}"
            )
