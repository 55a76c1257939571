"""Sub-inputs built on the model's device, for the game (workers.game) and the audit's attributions
(workers.audit.device_subinputs) on a GPU.

x_T takes x's element where T holds the element's player and the reference's elsewhere. A
selection (``torch.where``) copies, it does not compute, so the rows are the host's
(workers.sub_inputs) element for element, and only small things travel: the players' labels and
subsets once, a few samples per call. On an H200 the host's share of building them (numpy masking,
copies to the device) left the GPU idle most of the time (README, GPU).
"""

from __future__ import annotations

import numpy as np
import torch

from workers.methods._base import to_tensor
from workers.players import Players

__all__ = ["DeviceRows", "GameRows"]


class DeviceRows:
    """The players' labels on ``device``, sent once; :meth:`build` makes each call's sub-inputs."""

    def __init__(self, players: Players, device: torch.device) -> None:
        self.labels = torch.as_tensor(players.labels.reshape(-1), device=device)
        self.shape = players.labels.shape
        self.device = device

    def samples(self, arrays: np.ndarray) -> torch.Tensor:
        """(k, 1, elements) float32 on the device: samples or references, one row each."""
        return to_tensor(arrays, self.device).reshape(len(arrays), 1, -1)

    def build(self, bits: torch.Tensor, x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """(k * m, *shape): the sub-inputs of ``bits`` (m, n) bool on the device for each of the k
        samples ``x`` with their own ``reference`` (both from :meth:`samples`), sample by sample."""
        keep = bits[:, self.labels]  # (m, elements)
        rows = torch.where(keep, x, reference)  # (k, m, elements)
        return rows.reshape(len(x) * len(bits), *self.shape)


class GameRows:
    """A game's sub-inputs on the model's device: its subsets ``bits`` (m, n) sent once, each group
    of samples once, each call's rows built there (workers.game)."""

    def __init__(self, players: Players, bits: np.ndarray, device: torch.device) -> None:
        self._rows = DeviceRows(players, device)
        self._bits = torch.tensor(bits, device=device)  # a copy: the table of every subset is read-only
        self._held: tuple[slice, torch.Tensor, torch.Tensor] | None = None

    def rows(self, samples: slice, chunk: slice, inputs: np.ndarray, baselines: np.ndarray) -> torch.Tensor:
        """The sub-inputs of subsets ``chunk`` for ``inputs[samples]``, as :func:`workers.sub_inputs.masked_samples` orders them."""
        if self._held is None or self._held[0] != samples:
            self._held = samples, self._rows.samples(inputs[samples]), self._rows.samples(baselines[samples])
        _, x, reference = self._held
        return self._rows.build(self._bits[chunk], x, reference)
