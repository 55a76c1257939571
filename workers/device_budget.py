"""How much larger a forward call, a backward pass or an audit call may be on a GPU than on the CPU,
and calls of one size.

The memory budgets in the compute core (rows per forward call, input elements per backward pass,
elements per audit call, RevealCancel's chunk) are sized for a host whose memory a job shares with
every other process, and larger passes do not run faster on a CPU. A GPU's kernels need large
batches to fill the device: on an H200 at 224x224, resnet18's LRP-epsilon ran at 52% of a plain
forward+backward in passes of 27 rows and at 83% in one pass of 512, and RevealCancel ran 2 rows per
pass, 10,240 convolutions for 512 rows (README, GPU). The CPU's budgets are meant to hold
about a gigabyte or less, so on a GPU each budget is multiplied by the device's memory in units of
8 GiB per job that shares it (a GPU worker runs one job at a time: deploy/): 17 on an H200 (139
GiB), 9 on an 80 GB card, 1 on a 16 GB one. bench/suite.py's GPU section reports the peak each
method held. The total memory, not the free, sets it, so that the same card cuts the same calls on
every run.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["GIB_PER_UNIT", "budget_scale", "equal_parts"]

GIB_PER_UNIT = 8


def budget_scale(device: torch.device) -> int:
    """What the CPU's budgets are multiplied by on ``device``: 1 on the CPU, one per 8 GiB of a GPU
    and per job sharing it."""
    if device.type != "cuda":
        return 1
    return _cuda_scale(device.index)


@functools.cache
def _cuda_scale(index: int | None) -> int:
    import torch

    from workers import threads

    device = torch.device("cuda") if index is None else torch.device("cuda", index)
    total: int = torch.cuda.get_device_properties(device).total_memory
    jobs = threads.current().concurrency  # worker processes sharing the machine, and so its GPU
    return max(1, total // (GIB_PER_UNIT * 1024**3 * jobs))


def equal_parts(total: int, most: int) -> int:
    """The size of the fewest equal chunks of at most ``most`` rows that ``total`` rows take: calls
    and passes of one shape. On a GPU a smaller last chunk fills the device no better than a full
    one, and each new input shape costs onnxruntime's CUDA convolutions a new set-up."""
    return -(-total // -(-total // most)) if total > most else most
