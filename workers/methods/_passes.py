"""Rows per forward+backward pass: what bounds the activations a pass stores, for the gradient
methods (workers.methods._autograd) and the rule methods (LRP, DeepLIFT, Zennit's) alike.

The budget counts input elements (activations are taken to be tens of times the input). A fixed
count of rows did not bound them: resnet18 at 224x224 holds about 17 MB of activations per row, so
the 512 rows per backward pass the gradient methods took held about 9 GB.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from workers.device_budget import budget_scale, equal_parts

if TYPE_CHECKING:
    import torch

__all__ = ["CHUNK", "ELEMENTS", "rows_per_pass"]

# Most rows per pass, and input elements per pass (times workers.device_budget's scale on a GPU).
CHUNK = 1024
ELEMENTS = 2**22


def rows_per_pass(inputs: torch.Tensor) -> int:
    """Rows of ``inputs`` per forward+backward pass; more on a GPU (workers.device_budget). Passes of
    equal size: 512 rows at most 473 per pass are two passes of 256, not 473 and a pass of 39 that
    costs a GPU nearly as much."""
    elements = ELEMENTS * budget_scale(inputs.device)
    most = max(1, min(CHUNK, elements // max(1, math.prod(inputs.shape[1:]))))
    return equal_parts(len(inputs), most)
