"""Arrays decoded from a request are read-only views of its bytes: what reaches torch is a copy, so
torch neither warns on the user's terminal nor lets a model's in-place operation write into them."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tests.models import to_torchscript
from workers.methods._base import to_tensor
from workers.models import load_model
from workers.models.base import owned_float32


class ZeroesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.sum(dim=1, keepdim=True)
        x.mul_(0)  # in place, into whatever buffer the input lives in
        return out


def _read_only(values: np.ndarray) -> np.ndarray:
    array = np.frombuffer(values.astype(np.float32).tobytes(), dtype=np.float32).reshape(values.shape)
    assert not array.flags.writeable
    return array


def test_read_only_arrays_are_copied_and_writable_ones_shared() -> None:
    read_only = _read_only(np.arange(6.0).reshape(2, 3))
    assert not np.shares_memory(owned_float32(read_only), read_only)
    assert to_tensor(read_only, torch.device("cpu")).data_ptr() != read_only.ctypes.data
    writable = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert owned_float32(writable) is writable  # no copy where none is needed


def test_a_model_writing_into_its_input_leaves_the_request_untouched() -> None:
    x = _read_only(np.ones((3, 4)))
    model = load_model(to_torchscript(ZeroesItsInput().eval(), torch.ones(1, 4)), "torchscript", "cpu")
    np.testing.assert_array_equal(model.predict(x)[:, 0], [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(x, np.ones((3, 4)))
