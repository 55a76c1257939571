"""The audit's sub-input attributions on a GPU: each x_T built, attributed and summed per player on
the model's device, so that only the (k * m, n) sums come back to the host.

On an H200 the host path left the GPU idle most of the time: for resnet18 at 224x224, 1.1 s per 512
rows of Gradient x Input went to masking the sub-inputs, copying the attributions back and summing
them per player in numpy, against about 0.1 s of the GPU's own work (README, GPU). The rows are the
host path's element for element (workers.device_rows). Methods written in torch
(workers.methods.TorchMethod) keep them on the device; the others take a round trip through the
host and give the same attributions.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.device_rows import DeviceRows
from workers.methods import AttributionContext, Method
from workers.methods._embedding import non_finite
from workers.models.base import ModelAdapter
from workers.players import Players

__all__ = ["DeviceSubInputs", "on_device"]


def on_device(model: ModelAdapter) -> bool:
    """Whether the audit attributes ``model``'s sub-inputs on its device: a GPU, and no token input
    (gradient methods on token models run at the embedding output: workers.methods._embedding)."""
    return model.device.type != "cpu" and getattr(model, "embedding", None) is None


class DeviceSubInputs:
    """The players' labels and their one-hot sums on ``device``, made once per method's audit."""

    def __init__(self, players: Players, device: torch.device) -> None:
        self._rows = DeviceRows(players, device)
        self._device = device
        # Per-player sums as one float64 product (the host path sums in float64 too); a product,
        # unlike index_add_'s atomics on a GPU, adds in the same order on every run.
        self._one_hot = torch.nn.functional.one_hot(self._rows.labels, players.n).double()

    def per_player(
        self,
        method: Method,
        ctx: AttributionContext,
        bits: np.ndarray,
        inputs: np.ndarray,
        baselines: np.ndarray,
        classes: np.ndarray,
    ) -> np.ndarray:
        """(k * m, n) float64: ``method``'s attributions of the sub-inputs ``bits`` (m, n) of each of
        the k ``inputs``, each sample with its own reference, summed per player; rows as
        :func:`workers.sub_inputs.masked_samples` orders them."""
        k, m = len(inputs), len(bits)
        reference = self._rows.samples(baselines)
        batch = self._rows.build(
            torch.as_tensor(bits, device=self._device), self._rows.samples(inputs), reference
        )
        refs = reference.expand(k, m, -1).reshape(batch.shape)
        rows = torch.as_tensor(classes, dtype=torch.long, device=self._device).repeat_interleave(m)
        flat = method.attribute_tensors(ctx, batch, refs, rows).reshape(k * m, -1)
        bad = int((~torch.isfinite(flat)).any(dim=1).sum())
        if bad:
            raise non_finite(method, bad, k * m)
        sums: np.ndarray = (flat.double() @ self._one_hot).cpu().numpy()
        return sums
